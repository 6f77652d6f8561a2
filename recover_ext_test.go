package gyre_test

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/gyretest"
)

// recoveryRun is what one worker saw in a job that lost a member.
type recoveryRun struct {
	killed bool     // this worker was the one killed
	redos  int      // boundaries that returned Redo
	lost   []string // the workers those named lost
	epoch  uint64
	iter   int64 // the iteration it ended at
}

// trainThroughLoss trains the toy to iters with the documented loop: a
// failed Wait is logged, not fatal, and Boundary recovers. The worker
// whose index is victim is killed at the start of iteration killAt.
func trainThroughLoss(ctx context.Context, t *testing.T, c *gyretest.Cluster, i int, m *toy, iters, killAt int64, victim int) (recoveryRun, error) {
	var run recoveryRun
	w := c.Workers[i]
	for w.Iter() < iters {
		if i == victim && w.Iter() == killAt {
			c.Kill(t, i)
			run.killed = true
			return run, nil
		}
		b := w.Batch()
		g := m.grad(b.Indices)
		w.AllReduceAsync64(ctx, "g0", g[:toyDim/2])
		w.AllReduceAsync64(ctx, "g1", g[toyDim/2:])
		if err := w.Wait(ctx); err != nil {
			t.Logf("worker %d: iteration %d: %v (Boundary recovers)", i, b.Iter, err)
		} else {
			m.step(g)
		}
		ch, err := w.Boundary(ctx)
		if err != nil {
			return run, err
		}
		if ch.Redo {
			run.redos++
			run.lost = append(run.lost, ch.Lost...)
		}
		run.epoch = ch.View.Epoch
		if err := w.Commit(); err != nil {
			return run, err
		}
	}
	run.iter = w.Iter()
	return run, w.Leave(ctx)
}

// TestSurviveKill kills one of four gossip workers mid-run: the three
// survivors recover without it, redo what was not committed, and end
// where one process training on the same global batches ends.
func TestSurviveKill(t *testing.T) {
	for _, tr := range []string{gyretest.Mem, gyretest.QUIC} {
		t.Run(tr, func(t *testing.T) { testSurviveKill(t, tr) })
	}
}

func testSurviveKill(t *testing.T, tr string) {
	const global, iters, killAt, victim = 24, 60, 20, 2
	models := make([]*toy, 4)
	c := gyretest.MakeCluster(t, gyretest.Options{N: 4, Transport: tr, Gossip: true,
		Config: func(r int, c *gyre.Config) {
			c.GlobalBatch, c.PeerTimeout, c.QuorumTimeout = global, 500*time.Millisecond, 20*time.Second
		},
		State: func(r int) *gyre.State {
			models[r] = newToy()
			return models[r].state()
		}})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	runs := make([]recoveryRun, 4)
	errs := c.Run(func(i int, w *gyre.Worker) error {
		var err error
		runs[i], err = trainThroughLoss(ctx, t, c, i, models[i], iters, killAt, victim)
		return err
	})
	victimID := string(c.IDs[victim])
	for i, err := range errs {
		if err != nil && !(i == victim && errors.Is(err, gyre.ErrClosed)) {
			t.Errorf("worker %d: %v", i, err)
		}
	}
	if t.Failed() {
		return
	}
	want := referenceToy(t, global, iters)
	for i, run := range runs {
		if i == victim {
			continue
		}
		if run.redos != 1 || !slices.Equal(run.lost, []string{victimID}) {
			t.Errorf("worker %d: %d redos naming %v lost, want 1 naming %s", i, run.redos, run.lost, victimID)
		}
		if run.iter != iters {
			t.Errorf("worker %d ended at iteration %d, want %d", i, run.iter, iters)
		}
		if !closeRel(models[i].theta, want.theta, 1e-12) {
			t.Errorf("worker %d ended with θ[0] = %v, one process %v", i, models[i].theta[0], want.theta[0])
		}
	}
}

// TestFrozenWorkerRejoins stops one of four gossip workers for longer
// than PeerTimeout, as SIGSTOP does, then resumes it: the others go on
// as three, the resumed worker learns it was left out and rejoins as a
// new member, and all four end where one process ends.
func TestFrozenWorkerRejoins(t *testing.T) {
	const global, iters, freezeAt, victim = 24, 200, 20, 2
	models := make([]*toy, 4)
	c := gyretest.MakeCluster(t, gyretest.Options{N: 4, Gossip: true,
		Config: func(r int, c *gyre.Config) {
			c.GlobalBatch, c.PeerTimeout, c.QuorumTimeout = global, 300*time.Millisecond, 20*time.Second
		},
		State: func(r int) *gyre.State {
			models[r] = newToy()
			return models[r].state()
		}})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	runs := make([]recoveryRun, 4)
	var admitted [4][]string
	errs := c.Run(func(i int, w *gyre.Worker) error {
		m := models[i]
		for w.Iter() < iters {
			if i == victim && w.Iter() == freezeAt && runs[i].redos == 0 {
				c.Freeze(t, i)
				time.AfterFunc(time.Second, func() { c.Thaw(t, i) })
			}
			time.Sleep(10 * time.Millisecond) // the job outlasts the freeze and the rejoin
			b := w.Batch()
			g := m.grad(b.Indices)
			w.AllReduceAsync64(ctx, "g0", g[:toyDim/2])
			w.AllReduceAsync64(ctx, "g1", g[toyDim/2:])
			if err := w.Wait(ctx); err != nil {
				t.Logf("worker %d: iteration %d: %v (Boundary recovers)", i, b.Iter, err)
			} else {
				m.step(g)
			}
			ch, err := w.Boundary(ctx)
			if err != nil {
				return err
			}
			if ch.Redo {
				runs[i].redos++
				runs[i].lost = append(runs[i].lost, ch.Lost...)
			}
			admitted[i] = append(admitted[i], ch.Admitted...)
			if err := w.Commit(); err != nil {
				return err
			}
		}
		runs[i].iter = w.Iter()
		return w.Leave(ctx)
	})
	for i, err := range errs {
		if err != nil {
			t.Errorf("worker %d: %v", i, err)
		}
	}
	if t.Failed() {
		return
	}
	victimID := string(c.IDs[victim])
	want := referenceToy(t, global, iters)
	for i, run := range runs {
		switch {
		case run.iter != iters:
			t.Errorf("worker %d ended at iteration %d, want %d", i, run.iter, iters)
		case i == victim && (run.redos != 1 || !slices.Equal(admitted[i], []string{victimID})):
			t.Errorf("the resumed worker: %d redos, admitted %v; want one redo that admitted it", run.redos, admitted[i])
		case i != victim && (run.redos != 1 || !slices.Equal(run.lost, []string{victimID}) || !slices.Equal(admitted[i], []string{victimID})):
			t.Errorf("worker %d: %d redos naming %v lost, admitted %v; want one redo without %s, who was admitted again",
				i, run.redos, run.lost, admitted[i], victimID)
		}
		if !closeRel(models[i].theta, want.theta, 1e-12) {
			t.Errorf("worker %d ended with θ[0] = %v, one process %v", i, models[i].theta[0], want.theta[0])
		}
	}
}

