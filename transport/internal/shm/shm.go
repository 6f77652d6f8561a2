package shm

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/floodlog"
	"github.com/gyre-ml/gyre/internal/secret"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/internal/streams"
)

// Config configures a Local.
type Config struct {
	// ID is this process's peer ID. Required.
	ID transport.PeerID
	// Identity is this process's certificate; nil only when Insecure.
	Identity *secret.Identity
	// Insecure skips authentication, as the network transport beside it
	// does. The socket is still reachable only from this machine and
	// network namespace.
	Insecure bool
	// Kind and Port name the network transport this path sits beside
	// ("quic" or "tcp", and its bound port): with the peer ID, they name
	// the socket, so a dialer finds it from the address it was given.
	Kind string
	Port int
	// Ring returns the ring size, in bytes, of an outbound stream on ch.
	// Nil means RingSize.
	Ring func(ch transport.Channel) int
	// Accept hands an authenticated inbound stream to the core.
	Accept func(peer transport.PeerID, in streams.InStream)
	// Refused records a client refused for its credentials.
	Refused func(remote, claimed string, err error)
	// Flood, if set, logs refusals under its rate limit (the network
	// transport's), else Logger logs each one.
	Flood *floodlog.Log
	// HandshakeTimeout bounds a dial and an incoming handshake.
	HandshakeTimeout time.Duration
	Logger           zerolog.Logger
}

// RingSize returns the default ring size for ch: the data channel's
// carries collective payloads, the others small messages.
func RingSize(ch transport.Channel) int {
	if ch == transport.ChanData {
		return DataRing
	}
	return SmallRing
}

// Ring sizes by default; a pair of workers maps NumChannels rings in each
// direction per stripe.
const (
	DataRing  = 2 << 20
	SmallRing = 64 << 10
)

// ErrNotLocal is returned by Dial when the peer has no shared-memory
// socket on this machine and in this network namespace.
var ErrNotLocal = errors.New("shared memory: the peer is not on this machine")

// ErrReaderClosed is a write's error once the reader closed its end on
// purpose (its transport closed, or it dropped the peer): the peer's
// orderly end, as a QUIC close is, where a reader whose process died
// leaves a plain broken pipe.
var ErrReaderClosed = errors.New("shared memory: the reader closed the stream")

// SocketName is the abstract socket a peer with id beside a network
// transport of kind on port listens on. The ID is hashed to keep the
// name within a socket address's 107 bytes.
func SocketName(kind string, port int, id transport.PeerID) string {
	sum := sha256.Sum256([]byte(id))
	return fmt.Sprintf("@gyre/%s/%d/%x", kind, port, sum[:8])
}

// Or returns a DialFunc that makes a Link over shared memory when local
// is set and the peer is on this machine, and over network otherwise.
func Or(local func() *Local, network streams.DialFunc) streams.DialFunc {
	return func(ctx context.Context, peer transport.PeerID, addr string) (streams.Link, error) {
		if l := local(); l != nil {
			lk, err := l.Dial(ctx, peer, addr)
			if !errors.Is(err, ErrNotLocal) {
				return lk, err
			}
		}
		return network(ctx, peer, addr)
	}
}

// Beside starts the path beside a network transport. If it cannot, it
// logs why and returns nil: peers on this machine are then reached over
// the network, as any other.
func Beside(cfg Config) *Local {
	l, err := Listen(cfg)
	if err != nil {
		cfg.Logger.Warn().Err(err).Msg("shared memory off: peers on this machine are reached over the network")
		return nil
	}
	return l
}
