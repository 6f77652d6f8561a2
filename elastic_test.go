package gyre_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/gyretest"
	"github.com/gyre-ml/gyre/transport/transporttest"
)

// elasticRun is what one worker saw while training the toy model in an
// elastic job.
type elasticRun struct {
	left               bool     // it left at its own request
	admitted, departed []string // workers other members reported joining and leaving
	last               int64    // its last completed iteration
	epoch              uint64   // its final view's epoch
	leaveAt            int64    // the iteration at which it asked to leave
}

// trainElastic trains the toy on w until iteration iters, then leaves with
// the rest. Until it sees a worker admitted it paces its iterations, so
// that gossip has time to converge; with leave set, it asks to leave a few
// iterations after that. With settled, iters is the least: the job goes on
// until every worker of the view says, together, that it saw what the test
// waits for (checked with Reduce every 10 iterations), however long that
// takes under load.
func trainElastic(ctx context.Context, w *gyre.Worker, m *toy, iters int64, leave bool, settled func(elasticRun) bool) (elasticRun, error) {
	var run elasticRun
	leaveAt := int64(-1)
	stopAt := iters
	if settled != nil {
		stopAt = math.MaxInt64
	}
	for w.Iter() < stopAt {
		if len(run.admitted) == 0 {
			time.Sleep(10 * time.Millisecond)
		} else if leave && leaveAt < 0 {
			leaveAt = w.Iter() + 3
		}
		if w.Iter() == leaveAt {
			w.RequestLeave()
		}
		b := w.Batch()
		g := m.grad(b.Indices)
		w.AllReduceAsync64(ctx, "g0", g[:toyDim/2])
		w.AllReduceAsync64(ctx, "g1", g[toyDim/2:])
		if err := w.Wait(ctx); err != nil {
			return run, err
		}
		m.step(g)
		if settled != nil && b.Iter+1 >= iters && (b.Iter+1)%10 == 0 {
			over := []float64{0}
			if settled(run) {
				over[0] = 1
			}
			if err := w.Reduce(ctx, gyre.ReduceMin, over); err != nil {
				return run, err
			}
			if over[0] == 1 {
				stopAt = b.Iter + 1
			}
		}
		ch, err := w.Boundary(ctx)
		if err != nil {
			return run, err
		}
		if ch.Redo || ch.Iter != b.Iter+1 {
			return run, fmt.Errorf("boundary of iteration %d moved to %d (redo %v)", b.Iter, ch.Iter, ch.Redo)
		}
		run.last = b.Iter
		run.admitted = append(run.admitted, ch.Admitted...)
		run.departed = append(run.departed, ch.Departed...)
		if ch.Left {
			run.left, run.leaveAt = true, leaveAt
			return run, nil
		}
		run.epoch = ch.View.Epoch
		if err := w.Commit(); err != nil {
			return run, err
		}
	}
	run.leaveAt = leaveAt
	return run, w.Leave(ctx)
}

