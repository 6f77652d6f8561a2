//go:build !linux

package shm

import (
	"context"
	"errors"

	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/internal/streams"
)

// Supported reports whether this build has the shared-memory path.
const Supported = false

// Local is the shared-memory path, which needs Linux (memfd, abstract
// sockets).
type Local struct{}

// Listen fails: the path needs Linux.
func Listen(Config) (*Local, error) {
	return nil, errors.New("shared memory: needs Linux")
}

// Dial always fails with ErrNotLocal.
func (*Local) Dial(context.Context, transport.PeerID, string) (streams.Link, error) {
	return nil, ErrNotLocal
}

// Close does nothing.
func (*Local) Close() error { return nil }

// Streams returns zeros.
func (*Local) Streams() (opened, accepted uint64) { return 0, 0 }
