package handoff_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gomlx/gomlx/backends/simplego"
	mlctx "github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/datasets/mnist"
	"github.com/gyre-ml/gyre/examples/gomlx/handoff"
	"github.com/gyre-ml/gyre/examples/gomlx/mnistmlp"
	"github.com/gyre-ml/gyre/gyretest"
)

// global is the tests' global batch: small, so that a step takes tens of
// milliseconds on the pure-Go backend.
const global = 32

var (
	loadOnce  sync.Once
	trainSet  *mnist.Set
	errLoaded error
)

func trainData(tb testing.TB) *mnist.Set {
	loadOnce.Do(func() { trainSet, _, errLoaded = mnist.Load("") })
	if errLoaded != nil {
		tb.Fatal(errLoaded)
	}
	return trainSet
}

// worker is one rank's GoMLX model and hand-off.
type worker struct {
	ctx     *mlctx.Context
	tr      *handoff.Trainer
	state   *gyre.State
	set     *mnist.Set
	sampler *mnistmlp.Sampler
	batches map[int]*mnistmlp.Batch
}

func newWorker(tb testing.TB, bucket int) *worker {
	backend, err := simplego.New("")
	if err != nil {
		tb.Fatal(err)
	}
	ctx := mlctx.New()
	if err := ctx.SetRNGStateFromSeed(1); err != nil {
		tb.Fatal(err)
	}
	tr, err := handoff.New(backend, ctx, mnistmlp.Loss, optimizers.Adam().Done(), handoff.Options{Bucket: bucket})
	if err != nil {
		tb.Fatal(err)
	}
	w := &worker{ctx: ctx, tr: tr, state: gyre.NewState(), set: trainData(tb),
		sampler: mnistmlp.NewSampler(trainData(tb), 1), batches: map[int]*mnistmlp.Batch{}}
	example, err := w.batch(global, nil)
	if err != nil {
		tb.Fatal(err)
	}
	if err := tr.Register(w.state, example.Images, example.Labels); err != nil {
		tb.Fatal(err)
	}
	return w
}

// batch fills the batch of rows rows with samples idx. Like every helper
// the workers' goroutines call, it returns its error: t.Fatal would end
// only that goroutine, and the test would hang.
func (w *worker) batch(rows int, idx []int64) (*mnistmlp.Batch, error) {
	b := w.batches[rows]
	if b == nil {
		b = mnistmlp.NewBatch(rows)
		w.batches[rows] = b
	}
	return b, b.Fill(w.set, w.sampler, idx)
}

// step runs one iteration's step over gw's batch.
func (w *worker) step(ctx context.Context, gw *gyre.Worker) error {
	b := gw.Batch()
	in, err := w.batch(w.tr.Bucketed(b.Share), b.Indices)
	if err != nil {
		return err
	}
	_, err = w.tr.Step(ctx, gw, b.Share, in.Images, in.Labels)
	return err
}

// finish ends an iteration: Boundary, Load after a Redo, Commit.
func (w *worker) finish(ctx context.Context, gw *gyre.Worker) (gyre.Change, error) {
	change, err := gw.Boundary(ctx)
	if err != nil {
		return change, err
	}
	if change.Redo {
		if err := w.tr.Load(); err != nil {
			return change, err
		}
	}
	return change, gw.Commit()
}

// variables is every GoMLX variable's bytes, by scoped name: what the
// optimizer and the model hold, read from GoMLX, not from the mirror.
func (w *worker) variables() (map[string][]byte, error) {
	out := map[string][]byte{}
	for v := range w.ctx.IterVariables() {
		val, err := v.Value()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", v.ScopeAndName(), err)
		}
		if err := val.ConstBytes(func(b []byte) { out[v.ScopeAndName()] = bytes.Clone(b) }); err != nil {
			return nil, fmt.Errorf("%s: %w", v.ScopeAndName(), err)
		}
	}
	return out, nil
}