// referenceToy trains the toy in one process over the same global batches.
func referenceToy(t *testing.T, global int, iters int64) *toy {
	t.Helper()
	s, err := gyre.NewSampler(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	m := newToy()
	for k := range iters {
		m.step(m.grad(s.Indices(nil, k*int64(global), int64(global))))
	}
	return m
}

func closeRel(a, b []float64, tol float64) bool {
	for i := range a {
		if math.Abs(a[i]-b[i]) > tol*math.Max(math.Abs(b[i]), 1e-300) {
			return false
		}
	}
	return len(a) == len(b)
}

// TestGossipJoinAndLeave starts three workers from one seed over gossip,
// adds a fourth at run time, and lets one ask to leave: the joiner is
// admitted at a boundary, the leaver leaves with no iteration redone, and
// every worker that stays ends where one process training on the same
// global batches ends.
func TestGossipJoinAndLeave(t *testing.T) {
	t.Parallel()
	for _, tr := range []string{gyretest.Mem, gyretest.QUIC} {
		t.Run(tr, func(t *testing.T) { testGossipJoinAndLeave(t, tr) })
	}
}

func testGossipJoinAndLeave(t *testing.T, tr string) {
	const global, iters, leaver = 24, 20, 1
	models := make([]*toy, 4)
	c := gyretest.MakeCluster(t, gyretest.Options{N: 3, Transport: tr, Gossip: true,
		Config: func(r int, c *gyre.Config) { c.GlobalBatch = global },
		State: func(r int) *gyre.State {
			models[r] = newToy()
			models[r].theta[0] = float64(r) // rank 0's state wins at Join
			return models[r].state()
		}})
	epoch := c.Workers[0].View().Epoch
	var ranks []int
	for i, w := range c.Workers {
		if v := w.View(); v.Epoch != epoch || len(v.Members) != 3 {
			t.Fatalf("worker %d: view %+v, want 3 members at epoch %d", i, v, epoch)
		}
		ranks = append(ranks, w.Rank())
	}
	slices.Sort(ranks)
	if !slices.Equal(ranks, []int{0, 1, 2}) {
		t.Fatalf("ranks %v", ranks)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	joiner := c.AddJoiner(t)
	runs := make([]elasticRun, 4)
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for i, w := range c.Workers[:3] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runs[i], errs[i] = trainElastic(ctx, w, models[i], iters, i == leaver, func(r elasticRun) bool {
				return len(r.admitted) > 0 && len(r.departed) > 0 // the joiner came and the leaver went
			})
		}()
	}
	jw, err := joiner.Wait(c)
	if err != nil {
		t.Fatalf("joiner: %v", err)
	}
	runs[3], errs[3] = trainElastic(ctx, jw, models[3], iters, false, func(r elasticRun) bool { return len(r.departed) > 0 })
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("workers: %v", errs)
	}
	end := runs[0].last + 1 // where the workers stopped together
	want := referenceToy(t, global, end)
	for i, r := range runs {
		switch {
		case i == leaver:
			if !r.left || r.last != r.leaveAt {
				t.Fatalf("the leaver: left %v after iteration %d, want after %d", r.left, r.last, r.leaveAt)
			}
		case r.left || r.last != end-1 || end < iters:
			t.Fatalf("worker %d: left %v, last iteration %d; want %d, past %d", i, r.left, r.last, end-1, iters-1)
		case !closeRel(models[i].theta, want.theta, 1e-12):
			t.Fatalf("worker %d: θ %v, one process %v", i, models[i].theta, want.theta)
		case i < 3 && (!slices.Contains(r.admitted, string(c.IDs[3])) || !slices.Contains(r.departed, string(c.IDs[leaver]))):
			t.Fatalf("worker %d saw admitted %v, departed %v", i, r.admitted, r.departed)
		}
	}
	gyretest.EnsureSameState(t, c.States[0], c.States[2], c.States[3])
	if runs[0].epoch != runs[3].epoch || runs[0].epoch < epoch+2 {
		t.Fatalf("final epochs %d and %d, from %d", runs[0].epoch, runs[3].epoch, epoch)
	}
}

// TestComebackAtNewAddress: a worker leaves, and another process joins
// under the same name (--name) at new gossip and data addresses. It is
// admitted as a joiner, the members dial it at its new address, and every
// worker ends where one process would. (memberlist lets a left node's name
// be taken at once; a dead one's needs DeadNodeReclaimTime, which
// membership sets, for the recovery issue's restarts.)
func TestComebackAtNewAddress(t *testing.T) {
	t.Parallel()
	const global, iters, leaver = 24, 20, 1
	models := make([]*toy, 4)
	c := gyretest.MakeCluster(t, gyretest.Options{N: 3, Transport: gyretest.QUIC, Gossip: true,
		Config: func(r int, c *gyre.Config) {
			c.GlobalBatch = global
			c.Name = fmt.Sprintf("w%d", r)
			if r == 3 { // the joiner takes the leaver's name
				c.Name = fmt.Sprintf("w%d", leaver)
			}
		},
		State: func(r int) *gyre.State {
			models[r] = newToy()
			return models[r].state()
		}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := c.Workers[leaver].View().Members[c.Workers[leaver].Rank()]

	// The leaver asks at once and is gone after the next boundary.
	var lerr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		w := c.Workers[leaver]
		w.RequestLeave()
		for {
			b := w.Batch()
			g := models[leaver].grad(b.Indices)
			w.AllReduceAsync64(ctx, "g0", g[:toyDim/2])
			w.AllReduceAsync64(ctx, "g1", g[toyDim/2:])
			if lerr = w.Wait(ctx); lerr != nil {
				return
			}
			models[leaver].step(g)
			ch, err := w.Boundary(ctx)
			if lerr = err; err != nil || ch.Left {
				return
			}
			if lerr = w.Commit(); lerr != nil {
				return
			}
		}
	}()
	runs := make([]elasticRun, 4)
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for _, i := range []int{0, 2} {
		wg.Go(func() {
			runs[i], errs[i] = trainElastic(ctx, c.Workers[i], models[i], iters, false, func(r elasticRun) bool {
				return slices.Contains(r.admitted, name) // the worker back under the leaver's name
			})
		})
	}
	<-done
	if lerr != nil {
		t.Fatalf("the leaver: %v", lerr)
	}
	joiner := c.AddJoiner(t, c.GossipAddrs[0])
	jw, err := joiner.Wait(c)
	if err != nil {
		t.Fatalf("the worker back under %s: %v", name, err)
	}
	if now := jw.View().Members[jw.Rank()]; now != name || c.IDs[3] == c.IDs[leaver] {
		t.Fatalf("the joiner is %s at %s, want %s at an address other than %s", now, c.IDs[3], name, c.IDs[leaver])
	}
	runs[3], errs[3] = trainElastic(ctx, jw, models[3], iters, false, func(elasticRun) bool { return true })
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("workers: %v", errs)
	}
	want := referenceToy(t, global, runs[0].last+1)
	for _, i := range []int{0, 2, 3} {
		if runs[i].last != runs[0].last {
			t.Fatalf("worker %d stopped after iteration %d, worker 0 after %d", i, runs[i].last, runs[0].last)
		}
		if !closeRel(models[i].theta, want.theta, 1e-12) {
			t.Fatalf("worker %d: θ %v, one process %v", i, models[i].theta, want.theta)
		}
	}
	for _, i := range []int{0, 2} {
		if !slices.Contains(runs[i].admitted, name) {
			t.Fatalf("worker %d saw admitted %v, want %s", i, runs[i].admitted, name)
		}
	}
	gyretest.EnsureSameState(t, c.States[0], c.States[2], c.States[3])
}

