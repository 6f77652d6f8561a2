package gyre_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
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
	racks(net, ids, func(r int) int { return r % 2 })
}

// blockRacks puts ranks 0 and 1 in one rack and 2 and 3 in another:
// address order crosses between them twice, the fewest a ring can.
func blockRacks(net *mem.Network, ids []transport.PeerID) {
	racks(net, ids, func(r int) int { return r / 2 })
}

// racks caps every link between ranks in different racks at 10 MB/s, a
// slow uplink, and clears the links within a rack. A probe's 4 MiB then
// take 0.4 s across racks and milliseconds within one, a margin that the
// race detector and CI's load do not erase; small messages, the
// training's and the pings', cross at once. (A 100 ms delay per message
// did the same, but the probes' 32 round trips per pair took 6 s.)
func racks(net *mem.Network, ids []transport.PeerID, rackOf func(rank int) int) {
	for a := range ids {
		for b := range ids {
			var l mem.Link
			if rackOf(a) != rackOf(b) {
				l.Rate = 10e6
			}
			net.SetLink(ids[a], ids[b], l)
		}
	}
}

// rackCrossings counts the links of the ring through order that cross
// between twoRacks' racks.
func rackCrossings(order []int) int {
	n := 0
	for i, r := range order {
		if r%2 != order[(i+1)%len(order)]%2 {
			n++
		}
	}
	return n
}

// trainStep runs one iteration of m on w: its batch's gradient, one
// allreduce, the step, the boundary and the commit.
func trainStep(ctx context.Context, w *gyre.Worker, m *toy) error {
	g := m.grad(w.Batch().Indices)
	w.AllReduceAsync64(ctx, "g", g)
	if err := w.Wait(ctx); err != nil {
		return err
	}
	m.step(g)
	if _, err := w.Boundary(ctx); err != nil {
		return err
	}
	return w.Commit()
}

// TestRingOrderFollowsRacks: 4 workers in two racks. With the default
// ring order the workers probe their links at Join and every worker
// chooses the same ring, which crosses between the racks twice; with
// RingOrder fixed it stays in address order, crossing four times. Either
// way training runs and the workers end with identical state.
func TestRingOrderFollowsRacks(t *testing.T) {
	t.Parallel()
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
					if err := trainStep(ctx, w, models[r]); err != nil {
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
			crossings := rackCrossings(orders[0])
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

// TestRingOrderFollowsLinkChanges: 4 workers start in racks of ranks
// {0, 1} and {2, 3}, which address order already crosses as rarely as a
// ring can, so they keep it; then the racks change to {0, 2} and {1, 3},
// which address order crosses at every link. At the next re-probe (every
// 4 iterations here) every worker moves to the same ring, crossing the
// new racks twice, between the same two iterations, and the training goes
// on to identical state.
func TestRingOrderFollowsLinkChanges(t *testing.T) {
	t.Parallel()
	models := make([]*toy, 4)
	c := gyretest.MakeCluster(t, gyretest.Options{N: 4, Links: blockRacks,
		Config:  func(r int, c *gyre.Config) { c.GlobalBatch = 40 },
		Options: func(int) []gyre.Option { return []gyre.Option{gyre.WithReprobeEvery(4)} },
		State: func(r int) *gyre.State {
			models[r] = newToy()
			return models[r].state()
		}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var change sync.Once
	orders := make([][][]int, 4) // per rank, per iteration
	errs := c.Run(func(r int, w *gyre.Worker) error {
		for w.Iter() < 7 {
			orders[r] = append(orders[r], w.View().RingOrder)
			if w.Iter() == 1 {
				change.Do(func() { twoRacks(c.Net, c.IDs) })
			}
			if err := trainStep(ctx, w, models[r]); err != nil {
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
		crossings := rackCrossings(o)
		if want := map[bool]int{true: 4, false: 2}[it < 4]; crossings != want {
			t.Fatalf("iteration %d runs ring %v, crossing the racks %d times, want %d (orders %v)", it, o, crossings, want, orders[0])
		}
	}
	c.EnsureSameState(t)
}

// TestFailedBoundaryKeepsItsIteration: in a static view of 4, worker 3
// dies as the boundary of iteration 3 probes the links again. The others
// fail that Boundary with ErrPeerLost, and it leaves them as it found
// them: the iteration, shares and ring order of iteration 3, with nothing
// of the boundary's decisions applied.
func TestFailedBoundaryKeepsItsIteration(t *testing.T) {
	t.Parallel()
	models := make([]*toy, 4)
	var c *gyretest.Cluster
	c = gyretest.MakeCluster(t, gyretest.Options{N: 4,
		Config: func(r int, cfg *gyre.Config) {
			cfg.GlobalBatch = 40
			if r == 3 {
				cfg.Failpoint = "probe@3"
			}
		},
		State: func(r int) *gyre.State {
			models[r] = newToy()
			return models[r].state()
		},
		Options: func(r int) []gyre.Option {
			return []gyre.Option{gyre.WithReprobeEvery(4), gyre.WithFailAction(func() {
				c.Kill(t, r)
				runtime.Goexit()
			})}
		}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := c.Run(func(r int, w *gyre.Worker) error {
		for {
			iter, shares, order := w.Iter(), w.Shares(), w.View().RingOrder
			err := trainStep(ctx, w, models[r])
			if err == nil {
				continue
			}
			if !errors.Is(err, gyre.ErrPeerLost) {
				return fmt.Errorf("worker %d at iteration %d: %w, want ErrPeerLost", r, iter, err)
			}
			switch {
			case iter != 3:
				return fmt.Errorf("worker %d failed at iteration %d, want 3: %w", r, iter, err)
			case w.Iter() != iter:
				return fmt.Errorf("worker %d: the failed boundary of iteration %d left it at %d", r, iter, w.Iter())
			case !slices.Equal(w.Shares(), shares):
				return fmt.Errorf("worker %d: the failed boundary changed the shares from %v to %v", r, shares, w.Shares())
			case !slices.Equal(w.View().RingOrder, order):
				return fmt.Errorf("worker %d: the failed boundary changed the ring from %v to %v", r, order, w.View().RingOrder)
			}
			return nil
		}
	})
	if err := errors.Join(errs[:3]...); err != nil {
		t.Fatal(err)
	}
}
