package gyre_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/gyretest"
	"github.com/gyre-ml/gyre/transport"
)

// lossJob is a gossip job of n workers (and perhaps a joiner) training
// the toy with the documented loop through faults: a failed Wait is
// logged, not fatal, and Boundary recovers.
type lossJob struct {
	n         int
	iters     int64
	transport string // gyretest.Mem if ""
	// killAt: worker i is killed (gyretest's Kill) at the start of
	// iteration killAt[i], once the others are past the boundary it
	// voted in.
	killAt map[int]int64
	// failpoints: worker i's Config.Failpoint; index n is the joiner's.
	// A worker that reaches its failpoint is killed there.
	failpoints map[int]string
	// freezeAt: worker i stops (gyretest's Freeze) for a second at the
	// start of iteration freezeAt[i], as SIGSTOP stops a process.
	freezeAt map[int]int64
	// suspectAt: worker i's collective of iteration suspectAt[i] fails
	// with a lost peer, though nobody is gone (a stream broke, not a
	// connection): the heartbeats give no evidence.
	suspectAt map[int]int64
	// joiner: one more worker joins through worker 0 while the job runs.
	joiner bool
	// pace is a sleep per iteration, so that the job outlasts a freeze
	// or a rejoin.
	pace time.Duration
	// perSample: worker i sleeps perSample[i] for each sample of its
	// share, between Batch and its collectives: compute time, which
	// LB-BSP balances.
	perSample map[int]time.Duration
	// mismatchAt: the first mismatches runs of iteration mismatchAt[i]
	// reduce one element fewer on worker i than on the others.
	mismatchAt map[int]int64
	mismatches int
	// failing: the job is meant to end in an error, which the test checks.
	failing bool
	// stallAt: worker i stalls for stall between Batch and its
	// collectives in iteration stallAt[i], its first run of it; the
	// workers' CollectiveTimeout is collectiveTimeout (default: Config's).
	stallAt           map[int]int64
	stall             time.Duration
	collectiveTimeout time.Duration
	// cutAt: at the start of iteration cutAt[i], its first run of it,
	// worker i is cut off from the others, gossip included (gyretest's
	// Partition), for cutFor; gossip then declares members dead within
	// about half a second.
	cutAt  map[int]int64
	cutFor time.Duration
	// killAfterJoin: worker i is killed killAfterJoin[i] iterations
	// after its view first grew past the one it started in.
	killAfterJoin map[int]int64
	// abandon: a worker whose Wait fails abandons the iteration, as after
	// an error of its own, and runs it again once before its Boundary.
	abandon bool
	// cancelAt: worker i's own context for iteration cancelAt[i] ends
	// before its collectives; it stops once its Boundary fails, as a
	// trainer that was told to stop does.
	cancelAt map[int]int64
	// until, if set, ends the job once every worker of the view says,
	// at once, that what the test waits for has happened as it saw it
	// (a worker left out admitted again, say): the workers check it
	// together, with Reduce, every settleEvery iterations from iteration
	// iters on, as a trainer checks a global stopping rule. A job of
	// fixed length would have to outlast the slowest rejoin under load.
	until func(i int, runs []recoveryRun) bool
}

// settleEvery is how often, in iterations, a job with an until rule
// checks it.
const settleEvery = 10

// recoveryRun is what one worker saw.
type recoveryRun struct {
	id         string   // the worker's ID
	died       bool     // killed, from outside or at its failpoint
	redos      int      // boundaries that returned Redo
	lost       []string // the workers those named lost
	shares     [][]int  // the shares each Redo started from
	mismatched int      // iterations it ran with a wrong size
	stalled    bool     // it stalled at stallAt
	cut        bool     // it was cut off at cutAt
	cancelled  bool     // its context ended at cancelAt
	admitted   []string // the workers boundaries admitted
	abandoned  int      // iterations it abandoned after a failed Wait
	iter       int64    // the iteration it ended at
	err        error
}

const lossGlobal = 24