// TestSharedSeedsStartOneJob: three workers started together with the
// same seed list, naming all three, form one job: the first seed's
// worker starts it, and the others, whichever they reach first, are
// admitted into it. Two jobs would leave some Join waiting for
// MinWorkers until its deadline.
func TestSharedSeedsStartOneJob(t *testing.T) {
	logs := make([]*transporttest.LogBuffer, 3)
	c := gyretest.MakeCluster(t, gyretest.Options{N: 3, Transport: gyretest.QUIC, Gossip: true, SharedSeeds: true,
		Config: func(r int, c *gyre.Config) {
			logs[r] = new(transporttest.LogBuffer)
			c.Logger = new(zerolog.New(logs[r]))
		}})
	epoch := c.Workers[0].View().Epoch
	for i, w := range c.Workers {
		if v := w.View(); v.Epoch != epoch || len(v.Members) != 3 {
			t.Fatalf("worker %d: view %+v, want the 3 workers at epoch %d", i, v, epoch)
		}
		if started := strings.Contains(logs[i].String(), "started a new job"); started != (i == 0) {
			t.Errorf("worker %d started a job: %v; want only worker 0, the first seed:\n%s", i, started, logs[i].String())
		}
	}
}

// TestStarterWaitsForASilentSeed: the first seed, whose other seed
// accepts connections but never answers (a hung host, which may be a
// member of a running job), does not start the job at once: it tries
// again until its patience runs out, then starts.
func TestStarterWaitsForASilentSeed(t *testing.T) {
	const patience = 2 * time.Second
	defer gyre.SetStarterPatience(patience)()
	hung, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hung.Close() })
	go func() { // accept, and say nothing
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := hung.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	self := probe.Addr().String()
	probe.Close()
	var logs transporttest.LogBuffer
	cfg := gyre.Config{Listen: self, DataAddr: "127.0.0.1:0", Seeds: []string{self, hung.Addr().String()},
		Key: gyretest.Key(t), GossipTiming: gyre.GossipLocal, Transport: gyre.TransportQUIC, Logger: new(zerolog.New(&logs))}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	w, err := gyre.Join(ctx, cfg, gyre.WithState(gyre.NewState().Float64("x", make([]float64, 4))))
	took := time.Since(start)
	if err != nil {
		t.Fatalf("Join: %v\n%s", err, logs.String())
	}
	defer w.Close()
	if took < patience {
		t.Errorf("the starter started the job after %v, before its patience (%v) ran out", took, patience)
	}
	for _, want := range []string{"waiting for the seeds that do not answer", "started a new job"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the starter's log does not say %q:\n%s", want, logs.String())
		}
	}
	if v := w.View(); len(v.Members) != 1 {
		t.Errorf("view %+v, want this worker alone", v)
	}
}
