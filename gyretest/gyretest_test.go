package gyretest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/gyretest"
	"github.com/gyre-ml/gyre/transport"
)

func TestMain(m *testing.M) { gyretest.Main(m) }

// allReduce runs one iteration's allreduce of the worker's rank and its
// boundary on every worker, and returns the errors.
func allReduce(c *gyretest.Cluster) []error {
	return c.Run(func(r int, w *gyre.Worker) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		w.Batch()
		w.AllReduceAsync64(ctx, "g", []float64{float64(r)})
		if err := w.Wait(ctx); err != nil {
			return err
		}
		_, err := w.Boundary(ctx)
		return err
	})
}

func fast(_ int, c *gyre.Config) { c.PeerTimeout = 300 * time.Millisecond }

func TestKill(t *testing.T) {
	c := gyretest.MakeCluster(t, gyretest.Options{N: 3, Config: fast})
	c.Kill(t, 2)
	for r, err := range allReduce(c)[:2] {
		if p, ok := transport.PeerOf(err); !ok || p != c.IDs[2] || !errors.Is(err, transport.ErrPeerGone) {
			t.Errorf("rank %d: %v, want an error naming the killed rank 2", r, err)
		}
	}
}

func TestPartitionAndHeal(t *testing.T) {
	c := gyretest.MakeCluster(t, gyretest.Options{N: 3, Config: fast})
	c.Partition(t, []int{0}, []int{1, 2})
	c.Heal(t)
	if err := errors.Join(allReduce(c)...); err != nil {
		t.Fatalf("after Heal: %v", err)
	}
	c.Partition(t, []int{0}, []int{1, 2})
	errs := allReduce(c)
	if p, ok := transport.PeerOf(errs[0]); !ok || p == c.IDs[0] {
		t.Errorf("rank 0, cut off: %v, want an error naming a peer across the cut", errs[0])
	}
	for r, err := range errs[1:] {
		if p, ok := transport.PeerOf(err); !ok || p != c.IDs[0] {
			t.Errorf("rank %d: %v, want an error naming rank 0 across the cut", r+1, err)
		}
	}
}

func TestFreeze(t *testing.T) {
	c := gyretest.MakeCluster(t, gyretest.Options{N: 3, Config: fast})
	c.Freeze(t, 1)
	t.Cleanup(func() { c.Thaw(t, 1) })
	for _, r := range []int{0, 2} {
		w := c.Workers[r]
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done := make(chan error, 1)
		go func() {
			w.AllReduceAsync64(ctx, "g", []float64{1})
			done <- w.Wait(ctx)
		}()
		if err := <-done; !errors.Is(err, transport.ErrPeerGone) {
			t.Errorf("rank %d: %v, want the frozen rank gone", r, err)
		}
	}
}

// recorder is a testing.TB that records failures instead of failing.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper()                           {}
func (r *recorder) Fatal(args ...any)                 { r.failed = fmt.Sprint(args...) }
func (r *recorder) Fatalf(format string, args ...any) { r.failed = fmt.Sprintf(format, args...) }

func TestEnsureSameState(t *testing.T) {
	params := make([][]float64, 3)
	c := gyretest.MakeCluster(t, gyretest.Options{N: 3, Transport: gyretest.QUIC, State: func(r int) *gyre.State {
		params[r] = []float64{float64(r), 2, 3} // Join broadcasts rank 0's
		return gyre.NewState().Float64("w", params[r])
	}})
	c.EnsureSameState(t)
	params[2][1] = 2.5
	rec := &recorder{TB: t}
	c.EnsureSameState(rec)
	if !strings.Contains(rec.failed, "ranks [2]") {
		t.Fatalf("a drifted rank 2 gave %q", rec.failed)
	}
}

func TestProcs(t *testing.T) {
	gyre := gyretest.Gyre(t)
	p := gyretest.StartProcs(t, gyretest.ProcOptions{N: 3, Argv: func(int) []string {
		return []string{gyre, "--log-level", "warn", "train", "--iters", "20", "--eval-every", "10"}
	}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, res := range p.Wait(ctx) {
		if res.Code != 0 {
			t.Errorf("rank %d exited %d: %s", res.Rank, res.Code, res.Stderr)
		}
	}
}

// TestProcsKill: a job whose rank is killed mid-run ends on every other
// rank with an error instead of hanging.
func TestProcsKill(t *testing.T) {
	gyre := gyretest.Gyre(t)
	p := gyretest.StartProcs(t, gyretest.ProcOptions{N: 3, Argv: func(int) []string {
		return []string{gyre, "--log-level", "warn", "train", "--iters", "1000000", "--target-acc", "0"}
	}})
	time.Sleep(2 * time.Second)
	p.Kill(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, r := range []int{0, 2} {
		res := p.WaitRank(ctx, r)
		if res.Code == 0 || !strings.Contains(res.Stderr, "rank 1") {
			t.Errorf("rank %d exited %d: %s", r, res.Code, res.Stderr)
		}
	}
}

// TestProcsStopCont: a worker stopped for less than PeerTimeout and then
// resumed is late, not dead: the job completes.
func TestProcsStopCont(t *testing.T) {
	gyre := gyretest.Gyre(t)
	p := gyretest.StartProcs(t, gyretest.ProcOptions{N: 2, Argv: func(int) []string {
		return []string{gyre, "--log-level", "warn", "train", "--iters", "400", "--target-acc", "0", "--eval-every", "100"}
	}})
	time.Sleep(time.Second)
	p.Stop(t, 1)
	time.Sleep(800 * time.Millisecond)
	p.Cont(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, res := range p.Wait(ctx) {
		if res.Code != 0 {
			t.Errorf("rank %d exited %d: %s", res.Rank, res.Code, res.Stderr)
		}
	}
}