// run trains the job and checks that every worker that did not die ends
// at the last iteration where one process training on the same global
// batches ends. It returns what each worker saw; the joiner's is last.
func (j lossJob) run(t *testing.T) []recoveryRun {
	t.Helper()
	n := j.n
	if j.joiner {
		n++
	}
	models := make([]*toy, n)
	runs := make([]recoveryRun, n)
	var c *gyretest.Cluster
	c = gyretest.MakeCluster(t, gyretest.Options{N: j.n, Gossip: true, Transport: j.transport,
		Config: func(r int, cfg *gyre.Config) {
			cfg.GlobalBatch, cfg.PeerTimeout, cfg.QuorumTimeout = lossGlobal, 300*time.Millisecond, 20*time.Second
			cfg.Failpoint = j.failpoints[r]
			if j.collectiveTimeout > 0 {
				cfg.CollectiveTimeout = j.collectiveTimeout
			}
			if j.cutAt != nil {
				cfg.GossipProbeInterval, cfg.GossipSuspicionMult = 100*time.Millisecond, 2
			}
		},
		State: func(r int) *gyre.State {
			models[r] = newToy()
			return models[r].state()
		},
		Options: func(r int) []gyre.Option {
			return []gyre.Option{gyre.WithFailAction(func() {
				runs[r].died = true
				c.Kill(t, r)
				runtime.Goexit()
			})}
		}})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	if j.joiner {
		joiner := c.AddJoiner(t)
		runs[j.n].id = string(c.IDs[j.n])
		wg.Add(1)
		go func() {
			defer wg.Done()
			w, err := joiner.Wait(c)
			switch {
			case runs[j.n].died:
			case err != nil:
				runs[j.n].err = err
			default:
				runs[j.n].err = j.train(ctx, t, c, j.n, w, models[j.n], runs)
			}
		}()
	}
	for i := range j.n {
		runs[i].id = string(c.IDs[i])
	}
	// Not c.Run: the joiner's goroutine sets its worker in c.Workers.
	gyretest.Each(c.Workers[:j.n], func(i int, w *gyre.Worker) error {
		runs[i].err = j.train(ctx, t, c, i, w, models[i], runs)
		return nil
	})
	wg.Wait()
	end := j.iters // where every survivor ends: with an until rule, where they stopped together
	for _, run := range runs {
		if !run.died && run.err == nil && j.until != nil {
			end = run.iter
			break
		}
	}
	want := referenceToy(t, lossGlobal, end)
	for i, run := range runs {
		switch {
		case run.died:
		case run.err != nil && j.failing:
		case run.err != nil:
			t.Errorf("worker %d: %v", i, run.err)
		case run.iter != end || run.iter < j.iters:
			t.Errorf("worker %d ended at iteration %d, want %d, and at least %d", i, run.iter, end, j.iters)
		case !closeRel(models[i].theta, want.theta, 1e-12):
			t.Errorf("worker %d ended with θ[0] = %v, one process %v", i, models[i].theta[0], want.theta[0])
		}
	}
	return runs
}

