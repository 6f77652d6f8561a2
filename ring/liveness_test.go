package ring

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/liveness"
	"github.com/gyre-ml/gyre/transport"
)

// Liveness settings of these tests: heartbeats every 25 ms, silence for
// 200 ms means gone.
const (
	testInterval    = 25 * time.Millisecond
	testPeerTimeout = 200 * time.Millisecond
)

// withLiveness replaces the cluster's Comms with ones that check liveness
// through a heartbeat Monitor per rank; adjust, if not nil, changes each
// rank's Config further.
func (cl *cluster) withLiveness(tb testing.TB, adjust func(*Config)) {
	tb.Helper()
	mons := make([]*liveness.Monitor, len(cl.trs))
	for r, tr := range cl.trs {
		m, err := liveness.New(liveness.Config{Transport: tr, Interval: testInterval})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { m.Close() })
		var others []transport.PeerID
		for q, id := range cl.ids {
			if q != r {
				others = append(others, id)
			}
		}
		m.Watch(others)
		mons[r] = m
	}
	for _, c := range cl.comms {
		c.Close()
	}
	cl.comms = cl.newComms(tb, cl.ids, func(c *Config) {
		c.Epoch, c.Liveness, c.PeerTimeout = 2, mons[c.Rank], testPeerTimeout
		if adjust != nil {
			adjust(c)
		}
	})
}

// TestLateIsNotDead: a rank that enters an allreduce long after the others
// (five peer timeouts) is waited for, since it keeps answering heartbeats.
// It runs in fake time: under load, a heartbeat could be late by the
// 200 ms peer timeout.
func TestLateIsNotDead(t *testing.T) {
	startKernelPool(t)
	synctest.Test(t, testLateIsNotDead)
}

func testLateIsNotDead(t *testing.T) {
	cl := newCluster(t, 3, nil)
	cl.withLiveness(t, nil)
	errs := each(cl.comms, func(r int, c *Comm) error {
		if r == 2 {
			time.Sleep(5 * testPeerTimeout)
		}
		v := []float64{float64(r + 1)}
		if err := AllReduce(t.Context(), c, wire.OpSum, v); err != nil {
			return err
		}
		if v[0] != 6 {
			return errors.New("wrong sum")
		}
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// TestLateBeyondCollectiveTimeout: past CollectiveTimeout a late rank does
// fail the collective, with a TimeoutError naming it.
func TestLateBeyondCollectiveTimeout(t *testing.T) {
	startKernelPool(t)
	synctest.Test(t, testLateBeyondCollectiveTimeout)
}

func testLateBeyondCollectiveTimeout(t *testing.T) {
	cl := newCluster(t, 2, nil)
	cl.withLiveness(t, func(c *Config) { c.CollectiveTimeout = 300 * time.Millisecond })
	errs := each(cl.comms, func(r int, c *Comm) error {
		if r == 1 {
			time.Sleep(time.Second)
		}
		return AllReduce(t.Context(), c, wire.OpSum, make([]float32, 10))
	})
	var te *TimeoutError
	if !errors.As(errs[0], &te) || te.Peer != cl.ids[1] || te.Rank != 1 {
		t.Fatalf("rank 0: got %v, want a TimeoutError naming rank 1", errs[0])
	}
	// The late rank may still complete, if what it needs had already
	// arrived; else it learns of the timeout from rank 0's abort marker.
	if errs[1] != nil && !errors.Is(errs[1], ErrTimeout) {
		t.Errorf("rank 1 (late): got %v, want nil or the timeout from rank 0's abort", errs[1])
	}
}

// TestFrozenPeerIsGone: a rank frozen as an allreduce starts (alive
// connections, a silent process, as under SIGSTOP) is declared gone by
// every other rank after its peer timeout and a few liveness checks, in
// fake time, with an error naming it.
func TestFrozenPeerIsGone(t *testing.T) {
	startKernelPool(t)
	for _, algo := range algos {
		t.Run(algo.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const n, victim = 4, 1
				cl := newCluster(t, n, nil)
				cl.withLiveness(t, func(c *Config) { c.SmallBytes = algo.small; c.ChunkBytes = 4 << 10 })
				t.Cleanup(func() { cl.net.Thaw(cl.ids[victim]) })
				cl.net.Freeze(cl.ids[victim])
				start := time.Now()
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				defer cancel()
				took := make([]time.Duration, n)
				errs := each(cl.comms, func(r int, c *Comm) error {
					err := AllReduce(ctx, c, wire.OpSum, make([]float32, 64<<10))
					took[r] = time.Since(start)
					return err
				})
				for r, err := range errs {
					if r == victim {
						continue
					}
					peer, ok := transport.PeerOf(err)
					if !errors.Is(err, transport.ErrPeerGone) || !ok || peer != cl.ids[victim] {
						t.Errorf("rank %d: got %v, want a peer error naming %s", r, err, cl.ids[victim])
					}
					// Fake time: no load delays the heartbeats or the checks.
					if took[r] < testPeerTimeout || took[r] > testPeerTimeout+4*testInterval {
						t.Errorf("rank %d took %v to fail, want %v and a few liveness checks", r, took[r], testPeerTimeout)
					}
				}
			})
		})
	}
}
