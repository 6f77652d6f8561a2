package gyre_test

import (
	"context"
	"testing"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/gyretest"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/ring"
)

// BenchmarkBoundary measures a Boundary with no view change, which every
// iteration pays, beside a 4 KiB allreduce on the same 4 workers (TLS over
// TCP on loopback, in this process): the boundary's budget is two such
// allreduces. The state is empty, so no hashing is counted. Each worker
// runs b.N operations in a loop of its own, as a training loop does.
func BenchmarkBoundary(b *testing.B) {
	c := gyretest.Start(b, gyretest.Options{N: 4, Transport: gyretest.TCP, Config: func(_ int, cfg *gyre.Config) {
		cfg.Balance = gyre.BalanceStatic
	}})
	for r, err := range c.Errs {
		if err != nil {
			b.Fatalf("rank %d: %v", r, err)
		}
	}
	ctx := context.Background()
	loop := func(b *testing.B, op func(r int, w *gyre.Worker) error) {
		b.Helper()
		b.ResetTimer()
		for r, err := range c.Run(func(r int, w *gyre.Worker) error {
			for range b.N {
				if err := op(r, w); err != nil {
					return err
				}
			}
			return nil
		}) {
			if err != nil {
				b.Fatalf("rank %d: %v", r, err)
			}
		}
	}
	b.Run("boundary", func(b *testing.B) {
		loop(b, func(_ int, w *gyre.Worker) error {
			ch, err := w.Boundary(ctx)
			if err == nil && ch.ViewChanged {
				b.Errorf("the view changed at iteration %d", w.Iter())
			}
			return err
		})
	})
	bufs := make([][]float32, len(c.Workers))
	for r := range bufs {
		bufs[r] = make([]float32, 1024)
	}
	b.Run("allreduce-4KiB", func(b *testing.B) {
		b.SetBytes(4 << 10)
		loop(b, func(r int, w *gyre.Worker) error {
			comm, err := w.Comm()
			if err != nil {
				return err
			}
			return ring.AllReduce(ctx, comm, wire.OpSum, bufs[r])
		})
	})
}
