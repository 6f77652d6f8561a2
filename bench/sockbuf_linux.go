package bench

import (
	"net"
	"syscall"
)

// forceBuffers asks for size-byte buffers with SO_RCVBUFFORCE and
// SO_SNDBUFFORCE, which need CAP_NET_ADMIN and are refused otherwise.
func forceBuffers(c *net.UDPConn, size int) {
	raw, err := c.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Control(func(fd uintptr) {
		_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUFFORCE, size)
		_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUFFORCE, size)
	})
}
