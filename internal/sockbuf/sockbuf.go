package sockbuf

import (
	"errors"
	"fmt"
	"net"
)

// Size is the UDP send and receive buffer size the quic transport asks
// for. quic-go wants at least 7 MiB and logs a warning through the
// standard logger if it cannot get it.
const Size = 16 << 20

// Grow asks for size-byte send and receive buffers on c, beyond the
// kernel's rmem_max and wmem_max where the process is allowed to (on
// Linux, with CAP_NET_ADMIN). It returns the sizes the kernel granted, 0
// where unknown (Linux reports twice the size asked for: it counts its
// overhead), and the refusals met. A refusal only costs throughput, so
// callers log it at most.
func Grow(c *net.UDPConn, size int) (rcv, snd int, err error) {
	var errs []error
	if err := c.SetReadBuffer(size); err != nil {
		errs = append(errs, fmt.Errorf("receive buffer: %w", err))
	}
	if err := c.SetWriteBuffer(size); err != nil {
		errs = append(errs, fmt.Errorf("send buffer: %w", err))
	}
	rcv, snd, err = force(c, size)
	return rcv, snd, errors.Join(append(errs, err)...)
}
