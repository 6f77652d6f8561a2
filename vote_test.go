package gyre

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/ring"
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
