package bench

import "net"

// socketBuffer matches the UDP buffer size the quic transport asks for.
const socketBuffer = 16 << 20

// setSocketBuffers enlarges c's buffers as the quic transport does: past
// the sysctl limits where the process may (forceBuffers). A refusal only
// costs throughput, on both sides of the comparison alike.
func setSocketBuffers(c *net.UDPConn) {
	_ = c.SetReadBuffer(socketBuffer)
	_ = c.SetWriteBuffer(socketBuffer)
	forceBuffers(c, socketBuffer)
}