// train is worker i's loop, the documented one. runs[i] is its own to
// write; it reads the others' ids only, which are set before it starts.
func (j lossJob) train(ctx context.Context, t *testing.T, c *gyretest.Cluster, i int, w *gyre.Worker, m *toy, runs []recoveryRun) error {
	run := &runs[i]
	frozen := false
	size, grewAt := w.Size(), int64(-1)
	abandonedAt := int64(-1)
	stopAt := j.iters
	if j.until != nil {
		stopAt = math.MaxInt64 // until every worker says the event is over
	}
	for w.Iter() < stopAt {
		if grewAt < 0 && w.Size() > size {
			grewAt = w.Iter()
		}
		if n, ok := j.killAfterJoin[i]; ok && grewAt >= 0 && w.Iter() >= grewAt+n {
			run.died = true
			c.Kill(t, i)
			return nil
		}
		if at, ok := j.killAt[i]; ok && w.Iter() == at {
			time.Sleep(100 * time.Millisecond)
			run.died = true
			c.Kill(t, i)
			return nil
		}
		if at, ok := j.cutAt[i]; ok && w.Iter() == at && !run.cut {
			run.cut = true
			c.Partition(t, []int{i})
			time.AfterFunc(j.cutFor, func() { c.Heal(t) })
		}
		if at, ok := j.freezeAt[i]; ok && w.Iter() == at && !frozen {
			frozen = true
			c.Freeze(t, i)
			time.AfterFunc(time.Second, func() { c.Thaw(t, i) })
		}
		time.Sleep(j.pace)
		b := w.Batch()
		time.Sleep(time.Duration(len(b.Indices)) * j.perSample[i])
		if at, ok := j.stallAt[i]; ok && b.Iter == at && !run.stalled {
			run.stalled = true
			time.Sleep(j.stall)
		}
		ictx := ctx // this iteration's context
		if at, ok := j.cancelAt[i]; ok && b.Iter == at {
			cctx, cancel := context.WithCancel(ctx)
			cancel()
			ictx, run.cancelled = cctx, true
		}
		g := m.grad(b.Indices)
		g1 := g[toyDim/2:]
		if at, ok := j.mismatchAt[i]; ok && b.Iter == at && run.mismatched < j.mismatches {
			run.mismatched++
			g1 = g1[:len(g1)-1]
		}
		w.AllReduceAsync64(ictx, "g0", g[:toyDim/2])
		w.AllReduceAsync64(ictx, "g1", g1)
		if err := w.Wait(ictx); err != nil && j.abandon && abandonedAt != b.Iter {
			t.Logf("worker %d: iteration %d: %v (abandoned and run again)", i, b.Iter, err)
			abandonedAt = b.Iter
			run.abandoned++
			if err := w.Abandon(ctx); err != nil {
				return fmt.Errorf("abandon iteration %d after a failed Wait: %w", b.Iter, err)
			}
			if w.Iter() != b.Iter {
				return fmt.Errorf("abandon iteration %d restored iteration %d, the last commit was %d", b.Iter, w.Iter(), b.Iter)
			}
			continue
		} else if err != nil {
			t.Logf("worker %d: iteration %d: %v (Boundary recovers)", i, b.Iter, err)
		} else {
			m.step(g)
			if j.until != nil && b.Iter >= j.iters && (b.Iter+1)%settleEvery == 0 {
				// Every member of the view is at this iteration: the
				// job ends after it once all say the event is over. A
				// failed Reduce (a loss) means not yet: Boundary recovers.
				over := []float64{0}
				if j.until(i, runs) {
					over[0] = 1
				}
				if err := w.Reduce(ictx, gyre.ReduceMin, over); err == nil && over[0] == 1 {
					stopAt = b.Iter + 1
				}
			}
		}
		if at, ok := j.suspectAt[i]; ok && b.Iter == at && run.redos == 0 {
			gyre.FailIteration(w, &transport.PeerError{Peer: c.IDs[(i+1)%j.n], Op: "recv", Err: transport.ErrPeerGone})
		}
		ch, err := w.Boundary(ictx)
		if err != nil && run.cancelled {
			run.died = true // it left; what it returned is the test's to check
			run.err = err
			return err
		}
		if err != nil {
			return err
		}
		if ch.Redo {
			run.redos++
			run.lost = append(run.lost, ch.Lost...)
			run.shares = append(run.shares, ch.Shares)
		}
		run.admitted = append(run.admitted, ch.Admitted...)
		if err := w.Commit(); err != nil {
			return err
		}
	}
	run.iter = w.Iter()
	return w.Leave(ctx)
}

