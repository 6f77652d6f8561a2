package gyre

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/mem"
)

// TestBoundaryOutcomeAgreement: rank 1 fails a collective that rank 0, the
// broadcast's root, completes. Both must report the same outcome at the
// boundary: an IterationError naming rank 1, with the iteration not
// advanced on either.
func TestBoundaryOutcomeAgreement(t *testing.T) {
	ws := cluster{n: 2}.mustStart(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done, stop := context.WithCancel(ctx)
	stop()
	buf := make([]float64, 64)
	if err := ring.Broadcast(ctx, ws[0].cur.data, 0, buf); err != nil {
		t.Fatalf("root's broadcast: %v", err)
	}
	err := ring.Broadcast(done, ws[1].cur.data, 0, buf)
	if err == nil {
		t.Fatal("rank 1's broadcast with an ended context succeeded")
	}
	ws[1].failed = err // as Wait records a failed bucket
	errs := each(ws, func(_ int, w *Worker) error {
		_, err := w.Boundary(ctx)
		return err
	})
	for r, err := range errs {
		var ie *IterationError
		if !errors.As(err, &ie) || !errors.Is(err, ErrIterationFailed) {
			t.Fatalf("rank %d: Boundary = %v, want an IterationError", r, err)
		}
		if !slices.Equal(ie.Ranks, []int{1}) || !slices.Equal(ie.Reasons, []string{"canceled"}) || ie.Iter != 0 {
			t.Errorf("rank %d: outcome %+v, want iteration 0 failed on rank 1 (canceled)", r, ie)
		}
		if (ie.Local != nil) != (r == 1) {
			t.Errorf("rank %d: Local = %v", r, ie.Local)
		}
		if ws[r].Iter() != 0 {
			t.Errorf("rank %d advanced to iteration %d after a failed one", r, ws[r].Iter())
		}
	}
}

// TestBoundaryComparesStates: a worker whose state drifts fails every
// worker's boundary with ErrDiverged naming it, and the digests of equal
// states pass.
func TestBoundaryComparesStates(t *testing.T) {
	params := make([][]float64, 3)
	ws := cluster{n: 3, options: func(r int) []Option {
		params[r] = randomF64(uint64(r)+1, 100)
		return []Option{WithState(NewState().Float64("w", params[r]))}
	}}.mustStart(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	boundary := func(_ int, w *Worker) error {
		// An iteration long enough that hashing stays within its budget,
		// so this boundary checks the states.
		time.Sleep(100 * time.Millisecond)
		_, err := w.Boundary(ctx)
		return err
	}
	if err := errors.Join(each(ws, boundary)...); err != nil {
		t.Fatalf("equal states: %v", err)
	}
	params[2][17] += 1e-12
	for r, err := range each(ws, boundary) {
		if !errors.Is(err, ErrDiverged) || !containsAll(err.Error(), "rank 2", "different state") {
			t.Errorf("rank %d: Boundary = %v, want ErrDiverged naming rank 2's state", r, err)
		}
	}
}

// TestCheckInterval: hashing is checked every boundary while it costs at
// most 1% of the iteration, and less often, in proportion, beyond.
func TestCheckInterval(t *testing.T) {
	for _, tc := range []struct {
		hash, wall []int64
		want       int64
	}{
		{[]int64{0, 0}, []int64{5e6, 6e6}, 1},
		{[]int64{10e3, 20e3}, []int64{5e6, 6e6}, 1},
		{[]int64{1e6, 2e6}, []int64{50e6, 100e6}, 2},
		{[]int64{1e6, 3e6}, []int64{50e6, 100e6}, 3},
		{[]int64{1e9, 1e9}, []int64{1e6, 1e6}, maxCheckInterval},
	} {
		recs := make([]record, len(tc.hash))
		for i := range recs {
			recs[i] = record{hashNs: tc.hash[i], wall: tc.wall[i]}
		}
		if got := checkInterval(recs); got != tc.want {
			t.Errorf("hash %v wall %v: interval %d, want %d", tc.hash, tc.wall, got, tc.want)
		}
	}
}

// TestCloseWhileSubmitting closes a worker from another goroutine while
// its trainer submits gradients: no data race, and submissions after the
// close fail with ErrClosed instead of hanging.
func TestCloseWhileSubmitting(t *testing.T) {
	for range 10 {
		ws := cluster{n: 2}.mustStart(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			ws[0].Close()
		}()
		var last error
		for range 200 {
			h := ws[0].AllReduceAsync(ctx, "g", make([]float32, 1024))
			if err := h.Wait(ctx); err != nil {
				last = err
			}
			if errors.Is(last, ErrClosed) || errors.Is(last, ring.ErrClosed) {
				break
			}
		}
		wg.Wait()
		if err := ws[0].AllReduceAsync(ctx, "g", make([]float32, 8)).Wait(ctx); !errors.Is(err, ErrClosed) {
			t.Fatalf("allreduce after Close = %v, want ErrClosed", err)
		}
		cancel()
	}
}

// TestWaitTimeoutThenAbandon: a Wait that gives up before a late peer
// arrives must not abort the collective; after Abandon on every worker the
// next iteration works everywhere and gives the right answer.
func TestWaitTimeoutThenAbandon(t *testing.T) {
	ws := cluster{n: 2}.mustStart(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := each(ws, func(r int, w *Worker) error {
		w.Batch()
		g := []float64{float64(r + 1)}
		if r == 1 {
			time.Sleep(500 * time.Millisecond) // late, not dead
		}
		w.AllReduceAsync64(ctx, "g", g)
		if r == 0 {
			short, stop := context.WithTimeout(ctx, 50*time.Millisecond)
			err := w.Wait(short)
			stop()
			if !errors.Is(err, context.DeadlineExceeded) {
				return errors.Join(errors.New("impatient Wait did not time out"), err)
			}
		}
		if err := w.Abandon(ctx); err != nil {
			return err
		}
		w.Batch()
		g[0] = float64(r + 1)
		w.AllReduceAsync64(ctx, "g", g)
		if err := w.Wait(ctx); err != nil {
			return err
		}
		if g[0] != 1.5 { // equal shares: (1 + 2) / 2
			return errors.New("wrong mean after Abandon")
		}
		_, err := w.Boundary(ctx)
		return err
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// TestLateWorkerIsWaitedFor: over mem and over QUIC on loopback, a worker
// that reaches the allreduce 5 s after the others (slower than any
// deadline the ring used to have) does not fail it, since it keeps
// answering heartbeats.
func TestLateWorkerIsWaitedFor(t *testing.T) {
	for _, quic := range []bool{false, true} {
		name := map[bool]string{false: "mem", true: "quic"}[quic]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ws := cluster{n: 3, quic: quic, adjust: func(_ int, c *Config) { c.GlobalBatch = 3 }}.mustStart(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			errs := each(ws, func(r int, w *Worker) error {
				w.Batch()
				if r == 2 {
					time.Sleep(5 * time.Second) // evaluation, a checkpoint, a GC pause
				}
				g := []float64{float64(r)}
				w.AllReduceAsync64(ctx, "g", g)
				if err := w.Wait(ctx); err != nil {
					return err
				}
				if g[0] != 1 { // equal shares: (0 + 1 + 2) / 3
					return errors.New("wrong mean")
				}
				_, err := w.Boundary(ctx)
				return err
			})
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestLateBeyondCollectiveTimeout: with CollectiveTimeout below the delay,
// the waiting worker fails with a TimeoutError naming the late one, and
// the boundary fails on both (the vote waits no longer than any other
// collective).
func TestLateBeyondCollectiveTimeout(t *testing.T) {
	ws := cluster{n: 2, adjust: func(_ int, c *Config) { c.CollectiveTimeout = 500 * time.Millisecond }}.mustStart(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	waits := make([]error, 2)
	errs := each(ws, func(r int, w *Worker) error {
		if r == 1 {
			time.Sleep(1500 * time.Millisecond)
		}
		w.AllReduceAsync64(ctx, "g", []float64{1})
		waits[r] = w.Wait(ctx)
		_, err := w.Boundary(ctx)
		return err
	})
	var te *ring.TimeoutError
	if !errors.As(waits[0], &te) || te.Rank != 1 || string(te.Peer) != ws[1].View().Members[1] {
		t.Fatalf("rank 0: Wait = %v, want a TimeoutError naming rank 1", waits[0])
	}
	for r, err := range errs {
		if !errors.Is(err, ring.ErrTimeout) && !errors.Is(err, ErrIterationFailed) {
			t.Errorf("rank %d: Boundary = %v, want it failed by the timeout", r, err)
		}
	}
}

// TestFrozenWorkerIsLost: a worker frozen mid-iteration (SIGSTOP) makes
// every survivor's boundary fail with a PeerLostError naming its rank,
// within about PeerTimeout.
func TestFrozenWorkerIsLost(t *testing.T) {
	const victim = 1
	var net *mem.Network
	ws := cluster{n: 3, adjust: func(_ int, c *Config) { c.PeerTimeout = 300 * time.Millisecond },
		onNet: func(n *mem.Network) { net = n }}.mustStart(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	victimID := transport.PeerID(ws[victim].View().Members[victim])
	t.Cleanup(func() { net.Thaw(victimID) })
	net.Freeze(victimID)
	start := time.Now()
	took := make([]time.Duration, len(ws))
	errs := each(ws, func(r int, w *Worker) error {
		if r == victim {
			return nil // stopped
		}
		w.AllReduceAsync64(ctx, "g", []float64{1})
		w.Wait(ctx)
		_, err := w.Boundary(ctx)
		took[r] = time.Since(start)
		return err
	})
	for r, err := range errs {
		if r == victim {
			continue
		}
		var pl *PeerLostError
		if !errors.As(err, &pl) || pl.Rank != victim || pl.Peer != victimID || !errors.Is(err, transport.ErrPeerGone) {
			t.Errorf("rank %d: Boundary = %v, want a PeerLostError naming rank %d", r, err, victim)
		}
		if took[r] > 3*time.Second {
			t.Errorf("rank %d took %v", r, took[r])
		}
	}
}
