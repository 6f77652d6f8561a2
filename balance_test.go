package gyre_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/gyretest"
	"github.com/gyre-ml/gyre/kernels"
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

// TestEpochCoveredOnceThroughChanges: over one epoch in which the shares
// change (balancing, one worker slow), the membership changes (a worker
// joins) and one iteration is abandoned and run again, the committed
// iterations of all workers together use every sample index exactly once.
// (The iteration is abandoned two after the join, by all three workers.)
func TestEpochCoveredOnceThroughChanges(t *testing.T) {
	const global, size, redoAfter = 24, 600, 2 // 25 iterations per epoch
	const iters = size / global
	c := gyretest.MakeCluster(t, gyretest.Options{N: 2, Gossip: true,
		Config: func(r int, c *gyre.Config) { c.GlobalBatch, c.DatasetSize = global, size },
		State:  func(int) *gyre.State { return newToy().state() }})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var mu sync.Mutex
	used := map[int64]int{}
	sharesSeen := map[string]bool{}
	admitted := make(chan struct{})
	var redos int
	train := func(r int, w *gyre.Worker) error {
		redone, joinedAt := false, int64(-1)
		for w.Iter() < iters {
			b := w.Batch()
			if w.Size() == 3 && joinedAt < 0 {
				joinedAt = b.Iter // the same iteration on every worker
			}
			if r == 1 {
				time.Sleep(time.Duration(len(b.Indices)) * 200 * time.Microsecond) // the slow one
			}
			g := make([]float64, toyDim)
			w.AllReduceAsync64(ctx, "g", g)
			if joinedAt >= 0 && b.Iter == joinedAt+redoAfter && !redone { // every worker gives this one up
				redone = true
				mu.Lock()
				redos++
				mu.Unlock()
				if err := w.Abandon(ctx); err != nil {
					return err
				}
				continue
			}
			if err := w.Wait(ctx); err != nil {
				return err
			}
			ch, err := w.Boundary(ctx)
			if err != nil {
				return err
			}
			if err := w.Commit(); err != nil {
				return err
			}
			mu.Lock()
			for _, i := range b.Indices {
				used[i]++
			}
			sharesSeen[fmt.Sprint(ch.Shares)] = true
			mu.Unlock()
			if len(ch.Admitted) > 0 && r == 0 {
				close(admitted)
			}
			if w.Size() < 3 && b.Iter >= 8 {
				time.Sleep(20 * time.Millisecond) // give the joiner time to be admitted mid-epoch
			}
		}
		return w.Leave(ctx)
	}
	joiner := c.AddJoiner(t)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() { errs[r] = train(r, c.Workers[r]) })
	}
	jw, err := joiner.Wait(c)
	if err != nil {
		t.Fatal(err)
	}
	errs[2] = train(2, jw)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	select {
	case <-admitted:
	default:
		t.Fatal("the joiner was never reported admitted")
	}
	if redos != 3 {
		t.Fatalf("%d workers redid an iteration, want all 3", redos)
	}
	if len(used) != size {
		t.Fatalf("%d distinct samples used, want %d", len(used), size)
	}
	for i, n := range used {
		if n != 1 || i < 0 || i >= size {
			t.Fatalf("sample %d used %d times", i, n)
		}
	}
	if len(sharesSeen) < 3 {
		t.Fatalf("shares took only %d values (%v): balancing and the join should have changed them", len(sharesSeen), sharesSeen)
	}
}

// TestBalanceCapsSharesAtDeviceMemory: of 3 workers, rank 0 is 4× faster
// than the others, so balancing alone would give it about 40 of 60
// samples; but its (fake) device holds only 15 samples' memory. Its share
// never exceeds 15, the other two take the rest, and every worker agrees.
// The fake device reports free memory as a caching allocator leaves it:
// its total less what the current share holds.
func TestBalanceCapsSharesAtDeviceMemory(t *testing.T) {
	const global, iters, bps = 60, 30, 1 << 20
	const capSamples = 15
	var used [3]atomic.Int64
	c := gyretest.MakeCluster(t, gyretest.Options{N: 3,
		Config: func(r int, c *gyre.Config) { c.GlobalBatch, c.BytesPerSample = global, bps },
		Options: func(r int) []gyre.Option {
			return []gyre.Option{gyre.WithDevice(func() (kernels.Device, bool) {
				if r != 0 {
					return kernels.Device{}, false // no device: no cap
				}
				total := uint64(capSamples * bps)
				return kernels.Device{Kind: kernels.KindGPU, MemoryBytes: total, FreeBytes: total - uint64(used[r].Load())}, true
			})}
		}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	final := make([][]int, 3)
	errs := c.Run(func(r int, w *gyre.Worker) error {
		perSample := 400 * time.Microsecond
		if r == 0 {
			perSample /= 4
		}
		for w.Iter() < iters {
			if s := w.Shares(); s[0] > capSamples {
				return fmt.Errorf("iteration %d: shares %v exceed rank 0's memory of %d samples", w.Iter(), s, capSamples)
			}
			b := w.Batch()
			used[r].Store(int64(len(b.Indices)) * bps)
			time.Sleep(time.Duration(len(b.Indices)) * perSample)
			if err := w.Wait(ctx); err != nil {
				return err
			}
			if _, err := w.Boundary(ctx); err != nil {
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
		if !slices.Equal(final[r], final[0]) {
			t.Fatalf("workers disagree: %v", final)
		}
	}
	// Capped at 15, rank 0 is still the fastest: it gets all it can hold.
	if s := final[0]; s[0] != capSamples || s[1] < 20 || s[2] < 20 {
		t.Fatalf("final shares %v, want rank 0 at its cap of %d and the rest split", s, capSamples)
	}
}

// TestLeaveStartsFromTheModels: of 4 workers, worker 3 takes 4× as long
// per sample. When worker 0 leaves, the view of 3 starts from the shares
// the fitted models give, the same on every member, not from equal ones.
func TestLeaveStartsFromTheModels(t *testing.T) {
	const global, leaveAt, iters, slow = 24, 25, 30, 3
	c := gyretest.MakeCluster(t, gyretest.Options{N: 4, Gossip: true,
		Config: func(r int, c *gyre.Config) { c.GlobalBatch = global }})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	started := make([][]int, 4) // the shares the view of 3 started from
	errs := c.Run(func(r int, w *gyre.Worker) error {
		perSample := time.Millisecond
		if r == slow {
			perSample *= 4
		}
		g := make([]float64, 8)
		for w.Iter() < iters {
			b := w.Batch()
			time.Sleep(time.Duration(len(b.Indices)) * perSample)
			w.AllReduceAsync64(ctx, "g", g)
			if err := w.Wait(ctx); err != nil {
				return err
			}
			if r == 0 && b.Iter == leaveAt {
				w.RequestLeave()
			}
			ch, err := w.Boundary(ctx)
			if err != nil {
				return err
			}
			if ch.Left {
				return nil
			}
			if ch.ViewChanged && len(ch.View.Members) == 3 {
				started[r] = ch.Shares
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
	for r := 2; r < 4; r++ {
		if !slices.Equal(started[r], started[1]) {
			t.Fatalf("the view of 3 started from different shares: %v", started[1:])
		}
	}
	// Rates 1, 1 and 0.25 per ms: about 10.7, 10.7 and 2.7 of 24. Equal
	// shares would be 8 each.
	if s := started[1]; len(s) != 3 || s[2] > 5 || s[0] < 9 || s[1] < 9 {
		t.Fatalf("the view of 3 started from shares %v; want the slow worker (rank 2) near 3 of %d", s, global)
	}
}