// TestSurviveKill kills one of four gossip workers mid-run: the three
// survivors recover without it, redo what was not committed, name it
// lost, and end where one process training on the same global batches
// ends.
func TestSurviveKill(t *testing.T) {
	for _, tr := range []string{gyretest.Mem, gyretest.QUIC} {
		t.Run(tr, func(t *testing.T) {
			const victim = 2
			runs := lossJob{n: 4, iters: 60, transport: tr, killAt: map[int]int64{victim: 20}}.run(t)
			for i, run := range runs {
				if i != victim && (run.redos != 1 || !slices.Equal(run.lost, []string{runs[victim].id})) {
					t.Errorf("worker %d: %d redos naming %v lost, want 1 naming %s", i, run.redos, run.lost, runs[victim].id)
				}
			}
		})
	}
}

// TestRecoveredViewStartsFromTheModels: of 4 workers, worker 3 takes 4×
// as long per sample. When worker 0 dies, the recovered view of 3 starts
// from the shares the fitted models give, the same on every survivor,
// not from equal ones.
func TestRecoveredViewStartsFromTheModels(t *testing.T) {
	const slow = 3
	per := map[int]time.Duration{0: time.Millisecond, 1: time.Millisecond, 2: time.Millisecond, slow: 4 * time.Millisecond}
	runs := lossJob{n: 4, iters: 40, killAt: map[int]int64{0: 25}, perSample: per}.run(t)
	first := runs[1].shares
	for i := 1; i < 4; i++ {
		if len(runs[i].shares) != 1 || !slices.Equal(runs[i].shares[0], first[0]) {
			t.Fatalf("worker %d's Redos started from shares %v; worker 1's %v: want one Redo, the same", i, runs[i].shares, first)
		}
	}
	// Rates 1, 1 and 0.25 per ms: about 10.7, 10.7 and 2.7 of 24. Equal
	// shares would be 8 each.
	if s := first[0]; s[2] > 5 || s[0] < 9 || s[1] < 9 {
		t.Fatalf("the recovered view of 3 started from shares %v; want the slow worker (rank 2) near 3 of %d", s, lossGlobal)
	}
}

// TestMismatchRedoneOnce: worker 1 reduces a tensor one element short in
// iteration 20, once. Every member redoes the iteration from its last
// commit in a view of all four, naming nobody lost, and the job ends where
// one process ends. The same mismatch twice at one iteration is a
// trainer's bug: every member's Boundary then fails with the
// *IterationError that names it.
func TestMismatchRedoneOnce(t *testing.T) {
	t.Run("once", func(t *testing.T) {
		runs := lossJob{n: 4, iters: 40, mismatchAt: map[int]int64{1: 20}, mismatches: 1}.run(t)
		for i, run := range runs {
			if run.redos != 1 || len(run.lost) != 0 {
				t.Errorf("worker %d: %d redos naming %v lost; want 1 naming nobody", i, run.redos, run.lost)
			}
		}
	})
	t.Run("twice", func(t *testing.T) {
		runs := lossJob{n: 4, iters: 40, mismatchAt: map[int]int64{1: 20}, mismatches: 2, failing: true}.run(t)
		for i, run := range runs {
			var ie *gyre.IterationError
			if !errors.As(run.err, &ie) || ie.Iter != 20 || !slices.Contains(ie.Reasons, "mismatch") {
				t.Errorf("worker %d: %v; want iteration 20 failed with a mismatch", i, run.err)
			}
			if run.redos != 1 {
				t.Errorf("worker %d: %d redos; want 1, before the second mismatch", i, run.redos)
			}
		}
	})
}

// TestAbandonAfterAFailedCollective: the workers whose Wait fails treat
// it as an error of their own: they abandon the iteration and run it
// again. In a gossip job Abandon restores the commit, the collectives run
// again fail at once, and the Boundary recovers as it would have: for a
// first mismatch (everyone alive) and for a kill.
func TestAbandonAfterAFailedCollective(t *testing.T) {
	t.Run("mismatch", func(t *testing.T) {
		runs := lossJob{n: 4, iters: 40, mismatchAt: map[int]int64{1: 20}, mismatches: 1, abandon: true}.run(t)
		for i, run := range runs {
			if run.abandoned != 1 || run.redos != 1 {
				t.Errorf("worker %d abandoned %d iterations and redid %d; want 1 and 1", i, run.abandoned, run.redos)
			}
		}
	})
	t.Run("kill", func(t *testing.T) {
		const victim = 2
		runs := lossJob{n: 4, iters: 40, killAt: map[int]int64{victim: 20}, abandon: true}.run(t)
		abandoned := 0
		for i, run := range runs {
			if i != victim && run.redos != 1 {
				t.Errorf("worker %d redid %d iterations; want 1", i, run.redos)
			}
			abandoned += run.abandoned
		}
		if abandoned == 0 {
			t.Error("no survivor's Wait failed, so none abandoned: the test tested nothing")
		}
	})
}

