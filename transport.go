package gyre

import (
	"fmt"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/quic"
	"github.com/gyre-ml/gyre/transport/tcp"
)

// NewTransport validates cfg and builds the data-plane transport it asks
// for, listening on cfg.DataAddr. It loads the cluster secret, derives the
// cluster CA and mints this worker's leaf certificate for cfg.Name. The
// result also implements transport.Listener (its bound address) and
// transport.Dropper.
func NewTransport(cfg Config) (transport.Transport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !cfg.hasSecret() {
		return nil, fmt.Errorf("%w: %v", ErrConfig, errNoSecret)
	}
	cfg = cfg.WithDefaults()
	lim := wire.DefaultLimits()
	lim.MaxFrame = uint32(cfg.MaxFrame)
	id := transport.PeerID(cfg.Name)
	if cfg.Insecure {
		// Validate allows Insecure only with tcp.
		return tcp.New(tcp.Config{ID: id, Insecure: true, Listen: cfg.DataAddr, Limits: lim,
			Stripes: cfg.Stripes, Logger: cfg.logger()})
	}
	key, err := cfg.Secret()
	if err != nil {
		return nil, fmt.Errorf("gyre: cluster secret: %w", err)
	}
	ca, err := key.CA()
	if err != nil {
		return nil, err
	}
	ident, err := ca.Issue(cfg.Name)
	if err != nil {
		return nil, err
	}
	if cfg.Transport == TransportTCP {
		return tcp.New(tcp.Config{ID: id, Identity: ident, Listen: cfg.DataAddr, Limits: lim,
			Stripes: cfg.Stripes, Logger: cfg.logger()})
	}
	// A reset key that is the same on every run lets a restarted worker
	// reset its peers' stale connections at once.
	resetKey := key.ResetKey(cfg.Name)
	return quic.New(quic.Config{ID: id, Identity: ident, Listen: cfg.DataAddr, Limits: lim,
		Stripes: cfg.Stripes, Logger: cfg.logger(), ResetKey: &resetKey})
}
