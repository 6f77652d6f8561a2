package obs

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/ring/ringtest"
)

// TestAllReduceZeroAllocsObserved is ring's TestAllReduceZeroAllocs with
// the metrics observer installed: a steady-state allreduce, the ring's and
// recursive doubling's, still allocates nothing, and every call is
// counted.
func TestAllReduceZeroAllocsObserved(t *testing.T) {
	for _, tc := range []struct {
		name        string
		small, size int
	}{{"ring", -1, 4 << 20}, {"doubling", 1 << 30, 4 << 10}} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 4
			metrics := make([]*Metrics, n)
			comms := ringtest.MemComms(t, n, func(r int, c *ring.Config) {
				metrics[r] = NewMetrics("mem")
				c.Observer, c.SmallBytes = metrics[r], tc.small
			})
			bufs := make([][]float32, n)
			for r := range bufs {
				bufs[r] = make([]float32, tc.size/4)
			}
			// One goroutine per rank for the whole test, so that the
			// measurement sees the collectives' allocations only.
			start, done := make(chan struct{}), make(chan error, n)
			defer close(start)
			for r, c := range comms {
				go func() {
					for range start {
						done <- ring.AllReduce(context.Background(), c, wire.OpSum, bufs[r])
					}
				}()
			}
			run := func() {
				for range n {
					start <- struct{}{}
				}
				for range n {
					if err := <-done; err != nil {
						t.Error(err)
					}
				}
			}
			for range 3 { // warm the plan cache, scratch and queues
				run()
			}
			if allocs := testing.AllocsPerRun(10, run); allocs != 0 {
				t.Errorf("%d-byte allreduce over %d ranks with metrics: %v allocations per op, want 0", tc.size, n, allocs)
			}
			algo := ring.AlgoRing
			if tc.small > 0 {
				algo = ring.AlgoRecursiveDoubling
			}
			calls := 3 + 10 + 1 // AllocsPerRun runs once more to warm up
			bytes := testutil.ToFloat64(metrics[0].collBytes[algo])
			if bytes != float64(calls*tc.size) {
				t.Errorf("bytes counted %v, want %d calls of %d", bytes, calls, tc.size)
			}
		})
	}
}

// TestBoundaryShares: the share series follow the view, series of ranks
// that left go, and a redo counts the iterations it goes back over.
func TestBoundaryShares(t *testing.T) {
	m := NewMetrics("mem")
	m.Boundary(Boundary{Iter: 4, Next: 5, Epoch: 1, Members: 3, Shares: []int{10, 20, 30}})
	if got := testutil.CollectAndCount(m.share); got != 3 {
		t.Fatalf("%d share series for 3 ranks", got)
	}
	m.Boundary(Boundary{Iter: 9, Next: 6, Epoch: 2, Members: 2, Shares: []int{25, 35}, ViewChanged: true, Redo: true, Pending: 2})
	if got := testutil.ToFloat64(m.pending); got != 2 {
		t.Fatalf("%v pending joiners, want 2", got)
	}
	if got := testutil.CollectAndCount(m.share); got != 2 {
		t.Fatalf("%d share series after the view shrank to 2", got)
	}
	if got := testutil.ToFloat64(m.share.WithLabelValues("1")); got != 35 {
		t.Fatalf("rank 1's share %v, want 35", got)
	}
	if got := testutil.ToFloat64(m.redone); got != 4 {
		t.Fatalf("%v iterations redone, want 4 (6 to 9 again)", got)
	}
	if got := testutil.ToFloat64(m.recoveries); got != 1 {
		t.Fatalf("%v recoveries, want 1", got)
	}
	m.Boundary(Boundary{Iter: 6, Err: fmt.Errorf("vote failed")})
	if got := testutil.ToFloat64(m.iteration); got != 6 {
		t.Fatalf("an error moved gyre_iteration to %v; it stays at 6", got)
	}
}

// TestStatus: the status joins the last boundary's view, shares and
// compute times with the heartbeat ages read now, calls a member silent
// past the timeout, and takes busbw from the last large allreduce only.
func TestStatus(t *testing.T) {
	m := NewMetrics("mem")
	m.WatchHeartbeats(func(report func(int, time.Duration)) {
		report(0, 100*time.Millisecond)
		report(2, 3*time.Second)
	}, 2*time.Second)
	if s := m.Status(); len(s.Members) != 0 || !s.Updated.IsZero() {
		t.Fatalf("status before any boundary: %+v", s)
	}
	m.Boundary(Boundary{Iter: 6, Next: 7, Epoch: 3, Rank: 1, Members: 3, MemberNames: []string{"a", "b", "c"},
		Shares: []int{10, 20, 34}, Computes: []time.Duration{time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond}})
	m.Collective(ring.CollectiveStats{Algo: ring.AlgoRing, Bytes: 3 << 20, Ranks: 3, Duration: 2 * time.Millisecond})
	m.Collective(ring.CollectiveStats{Algo: ring.AlgoRecursiveDoubling, Bytes: 4 << 10, Ranks: 3, Duration: time.Millisecond})
	s := m.Status()
	if s.Worker != "b" || s.Rank != 1 || s.Epoch != 3 || s.Iteration != 7 || s.GlobalBatch != 64 {
		t.Fatalf("status %+v", s)
	}
	for r, want := range []string{StateAlive, StateSelf, StateSilent} {
		if got := s.Members[r].State; got != want {
			t.Errorf("rank %d: state %q, want %q", r, got, want)
		}
	}
	if c := s.Members[2].ComputeSeconds; c == nil || *c != 0.003 {
		t.Errorf("rank 2's compute time %v, want 3 ms", c)
	}
	if s.Members[1].HeartbeatAgeSeconds != nil {
		t.Errorf("this worker has a heartbeat age")
	}
	// 2(n−1)/n of 3 MiB in 2 ms; the 4 KiB allreduce after it is left out.
	if want := 4.0 / 3 * float64(3<<20) / 0.002; s.BusBW != want {
		t.Errorf("busbw %v, want %v", s.BusBW, want)
	}
	// A stall report shows on the page, and the page renders.
	m.Stall(Stall{Collective: "gradients", Iter: 7, Waited: 90 * time.Second, Behind: []int{2}, Pending: []string{"fc1.w"}})
	if s := m.Status(); s.Stalls != 1 || s.LastStall == nil || s.LastStall.WaitedSeconds != 90 {
		t.Errorf("status after a stall report: %+v", s.LastStall)
	}
	rec := httptest.NewRecorder()
	m.statusPage(rec, httptest.NewRequest("GET", "/", nil))
	if page := rec.Body.String(); rec.Code != 200 || !strings.Contains(page, "waited 90 s in the gradients of iteration 7 for ranks [2], with tensors [fc1.w] pending") {
		t.Errorf("status page (%d) lacks the stall:\n%s", rec.Code, page)
	}
}