// TestOwnCancellationLeaves: worker 1's own context ends during its
// iteration 20. Its Boundary returns the context's error and closes it;
// the others recover without it at once, naming it lost, instead of
// waiting out CollectiveTimeout for its record, and end where one
// process ends.
func TestOwnCancellationLeaves(t *testing.T) {
	const quitter = 1
	runs := lossJob{n: 4, iters: 40, cancelAt: map[int]int64{quitter: 20}}.run(t)
	if err := runs[quitter].err; !errors.Is(err, context.Canceled) {
		t.Errorf("the cancelled worker's Boundary returned %v; want context.Canceled", err)
	}
	for i, run := range runs {
		if i != quitter && (run.redos != 1 || !slices.Equal(run.lost, []string{runs[quitter].id})) {
			t.Errorf("worker %d: %d redos naming %v lost; want 1 naming the cancelled worker", i, run.redos, run.lost)
		}
	}
}

// TestLateWorkerIsExcluded: worker 2 of 4 stalls past CollectiveTimeout
// before its collectives. The others give up on it and recover without
// it, naming it lost; it rejoins as a new member once it gets there, and
// all four end where one process ends. A short stall reaches the vote
// while the others still wait in it, and the vote's table shows it late;
// a long one misses the vote, which times out, and the recovery's round
// leaves it out as it never reports.
func TestLateWorkerIsExcluded(t *testing.T) {
	const late = 2
	for _, tc := range []struct {
		name  string
		stall time.Duration
	}{{"in the vote", 1500 * time.Millisecond}, {"after the vote", 4 * time.Second}} {
		t.Run(tc.name, func(t *testing.T) {
			runs := lossJob{n: 4, iters: 40, pace: 20 * time.Millisecond, stallAt: map[int]int64{late: 20}, stall: tc.stall,
				collectiveTimeout: time.Second, until: backIn(late)}.run(t)
			checkLeftOutAndBack(t, runs, late)
		})
	}
}

// TestCutOffWorkerRejoins: worker 3 of 4 is cut off, data and gossip,
// for 2 s. The others recover without it and name it lost; on each side
// gossip declares the other dead. After the heal it learns it was left
// out, joins gossip again, and is admitted as a new member; all four end
// where one process ends.
func TestCutOffWorkerRejoins(t *testing.T) {
	const cut = 3
	runs := lossJob{n: 4, iters: 40, pace: 20 * time.Millisecond, cutAt: map[int]int64{cut: 20}, cutFor: 2 * time.Second,
		until: backIn(cut)}.run(t)
	checkLeftOutAndBack(t, runs, cut)
}

// backIn is the until rule of a job that waits for worker out to be
// admitted again: every worker has seen it admitted, or is it.
func backIn(out int) func(i int, runs []recoveryRun) bool {
	return func(i int, runs []recoveryRun) bool {
		return i == out || slices.Contains(runs[i].admitted, runs[out].id)
	}
}

// recovered is the until rule of a job that waits for a recovery: every
// worker has redone an iteration.
func recovered(i int, runs []recoveryRun) bool { return runs[i].redos > 0 }

