package main

import (
	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/quic"
	"github.com/gyre-ml/gyre/transport/tcp"
)

// newTransport builds the listening data-plane transport a Config asks for.
// The benchmarks get their transports only from here. It stands in for
// gyre.NewTransport until the package has it.
func newTransport(cfg gyre.Config) (transport.Transport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	key, err := cfg.Secret()
	if err != nil {
		return nil, err
	}
	lim := wire.DefaultLimits()
	lim.MaxFrame = uint32(cfg.MaxFrame)
	if cfg.Transport == gyre.TransportTCP && cfg.Insecure {
		return tcp.New(tcp.Config{ID: transport.PeerID(cfg.Name), Insecure: true, Listen: cfg.DataAddr, Limits: lim, Stripes: cfg.Stripes, Logger: cfg.Logger})
	}
	ca, err := key.CA()
	if err != nil {
		return nil, err
	}
	id, err := ca.Issue(cfg.Name)
	if err != nil {
		return nil, err
	}
	if cfg.Transport == gyre.TransportTCP {
		return tcp.New(tcp.Config{ID: transport.PeerID(cfg.Name), Identity: id, Listen: cfg.DataAddr, Limits: lim, Stripes: cfg.Stripes, Logger: cfg.Logger})
	}
	return quic.New(quic.Config{ID: transport.PeerID(cfg.Name), Identity: id, Listen: cfg.DataAddr, Limits: lim, Stripes: cfg.Stripes, Logger: cfg.Logger})
}
