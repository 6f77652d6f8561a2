package gyre_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/gyretest"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/mem"
)

// twoRacks delays every message between ranks of different parity, as if
// ranks 0 and 2 sat in one rack and 1 and 3 in another behind a slow
// uplink: address order then crosses between the racks at every link.
func twoRacks(net *mem.Network, ids []transport.PeerID) {
	for a := range ids {
		for b := range ids {
			if a%2 != b%2 {
				net.SetLink(ids[a], ids[b], mem.Link{Delay: 40 * time.Millisecond})
			}
		}
	}
}

// TestRingOrderFollowsRacks: 4 workers in two racks. With the default
// ring order the workers probe their links at Join and every worker
// chooses the same ring, which crosses between the racks twice; with
// RingOrder fixed it stays in address order, crossing four times. Either
// way training runs and the workers end with identical state.
func TestRingOrderFollowsRacks(t *testing.T) {
	for _, mode := range []string{gyre.RingOrderAuto, gyre.RingOrderFixed} {
		t.Run(mode, func(t *testing.T) {
			models := make([]*toy, 4)
			c := gyretest.MakeCluster(t, gyretest.Options{N: 4, Links: twoRacks,
				Config: func(r int, c *gyre.Config) { c.GlobalBatch, c.RingOrder = 40, mode },
				State: func(r int) *gyre.State {
					models[r] = newToy()
					return models[r].state()
				}})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			orders := make([][]int, 4)
			errs := c.Run(func(r int, w *gyre.Worker) error {
				orders[r] = w.View().RingOrder
				for w.Iter() < 5 {
					g := models[r].grad(w.Batch().Indices)
					w.AllReduceAsync64(ctx, "g", g)
					if err := w.Wait(ctx); err != nil {
						return err
					}
					models[r].step(g)
					if _, err := w.Boundary(ctx); err != nil {
						return err
					}
					if err := w.Commit(); err != nil {
						return err
					}
				}
				return w.Leave(ctx)
			})
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			for r := range orders {
				if !slices.Equal(orders[r], orders[0]) {
					t.Fatalf("workers chose different ring orders: %v", orders)
				}
			}
			crossings := 0
			for i, r := range orders[0] {
				if r%2 != orders[0][(i+1)%4]%2 {
					crossings++
				}
			}
			want := 2
			if mode == gyre.RingOrderFixed {
				want = 4
				if !slices.Equal(orders[0], []int{0, 1, 2, 3}) {
					t.Fatalf("fixed ring order is %v, want address order", orders[0])
				}
			}
			if crossings != want {
				t.Fatalf("ring order %v crosses between the racks %d times, want %d", orders[0], crossings, want)
			}
			c.EnsureSameState(t)
		})
	}
}

// TestRingOrderFollowsLinkChanges: 4 workers start on links of one kind,
// in address order; then two racks form behind a slow uplink. At the next
// re-probe (every 4 iterations here) every worker moves to the same ring,
// crossing between the racks twice, between two iterations, and the
// training goes on to identical state.
func TestRingOrderFollowsLinkChanges(t *testing.T) {
	defer gyre.SetReprobeEvery(4)()
	models := make([]*toy, 4)
	c := gyretest.MakeCluster(t, gyretest.Options{N: 4,
		Config: func(r int, c *gyre.Config) { c.GlobalBatch = 40 },
		State: func(r int) *gyre.State {
			models[r] = newToy()
			return models[r].state()
		}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var racks sync.Once
	orders := make([][][]int, 4) // per rank, per iteration
	errs := c.Run(func(r int, w *gyre.Worker) error {
		for w.Iter() < 7 {
			orders[r] = append(orders[r], w.View().RingOrder)
			g := models[r].grad(w.Batch().Indices)
			w.AllReduceAsync64(ctx, "g", g)
			if err := w.Wait(ctx); err != nil {
				return err
			}
			models[r].step(g)
			if w.Iter() == 1 {
				racks.Do(func() { twoRacks(c.Net, c.IDs) })
			}
			if _, err := w.Boundary(ctx); err != nil {
				return err
			}
			if err := w.Commit(); err != nil {
				return err
			}
		}
		return w.Leave(ctx)
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for r := range orders {
		for it, o := range orders[r] {
			if !slices.Equal(o, orders[0][it]) {
				t.Fatalf("iteration %d: rank %d runs ring %v, rank 0 %v", it, r, o, orders[0][it])
			}
		}
	}
	for it, o := range orders[0] {
		crossings := 0
		for i, r := range o {
			if r%2 != o[(i+1)%4]%2 {
				crossings++
			}
		}
		if want := map[bool]int{true: 4, false: 2}[it < 4]; crossings != want {
			t.Fatalf("iteration %d runs ring %v, crossing the racks %d times, want %d (orders %v)", it, o, crossings, want, orders[0])
		}
	}
	c.EnsureSameState(t)
}
