package tcp

import (
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/secret"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
)

// ALPN is the application protocol negotiated on every TLS connection.
const ALPN = "gyre/1"

// DefaultHandshakeTimeout is the default Config.HandshakeTimeout.
const DefaultHandshakeTimeout = 10 * time.Second

// Config configures a Transport.
type Config struct {
	// ID is this process's peer ID. Required.
	ID transport.PeerID
	// Identity is this process's leaf certificate; Identity.Name must
	// equal ID. Required unless Insecure.
	Identity *secret.Identity
	// Insecure selects plain TCP with no authentication and no encryption:
	// any process that can reach the port can claim any ID. New logs a
	// warning. Identity is ignored.
	Insecure bool
	// Listen is the TCP address to bind, e.g. "127.0.0.1:0". Required.
	Listen string
	// Limits bound what a peer may send. Zero means wire.DefaultLimits().
	Limits wire.Limits
	// Stripes is the number of connections per (peer, channel) that large
	// messages are split over, so one link can use several cores. Default 1.
	// It is every channel's initial count, which SetStripes changes.
	Stripes int
	// SharedMemory reaches peers on this machine, and in this network
	// namespace, through shared memory rather than TCP, after the same
	// authentication (package shm). Peers elsewhere, and peers that turned
	// it off, are reached over TCP.
	SharedMemory bool
	// Logger receives refusals, dropped peers and connection events. The
	// zero Logger discards them.
	Logger zerolog.Logger
	// HandshakeTimeout bounds a dial (TCP connect, TLS handshake and the
	// server's acknowledgement) and the time an incoming connection may
	// take to complete its handshake. Default 10s.
	HandshakeTimeout time.Duration

	// logEveryRefusal turns off the refusal log's rate limit, for tests
	// that read every refusal.
	logEveryRefusal bool
	// firstByteTimeout replaces the package's firstByteTimeout when not
	// zero, for tests that hold connections silent for longer.
	firstByteTimeout time.Duration
}

func (c Config) withDefaults() Config {
	if c.Limits == (wire.Limits{}) {
		c.Limits = wire.DefaultLimits()
	}
	if c.Stripes == 0 {
		c.Stripes = 1
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if c.firstByteTimeout == 0 {
		c.firstByteTimeout = firstByteTimeout
	}
	return c
}

// Validate reports whether c, with defaults filled in, is usable.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.ID == "" || len(c.ID) > wire.MaxPeerID {
		errs = append(errs, fmt.Errorf("ID must be 1 to %d bytes", wire.MaxPeerID))
	}
	if !c.Insecure {
		if c.Identity == nil {
			errs = append(errs, errors.New("Identity is required unless Insecure"))
		} else if c.Identity.Name != string(c.ID) {
			errs = append(errs, fmt.Errorf("Identity.Name %q differs from ID %q", c.Identity.Name, c.ID))
		}
	}
	if c.Listen == "" {
		errs = append(errs, errors.New("Listen is required"))
	}
	if err := c.Limits.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Stripes < 1 || c.Stripes > 255 {
		errs = append(errs, fmt.Errorf("Stripes %d outside [1, 255]", c.Stripes))
	}
	if c.HandshakeTimeout < 0 {
		errs = append(errs, errors.New("HandshakeTimeout must not be negative"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("tcp: invalid config: %w", err)
	}
	return nil
}
