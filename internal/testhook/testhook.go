// Package testhook carries the seams that only tests set into a worker:
// gyre's own tests through its export_test hooks, and gyretest through
// the context it passes to gyre.Join. Nothing here is public API, and no
// real job sets any of it.
package testhook

import (
	"context"
	"time"
)

// Hooks are a worker's test seams; the zero value sets none.
type Hooks struct {
	// FailAction, if set, is how the worker dies at its failpoint instead
	// of its process.
	FailAction func()
	// TimelineSkew shifts the timeline's clock.
	TimelineSkew time.Duration
	// ReprobeEvery and HandshakeNote shorten the periods of link probes
	// and stuck-handshake notes (0: the defaults).
	ReprobeEvery  int64
	HandshakeNote time.Duration
	// Machine, if set, replaces the worker's machine (its kernel's boot
	// id and its network namespace) in its link probes, so that workers
	// of one process can stand for several machines.
	Machine string
	// GossipBlock, if set, cuts the worker's gossip to the gossip
	// addresses it reports true for, as a cut network would. It is called
	// on gossip's goroutines.
	GossipBlock func(addr string) bool
}

type key struct{}

// With returns ctx carrying set, which adjusts the hooks of every worker
// joined with it.
func With(ctx context.Context, set func(*Hooks)) context.Context {
	return context.WithValue(ctx, key{}, set)
}

// Apply adjusts h as ctx says (With), if it says anything.
func Apply(ctx context.Context, h *Hooks) {
	if set, ok := ctx.Value(key{}).(func(*Hooks)); ok {
		set(h)
	}
}