// mustVariables is variables for the test's own goroutine.
func (w *worker) mustVariables(tb testing.TB) map[string][]byte {
	tb.Helper()
	vars, err := w.variables()
	if err != nil {
		tb.Fatal(err)
	}
	return vars
}

// differ names the variables whose bytes differ.
func differ(a, b map[string][]byte) []string {
	var names []string
	for name, x := range a {
		if !bytes.Equal(x, b[name]) {
			names = append(names, name)
		}
	}
	for name := range b {
		if _, ok := a[name]; !ok {
			names = append(names, name)
		}
	}
	return names
}

func timeout(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestTwoWorkersOneDigest trains 2 workers over real QUIC on loopback with
// LB-BSP and exact shapes, and checks that they end with one state.
func TestTwoWorkersOneDigest(t *testing.T) {
	ws := make([]*worker, 2)
	c := gyretest.MakeCluster(t, gyretest.Options{N: 2, Transport: gyretest.QUIC,
		Config: func(r int, cfg *gyre.Config) { cfg.GlobalBatch = global },
		State: func(r int) *gyre.State {
			ws[r] = newWorker(t, 1)
			return ws[r].state
		}})
	ctx := timeout(t)
	errs := c.Run(func(r int, gw *gyre.Worker) error {
		if err := ws[r].tr.Load(); err != nil {
			return err
		}
		for gw.Iter() < 12 {
			if err := ws[r].step(ctx, gw); err != nil {
				return err
			}
			if _, err := ws[r].finish(ctx, gw); err != nil {
				return err
			}
		}
		return gw.Leave(ctx)
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	c.EnsureSameState(t)
	if d := differ(ws[0].mustVariables(t), ws[1].mustVariables(t)); len(d) > 0 {
		t.Fatalf("the workers' GoMLX variables differ: %v", d)
	}
	step := ws[0].mustVariables(t)["/AdamOptimizer/global_step"]
	if len(step) != 8 || step[0] != 12 {
		t.Fatalf("Adam's step counter holds %v after 12 steps", step)
	}
}

// TestRedoRestoresTheOptimizer kills one of 3 workers after every worker
// applied iteration 4's update, before its boundary: the survivors redo
// iteration 4 from the commit, and their parameters, Adam's moments and
// its step counter must be the commit's, bit for bit.
func TestRedoRestoresTheOptimizer(t *testing.T) {
	const killAt = 4
	ws := make([]*worker, 3)
	c := gyretest.MakeCluster(t, gyretest.Options{N: 3, Gossip: true,
		Config: func(r int, cfg *gyre.Config) {
			cfg.GlobalBatch, cfg.PeerTimeout, cfg.QuorumTimeout = global, time.Second, 20*time.Second
		},
		State: func(r int) *gyre.State {
			ws[r] = newWorker(t, 8)
			return ws[r].state
		}})
	ctx := timeout(t)
	var mu sync.Mutex
	checked := 0
	errs := c.Run(func(r int, gw *gyre.Worker) error {
		w := ws[r]
		if err := w.tr.Load(); err != nil {
			return err
		}
		var committed map[string][]byte
		for gw.Iter() < killAt+3 {
			iter := gw.Iter()
			if err := w.step(ctx, gw); err != nil {
				return fmt.Errorf("iteration %d: %w", iter, err)
			}
			if iter == killAt && r == 2 {
				c.Kill(t, r) // after its update, before its boundary
				return nil
			}
			stepped, err := w.variables()
			if err != nil {
				return err
			}
			change, err := w.finish(ctx, gw)
			if err != nil {
				return err
			}
			if change.Redo {
				if change.Iter != killAt {
					return fmt.Errorf("redo from iteration %d, want %d", change.Iter, killAt)
				}
				if len(differ(stepped, committed)) == 0 {
					return errors.New("the step before the redo changed nothing: the test checks nothing")
				}
				restored, err := w.variables()
				if err != nil {
					return err
				}
				if d := differ(restored, committed); len(d) > 0 {
					return fmt.Errorf("after the redo, these variables differ from the commit: %v", d)
				}
				mu.Lock()
				checked++
				mu.Unlock()
			}
			if committed, err = w.variables(); err != nil {
				return err
			}
		}
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if checked != 2 {
		t.Fatalf("%d survivors redid the iteration, want 2", checked)
	}
}

// TestJoinerTakesTheOptimizer admits a third worker into a 2-worker job
// and checks that it starts from the job's variables, Adam's step counter
// and moments included, then steps in agreement with the others (each
// boundary compares the workers' state digests).
func TestJoinerTakesTheOptimizer(t *testing.T) {
	ws := make([]*worker, 3)
	c := gyretest.MakeCluster(t, gyretest.Options{N: 2, Gossip: true,
		Config: func(r int, cfg *gyre.Config) {
			cfg.GlobalBatch, cfg.PeerTimeout, cfg.QuorumTimeout = global, time.Second, 20*time.Second
		},
		State: func(r int) *gyre.State {
			ws[r] = newWorker(t, 8)
			return ws[r].state
		}})
	ctx, cancel := context.WithCancel(timeout(t))
	defer cancel()
	var mu sync.Mutex
	commits := map[int64]map[string][]byte{} // rank 0's, by the next iteration
	starters := slices.Clone(c.Workers)      // Wait writes the joiner into c.Workers
	joiner := c.AddJoiner(t)
	joined := make(chan error, 1)
	go func() {
		err := func() error {
			gw, err := joiner.Wait(c)
			if err != nil {
				return err
			}
			w := ws[2]
			if err := w.tr.Load(); err != nil {
				return err
			}
			// Rank 0 records its commit after the boundary that admitted
			// this worker, and cannot pass the next one without it.
			var want map[string][]byte
			for want == nil {
				mu.Lock()
				want = commits[gw.Iter()]
				mu.Unlock()
				select {
				case <-ctx.Done():
					return fmt.Errorf("no commit of rank 0 for iteration %d: %w", gw.Iter(), ctx.Err())
				case <-time.After(5 * time.Millisecond):
				}
			}
			got, err := w.variables()
			if err != nil {
				return err
			}
			if d := differ(got, want); len(d) > 0 {
				return fmt.Errorf("the joiner's variables at iteration %d differ from the job's: %v", gw.Iter(), d)
			}
			if step := got["/AdamOptimizer/global_step"]; step[0] == 0 {
				return fmt.Errorf("the joiner's Adam step counter is %v at iteration %d", step, gw.Iter())
			}
			return steps(ctx, w, gw, 3)
		}()
		if err != nil {
			cancel() // the others would wait for it
		}
		joined <- err
	}()
	errs := gyretest.Each(starters, func(r int, gw *gyre.Worker) error {
		w := ws[r]
		if err := w.tr.Load(); err != nil {
			return err
		}
		for gw.Size() < 3 {
			if err := steps(ctx, w, gw, 1); err != nil {
				return err
			}
			if r == 0 {
				vars, err := w.variables()
				if err != nil {
					return err
				}
				mu.Lock()
				commits[gw.Iter()] = vars
				mu.Unlock()
			}
		}
		return steps(ctx, w, gw, 3) // with the joiner
	})
	if err := errors.Join(append(errs, <-joined)...); err != nil {
		t.Fatal(err)
	}
	c.EnsureSameState(t)
}

// steps runs n whole iterations.
func steps(ctx context.Context, w *worker, gw *gyre.Worker, n int) error {
	for range n {
		if err := w.step(ctx, gw); err != nil {
			return err
		}
		if _, err := w.finish(ctx, gw); err != nil {
			return err
		}
	}
	return nil
}

// TestCheckpointRestartContinues stops a 2-worker job with static shares
// at iteration 4 and starts it again from its checkpoint: at iteration 8
// its variables, the optimizer's included, are those of a run that never
// stopped, bit for bit.
func TestCheckpointRestartContinues(t *testing.T) {
	const stopAt, end = 4, 8
	run := func(dir string, resume bool, iters int64) (*worker, error) {
		ws := make([]*worker, 2)
		c := gyretest.MakeCluster(t, gyretest.Options{N: 2,
			Config: func(r int, cfg *gyre.Config) {
				cfg.GlobalBatch, cfg.Balance = global, gyre.BalanceStatic
				if dir != "" {
					cfg.CheckpointDir, cfg.CheckpointEvery = dir, 2
				}
			},
			State: func(r int) *gyre.State {
				ws[r] = newWorker(t, 8)
				return ws[r].state
			}})
		ctx := timeout(t)
		errs := c.Run(func(r int, gw *gyre.Worker) error {
			if res, ok := gw.Resumed(); ok != resume || (resume && res.Iter != stopAt) {
				return fmt.Errorf("rank %d resumed %v from %+v, want resumed %v at %d", r, ok, res, resume, stopAt)
			}
			if err := ws[r].tr.Load(); err != nil {
				return err
			}
			for gw.Iter() < iters {
				if err := steps(ctx, ws[r], gw, 1); err != nil {
					return err
				}
			}
			return gw.Leave(ctx) // waits for the checkpoint under way
		})
		return ws[0], errors.Join(errs...)
	}
	whole, err := run("", false, end)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := run(dir, false, stopAt); err != nil {
		t.Fatal(err)
	}
	resumed, err := run(dir, true, end)
	if err != nil {
		t.Fatal(err)
	}
	want, got := whole.mustVariables(t), resumed.mustVariables(t)
	if d := differ(got, want); len(d) > 0 {
		t.Fatalf("resumed from the checkpoint at iteration %d, these variables differ at %d from a run that never stopped: %v", stopAt, end, d)
	}
	if step := got["/AdamOptimizer/global_step"]; step[0] != end {
		t.Fatalf("Adam's step counter is %v after %d iterations", step, end)
	}
}

// TestPaddingKeepsTheGradient steps one lone worker on 27 real rows with
// exact shapes and another with the rows padded to 32: the masked loss is
// the same mean, so both hand Gyre the same gradients, to float32
// rounding (compared against each tensor's largest entry).
func TestPaddingKeepsTheGradient(t *testing.T) {
	ctx := timeout(t)
	idx := make([]int64, 27)
	for i := range idx {
		idx[i] = int64(i)
	}
	gradients := func(bucket int) [][]float32 {
		w := newWorker(t, bucket)
		gw, err := gyre.Join(ctx, gyre.Config{GlobalBatch: global}, gyre.WithState(w.state))
		if err != nil {
			t.Fatal(err)
		}
		defer gw.Close()
		if got, want := w.tr.Bucketed(len(idx)), map[int]int{1: 27, 8: 32}[bucket]; got != want {
			t.Fatalf("Bucketed(27) with bucket %d = %d, want %d", bucket, got, want)
		}
		in, err := w.batch(w.tr.Bucketed(len(idx)), idx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.tr.Step(ctx, gw, len(idx), in.Images, in.Labels); err != nil {
			t.Fatal(err)
		}
		out := make([][]float32, len(w.tr.Gradients()))
		for i, g := range w.tr.Gradients() {
			out[i] = slices.Clone(g)
		}
		return out
	}
	exact, padded := gradients(1), gradients(8)
	for k, e := range exact {
		largest := float32(0)
		for _, x := range e {
			largest = max(largest, abs(x))
		}
		if largest == 0 {
			t.Fatalf("gradient %d is all zeros: the test checks nothing", k)
		}
		for i := range e {
			if abs(e[i]-padded[k][i]) > 1e-5*largest {
				t.Fatalf("gradient %d [%d]: %g with exact shapes, %g padded (largest entry %g)", k, i, e[i], padded[k][i], largest)
			}
		}
	}
}

func abs(x float32) float32 { return float32(math.Abs(float64(x))) }
