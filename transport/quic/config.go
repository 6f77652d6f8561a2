package quic

import (
	"errors"
	"fmt"
	"time"

	quicgo "github.com/quic-go/quic-go"
	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/secret"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
)

// ALPN is the application protocol negotiated on every connection. A QUIC
// client that does not offer it is refused during the handshake.
const ALPN = "gyre/1"

// Defaults for the zero values of Config.
const (
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultIdleTimeout      = 10 * time.Second
	DefaultKeepAlive        = 2 * time.Second
	DefaultStreamWindow     = 16 << 20
	DefaultConnWindow       = 32 << 20
)

// maxUniStreams bounds the unidirectional streams a peer may have open on
// one connection. The core opens one per channel on each stripe, so a
// legitimate peer needs transport.NumChannels; the slack covers streams
// being replaced, and the bound stops a peer from opening thousands.
const maxUniStreams = 16

// Config configures a Transport.
type Config struct {
	// ID is this process's peer ID. Required.
	ID transport.PeerID
	// Identity is this process's leaf certificate; Identity.Name must equal
	// ID. Required.
	Identity *secret.Identity
	// Listen is the UDP address to bind, e.g. "127.0.0.1:0". The same socket
	// is used to dial, so peers see one address per process. Required.
	Listen string
	// Limits bound what a peer may send. Zero means wire.DefaultLimits().
	Limits wire.Limits
	// SharedMemory reaches peers on this machine, and in this network
	// namespace, through shared memory rather than QUIC, after the same
	// authentication (package shm). Peers elsewhere, and peers that turned
	// it off, are reached over QUIC.
	SharedMemory bool
	// Stripes is the number of QUIC connections per peer. Large messages
	// are split over them so that one link can use several cores. Default 1.
	// It is also every channel's initial count, which SetStripes changes.
	Stripes int
	// Logger receives connection events and refusals. The zero Logger
	// discards them.
	Logger zerolog.Logger
	// HandshakeTimeout bounds a dial, including the TLS handshake, and the
	// time an incoming handshake may take. Default 10s.
	HandshakeTimeout time.Duration
	// IdleTimeout is how long a connection may go without receiving any
	// packet before it is declared dead and every stream on it fails. It is
	// what detects a peer that vanished without closing. Default 10s.
	IdleTimeout time.Duration
	// KeepAlive is how often an otherwise idle connection sends a ping, so
	// that a live but quiet peer is not timed out. quic-go uses at most
	// IdleTimeout/2. Default 2s.
	KeepAlive time.Duration
	// StreamWindow is the largest flow-control window of one stream, in
	// bytes; the initial window is a quarter of it and grows by
	// auto-tuning. It must cover the link's bandwidth-delay product (a
	// 25 Gb/s link with a 2 ms RTT needs 6 MiB). On loopback, windows from
	// quic-go's default 6 MiB up to 128 MiB measured the same. Default 16 MiB.
	StreamWindow uint64
	// ConnWindow is the largest flow-control window of one connection, in
	// bytes. It bounds what a peer can make this process buffer per
	// connection while no Recv is reading. Default 32 MiB.
	ConnWindow uint64
	// ResetKey is the stateless-reset key (RFC 9000 section 10.3). When a
	// packet arrives for a connection this process does not know, it
	// answers with a reset that the peer can check against a token derived
	// from this key, and the peer closes that connection at once instead
	// of waiting out IdleTimeout. Default nil: a random key per process,
	// which serves connections the process forgot while running, but not
	// those of an earlier run: after a restart the peers' stale
	// connections to this address die only by idle timeout. A key derived
	// from the cluster secret and the endpoint's name, the same on every
	// run, covers restarts too; gyre.NewTransport passes
	// Secret.ResetKey(name). Anyone who knows the key
	// can reset this endpoint's connections, so it must be secret, and it
	// must differ between endpoints.
	ResetKey *[32]byte

	// logEveryRefusal turns off the refusal log's rate limit, for tests
	// that read every refusal.
	logEveryRefusal bool
}

// withDefaults returns a copy of c with zero fields set to their defaults.
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
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.KeepAlive == 0 {
		c.KeepAlive = DefaultKeepAlive
	}
	if c.StreamWindow == 0 {
		c.StreamWindow = DefaultStreamWindow
	}
	if c.ConnWindow == 0 {
		c.ConnWindow = DefaultConnWindow
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
	if c.Identity == nil {
		errs = append(errs, errors.New("Identity is required"))
	} else if c.Identity.Name != string(c.ID) {
		errs = append(errs, fmt.Errorf("Identity.Name %q differs from ID %q", c.Identity.Name, c.ID))
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
	if c.HandshakeTimeout < 0 || c.IdleTimeout < 0 || c.KeepAlive < 0 {
		errs = append(errs, errors.New("timeouts must not be negative"))
	}
	if c.ConnWindow < c.StreamWindow {
		errs = append(errs, fmt.Errorf("ConnWindow %d below StreamWindow %d", c.ConnWindow, c.StreamWindow))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("quic: invalid config: %w", err)
	}
	return nil
}

// quicConfig returns the quic-go settings shared by dialed and accepted
// connections. Connections carry only unidirectional streams opened by the
// dialer, so a dialed connection accepts no streams at all and an accepted
// one accepts a few unidirectional ones.
func (c Config) quicConfig(dialer bool) *quicgo.Config {
	qc := &quicgo.Config{
		// quic-go aborts a handshake after twice this without progress.
		HandshakeIdleTimeout: c.HandshakeTimeout / 2,
		MaxIdleTimeout:       c.IdleTimeout,
		KeepAlivePeriod:      c.KeepAlive,
		// A large initial window lets a 1 MiB message go out in one flight
		// instead of waiting a round trip per window update while the
		// auto-tuner ramps up.
		InitialStreamReceiveWindow:     c.StreamWindow / 4,
		MaxStreamReceiveWindow:         c.StreamWindow,
		InitialConnectionReceiveWindow: c.ConnWindow / 4,
		MaxConnectionReceiveWindow:     c.ConnWindow,
		MaxIncomingStreams:             -1,
		MaxIncomingUniStreams:          maxUniStreams,
	}
	if dialer {
		qc.MaxIncomingUniStreams = -1
	}
	return qc
}
