package quic

import (
	"net"

	"github.com/rs/zerolog"
)

// socketBuffer is the UDP send and receive buffer size asked for. At a few
// hundred MB/s a burst of packets overruns the usual 208 KiB default before
// quic-go's reader runs, and every loss costs a retransmission and a
// congestion-window cut. quic-go wants at least 7 MiB and logs a warning
// through the standard logger if it cannot get it.
const socketBuffer = 16 << 20

// setSocketBuffers enlarges the socket's buffers, beyond the kernel's
// rmem_max and wmem_max where the process is allowed to (forceBuffers). A
// refusal only costs throughput, so it is logged at debug level.
func setSocketBuffers(c *net.UDPConn, log zerolog.Logger) {
	if err := c.SetReadBuffer(socketBuffer); err != nil {
		log.Debug().Err(err).Msg("cannot set UDP receive buffer")
	}
	if err := c.SetWriteBuffer(socketBuffer); err != nil {
		log.Debug().Err(err).Msg("cannot set UDP send buffer")
	}
	rcv, snd, err := forceBuffers(c, socketBuffer)
	ev := log.Debug().Int("rcvbuf", rcv).Int("sndbuf", snd)
	if err != nil {
		ev = ev.Err(err)
	}
	ev.Msg("UDP socket buffers")
}