// lossJob is a gossip job of n workers training the toy through losses:
// worker i dies at the start of iteration killAt[i] (killed by the test),
// or at its Config.Failpoint failpoints[i] (killed by the worker itself).
type lossJob struct {
	n          int
	iters      int64
	killAt     map[int]int64
	failpoints map[int]string
}

// run trains the job and checks that every worker that did not die ends
// at the last iteration where one process ends; it returns which died.
func (j lossJob) run(t *testing.T) (died []bool) {
	const global = 24
	models := make([]*toy, j.n)
	died = make([]bool, j.n)
	var c *gyretest.Cluster
	c = gyretest.MakeCluster(t, gyretest.Options{N: j.n, Gossip: true,
		Config: func(r int, cfg *gyre.Config) {
			cfg.GlobalBatch, cfg.PeerTimeout, cfg.QuorumTimeout = global, 300*time.Millisecond, 20*time.Second
			cfg.Failpoint = j.failpoints[r]
		},
		State: func(r int) *gyre.State {
			models[r] = newToy()
			return models[r].state()
		},
		Options: func(r int) []gyre.Option {
			return []gyre.Option{gyre.WithFailAction(func() {
				died[r] = true
				c.Kill(t, r)
				runtime.Goexit()
			})}
		}})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	ends := make([]int64, j.n)
	errs := c.Run(func(i int, w *gyre.Worker) error {
		m := models[i]
		for w.Iter() < j.iters {
			if at, ok := j.killAt[i]; ok && w.Iter() == at {
				// The others finish the vote this worker took part in
				// first, so all hold one commit.
				time.Sleep(100 * time.Millisecond)
				died[i] = true
				c.Kill(t, i)
				return nil
			}
			b := w.Batch()
			g := m.grad(b.Indices)
			w.AllReduceAsync64(ctx, "g0", g[:toyDim/2])
			w.AllReduceAsync64(ctx, "g1", g[toyDim/2:])
			if err := w.Wait(ctx); err == nil {
				m.step(g)
			}
			if _, err := w.Boundary(ctx); err != nil {
				return err
			}
			if err := w.Commit(); err != nil {
				return err
			}
		}
		ends[i] = w.Iter()
		return w.Leave(ctx)
	})
	want := referenceToy(t, global, j.iters)
	for i, err := range errs {
		switch {
		case died[i]:
		case err != nil:
			t.Errorf("worker %d: %v", i, err)
		case ends[i] != j.iters:
			t.Errorf("worker %d ended at iteration %d, want %d", i, ends[i], j.iters)
		case !closeRel(models[i].theta, want.theta, 1e-12):
			t.Errorf("worker %d ended with θ[0] = %v, one process %v", i, models[i].theta[0], want.theta[0])
		}
	}
	return died
}

// TestSurviveFailpoints: a worker dies at each step of the protocols that
// a kill from outside could hardly aim at, and the job goes on.
func TestSurviveFailpoints(t *testing.T) {
	for _, tc := range []struct {
		name string
		job  lossJob
		dead []int // the workers that must have died
	}{
		// During the boundary vote: its peers are in the allgather.
		{"vote", lossJob{n: 4, iters: 60, failpoints: map[int]string{2: "vote@20"}}, []int{2}},
		// Worker 3 is killed; worker 0 coordinates the recovery and dies
		// once it has proposed. Five workers survive two losses in a row.
		{"coordinator", lossJob{n: 5, iters: 60, killAt: map[int]int64{3: 20}, failpoints: map[int]string{0: "propose"}}, []int{0, 3}},
		// Worker 2 is killed at the start of an iteration, so every
		// survivor holds the same commit and worker 0, the lowest rank,
		// sends it; it dies after its first tensor.
		{"holder", lossJob{n: 4, iters: 60, killAt: map[int]int64{2: 20}, failpoints: map[int]string{0: "send-state@1"}}, []int{0, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			died := tc.job.run(t)
			for _, d := range tc.dead {
				if !died[d] {
					t.Errorf("worker %d did not die: the failpoint was never reached", d)
				}
			}
		})
	}
}