// checkLeftOutAndBack checks that every other worker's Redos named worker
// out lost, once, and that out was admitted again as itself, once.
func checkLeftOutAndBack(t *testing.T, runs []recoveryRun, out int) {
	t.Helper()
	for i, run := range runs {
		switch {
		case i == out && !slices.Equal(run.admitted, []string{run.id}):
			t.Errorf("worker %d (left out) was admitted as %v; want itself once, as a new member", i, run.admitted)
		case i != out && !slices.Equal(run.lost, []string{runs[out].id}):
			t.Errorf("worker %d: its Redos name %v lost; want worker %d", i, run.lost, out)
		}
	}
}

// TestJoinerVotesAfterItsFirstBoundary: a job of 2 admits a third worker.
// The view that admits it counts it for no majority; its first boundary
// moves to a view in which it votes. Then worker 1 dies: worker 0 and the
// joiner are 2 of 3 voters, a majority, and go on to the end. Without the
// promotion they would be 1 of 2, and end with ErrNoQuorum.
func TestJoinerVotesAfterItsFirstBoundary(t *testing.T) {
	runs := lossJob{n: 2, iters: 40, joiner: true, pace: 20 * time.Millisecond, killAfterJoin: map[int]int64{1: 5},
		until: recovered}.run(t)
	for _, i := range []int{0, 2} {
		if !slices.Equal(runs[i].lost, []string{runs[1].id}) {
			t.Errorf("worker %d: its Redos name %v lost; want worker 1", i, runs[i].lost)
		}
	}
}

// TestRecoverWithNobodyGone: a collective fails with a lost peer while
// every member is there and heard (a stream broke, not a connection).
// Every member judges the same table and recovers; with no evidence
// against anyone, they agree on a view of all four at the next epoch,
// redo the iteration, and end where one process ends, well before
// QuorumTimeout.
func TestRecoverWithNobodyGone(t *testing.T) {
	start := time.Now()
	runs := lossJob{n: 4, iters: 60, suspectAt: map[int]int64{1: 20}}.run(t)
	for i, run := range runs {
		if run.redos != 1 || len(run.lost) != 0 {
			t.Errorf("worker %d: %d redos naming %v lost; want one naming nobody", i, run.redos, run.lost)
		}
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the job took %v: the recovery waited for a timeout", took)
	}
}

// TestFrozenWorkerRejoins stops one of four gossip workers for longer
// than PeerTimeout, as SIGSTOP does, then resumes it: the others go on
// as three, the resumed worker learns it was left out and rejoins as a
// new member, and all four end where one process ends.
func TestFrozenWorkerRejoins(t *testing.T) {
	const victim = 2
	runs := lossJob{n: 4, iters: 40, freezeAt: map[int]int64{victim: 20}, pace: 10 * time.Millisecond, until: backIn(victim)}.run(t)
	for i, run := range runs {
		switch {
		case i == victim && (run.redos != 1 || !slices.Equal(run.admitted, []string{run.id})):
			t.Errorf("the resumed worker: %d redos, admitted %v; want one redo that admitted it", run.redos, run.admitted)
		case i != victim && (run.redos != 1 || !slices.Equal(run.lost, []string{runs[victim].id}) || !slices.Equal(run.admitted, run.lost)):
			t.Errorf("worker %d: %d redos naming %v lost, admitted %v; want one redo without worker %d, who was admitted again",
				i, run.redos, run.lost, run.admitted, victim)
		}
	}
}

