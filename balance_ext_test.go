package gyre_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/gyretest"
)

// TestBalanceMovesSharesToTheFastWorkers: of 3 workers, one takes 4× as
// long per sample (it sleeps between Batch and Wait, which is compute
// time to the Worker). Under the default balancing the shares move from
// it to the others, every worker agrees on them at every boundary, and the
// training still ends where one process training on the same global
// batches ends (within 1e-12), since gradients are weighed by share. With
// Balance static the shares stay equal.
func TestBalanceMovesSharesToTheFastWorkers(t *testing.T) {
	for _, mode := range []string{gyre.BalanceLBBSP, gyre.BalanceStatic} {
		t.Run(mode, func(t *testing.T) {
			const global, iters, slow = 60, 40, 2
			models := make([]*toy, 3)
			c := gyretest.MakeCluster(t, gyretest.Options{N: 3,
				Config: func(r int, c *gyre.Config) { c.GlobalBatch, c.Balance = global, mode },
				State: func(r int) *gyre.State {
					models[r] = newToy()
					return models[r].state()
				}})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			final := make([][]int, 3)
			changes := make([]int, 3)
			errs := c.Run(func(r int, w *gyre.Worker) error {
				perSample := 100 * time.Microsecond
				if r == slow {
					perSample *= 4
				}
				for w.Iter() < iters {
					b := w.Batch()
					time.Sleep(time.Duration(len(b.Indices)) * perSample)
					g := models[r].grad(b.Indices)
					w.AllReduceAsync64(ctx, "g0", g[:toyDim/2])
					w.AllReduceAsync64(ctx, "g1", g[toyDim/2:])
					if err := w.Wait(ctx); err != nil {
						return err
					}
					models[r].step(g)
					ch, err := w.Boundary(ctx)
					if err != nil {
						return err
					}
					if ch.SharesChanged {
						changes[r]++
					}
					if err := w.Commit(); err != nil {
						return err
					}
				}
				final[r] = w.Shares()
				return w.Leave(ctx)
			})
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			for r := range final {
				if !slices.Equal(final[r], final[0]) || changes[r] != changes[0] {
					t.Fatalf("workers disagree: shares %v, changes %v", final, changes)
				}
			}
			s := final[0]
			t.Logf("final shares %v after %d changes", s, changes[0])
			switch mode {
			case gyre.BalanceLBBSP:
				// Rates 10, 10 and 2.5 per ms: about 27, 27 and 6.
				if changes[0] == 0 || s[slow] > 12 || s[0] < 22 || s[1] < 22 {
					t.Fatalf("shares %v after %d changes, want the slow worker near 6 of %d", s, changes[0], global)
				}
			case gyre.BalanceStatic:
				if changes[0] != 0 || !slices.Equal(s, []int{20, 20, 20}) {
					t.Fatalf("static: shares %v after %d changes", s, changes[0])
				}
			}
			want := referenceToy(t, global, iters)
			for r := range models {
				if !closeRel(models[r].theta, want.theta, 1e-12) {
					t.Fatalf("worker %d: θ %v, one process %v", r, models[r].theta, want.theta)
				}
			}
			gyretest.EnsureSameState(t, c.States...)
		})
	}
}
