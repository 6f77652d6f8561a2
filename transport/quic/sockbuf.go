package quic

import (
	"net"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/sockbuf"
)

// setSocketBuffers enlarges the socket's buffers to sockbuf.Size. A
// refusal only costs throughput, so it is logged at debug level.
func setSocketBuffers(c *net.UDPConn, log zerolog.Logger) {
	rcv, snd, err := sockbuf.Grow(c, sockbuf.Size)
	ev := log.Debug().Int("rcvbuf", rcv).Int("sndbuf", snd)
	if err != nil {
		ev = ev.Err(err)
	}
	ev.Msg("UDP socket buffers")
}