// TestSurviveFailpoints: workers die at each step of the protocols that
// a kill from outside could hardly aim at, or are killed one after
// another, or the seed dies; the job goes on.
func TestSurviveFailpoints(t *testing.T) {
	for _, tc := range []struct {
		name string
		job  lossJob
		dead []int // the workers that must have died
	}{
		// Worker 3 is killed; worker 1 dies as it starts the view that
		// recovery decided, so its peers must not wait to connect to it.
		{"installer", lossJob{n: 5, iters: 60, killAt: map[int]int64{3: 20}, failpoints: map[int]string{1: "install"}}, []int{1, 3}},
		// During the boundary vote: its peers are in the allgather.
		{"vote", lossJob{n: 4, iters: 60, failpoints: map[int]string{2: "vote@20"}}, []int{2}},
		// Worker 3 is killed; worker 0 coordinates the recovery and dies
		// once it has proposed. Five workers survive two losses in a row.
		{"coordinator", lossJob{n: 5, iters: 60, killAt: map[int]int64{3: 20}, failpoints: map[int]string{0: "propose"}}, []int{0, 3}},
		// Worker 2 is killed at the start of an iteration, so every
		// survivor holds the same commit and worker 0, the lowest rank,
		// sends it; it dies after its first tensor.
		{"holder", lossJob{n: 4, iters: 60, killAt: map[int]int64{2: 20}, failpoints: map[int]string{0: "send-state@1"}}, []int{0, 2}},
		// The seed, through which every worker joined, dies.
		{"seed", lossJob{n: 4, iters: 60, killAt: map[int]int64{0: 20}}, []int{0}},
		// Two kills in a row: five workers down to three.
		{"two-in-a-row", lossJob{n: 5, iters: 80, killAt: map[int]int64{1: 20, 3: 40}}, []int{1, 3}},
		// A joiner dies while it takes the job's state. The job runs
		// until every member has recovered from it, however long the
		// joiner's admission takes under load; and in the next case,
		// until the joiner is admitted again.
		{"joiner", lossJob{n: 4, iters: 40, joiner: true, failpoints: map[int]string{4: "recv-state"}, pace: 20 * time.Millisecond,
			until: recovered}, []int{4}},
		// Worker 0 dies while it sends the job's state to a joiner; the
		// joiner goes back to pending and is admitted again.
		{"sender-to-joiner", lossJob{n: 4, iters: 40, joiner: true, failpoints: map[int]string{0: "send-state@1"}, pace: 20 * time.Millisecond,
			until: backIn(4)}, []int{0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runs := tc.job.run(t)
			for _, d := range tc.dead {
				if !runs[d].died {
					t.Errorf("worker %d did not die: the failpoint was never reached", d)
				}
			}
			// Each survivor's Redos name every dead member of its first
			// view once, and nobody else but a joiner sent back.
			for i, run := range runs {
				if run.died || i >= tc.job.n {
					continue
				}
				named := map[string]int{}
				for _, id := range run.lost {
					named[id]++
				}
				for k, r := range runs {
					switch {
					case r.died && k < tc.job.n && named[r.id] != 1:
						t.Errorf("worker %d: its Redos name %v lost, %d times worker %d; want once", i, run.lost, named[r.id], k)
					case !r.died && k < tc.job.n && named[r.id] > 0:
						t.Errorf("worker %d: its Redos name %v lost, worker %d among them, which did not die", i, run.lost, k)
					}
				}
			}
		})
	}
}

// TestTwoWorkersEndWithoutQuorum: a majority of 2 is both, so when one
// of 2 workers dies the survivor's Boundary waits QuorumTimeout, then
// returns ErrNoQuorum.
func TestTwoWorkersEndWithoutQuorum(t *testing.T) {
	const quorum = time.Second
	c := gyretest.MakeCluster(t, gyretest.Options{N: 2, Gossip: true,
		Config: func(r int, cfg *gyre.Config) {
			cfg.GlobalBatch, cfg.PeerTimeout, cfg.QuorumTimeout = lossGlobal, 300*time.Millisecond, quorum
		}})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	w := c.Workers[0]
	for range 3 {
		errs := c.Run(func(_ int, w *gyre.Worker) error {
			_, err := w.Boundary(ctx)
			return errors.Join(err, w.Commit())
		})
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
	}
	c.Kill(t, 1)
	start := time.Now()
	_, err := w.Boundary(ctx)
	took := time.Since(start)
	if !errors.Is(err, gyre.ErrNoQuorum) {
		t.Fatalf("the survivor's Boundary returned %v; want ErrNoQuorum", err)
	}
	if took < quorum || took > quorum+5*time.Second {
		t.Errorf("the survivor gave up after %v; want QuorumTimeout, %v, plus detection", took, quorum)
	}
	t.Logf("after %v: %v", took.Round(time.Millisecond), err)
}
