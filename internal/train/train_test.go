package train

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/datasets/mnist"
	"github.com/gyre-ml/gyre/gyretest"
	"github.com/gyre-ml/gyre/internal/mlp"
)

// runJob trains the job newJob returns on n in-process workers over real
// QUIC on loopback, each starting from its own random weights (newJob is
// given model seed rank+1), and returns every worker's per-iteration
// global loss and final result.
// It checks that every rank ends with the same state digest, the share-0
// rank included, and returns rank 0's final parameters.
func runJob(t *testing.T, n int, shares []int, iters int64, o Options, newJob func(modelSeed uint64) *Job) ([][]float64, []Result, [][]float64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	jobs := make([]*Job, n)
	c := gyretest.MakeCluster(t, gyretest.Options{N: n, Transport: gyretest.QUIC,
		Config: func(_ int, c *gyre.Config) { c.Shares, c.GlobalBatch = shares, 64 },
		State: func(r int) *gyre.State {
			jobs[r] = newJob(uint64(r) + 1)
			return jobs[r].State()
		}})
	losses := make([][]float64, n)
	results := make([]Result, n)
	errs := c.Run(func(r int, w *gyre.Worker) error {
		o := o
		o.Iters = iters
		o.OnIteration = func(it Iteration) { losses[r] = append(losses[r], it.Loss) }
		var err error
		results[r], err = Run(ctx, w, jobs[r], o)
		return err
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	c.EnsureSameState(t)
	if err := errors.Join(c.Run(func(_ int, w *gyre.Worker) error { return w.Leave(ctx) })...); err != nil {
		t.Fatal(err)
	}
	return losses, results, jobs[0].Model.Params()
}

// lossTolerance is how far, relative, a data-parallel job's losses and
// final parameters may be from one process's: only the order of
// floating-point sums differs (observed: about 1e-15).
const lossTolerance = 1e-12

// TestEquivalence checks that 4 workers, with equal and with unequal
// shares, follow the single-process loss trajectory of the same global
// batch and seed, and end with identical states on every rank (the share-0
// rank included) that match the single process's: the sample-weighted mean
// makes data parallelism exact up to the order of floating-point sums.
func TestEquivalence(t *testing.T) {
	equivalence(t, 50, syntheticJob)
}

// equivalence runs newJob's job for iters iterations on 1 worker, then on
// 4 with equal and with unequal shares (one of them 0), and checks that
// they agree (checkEquivalent).
func equivalence(t *testing.T, iters int64, newJob func(modelSeed uint64) *Job) {
	t.Helper()
	o := Options{EvalEvery: iters, TestSize: 500}
	single, _, singleParams := runJob(t, 1, nil, iters, o, newJob)
	for _, tc := range []struct {
		name   string
		shares []int
	}{
		{"equal", nil},
		{"unequal", []int{30, 3, 0, 31}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			losses, _, params := runJob(t, 4, tc.shares, iters, o, newJob)
			checkEquivalent(t, int(iters), single[0], singleParams, losses, params)
		})
	}
}

// syntheticJob is the default job on the synthetic data of seed 7.
func syntheticJob(modelSeed uint64) *Job { return NewJob(modelSeed, 7) }

// checkEquivalent fails the test unless every rank ran iters iterations
// with the losses of the single process (single), within lossTolerance,
// the loss fell, and the final parameters match the single process's.
func checkEquivalent(t *testing.T, iters int, single []float64, singleParams [][]float64, losses [][]float64, params [][]float64) {
	t.Helper()
	worst := 0.0
	for r, ls := range losses {
		if len(ls) != iters {
			t.Fatalf("rank %d ran %d iterations, want %d", r, len(ls), iters)
		}
		for k, l := range ls {
			rel := math.Abs(l-single[k]) / math.Abs(single[k])
			worst = max(worst, rel)
			if rel > lossTolerance || math.IsNaN(l) {
				t.Fatalf("rank %d iteration %d: loss %v, single process %v (relative %.3g)", r, k, l, single[k], rel)
			}
		}
	}
	if single[iters-1] >= single[0] {
		t.Fatalf("the loss did not fall: %v to %v", single[0], single[iters-1])
	}
	// The parameters too: every rank's are identical (runJob checked
	// the digests), and they match the single process's up to the
	// order of sums.
	worstParam := 0.0
	for l, p := range params {
		scale := 0.0
		for _, v := range singleParams[l] {
			scale = max(scale, math.Abs(v))
		}
		for i, v := range p {
			worstParam = max(worstParam, math.Abs(v-singleParams[l][i])/scale)
		}
	}
	if worstParam > lossTolerance {
		t.Fatalf("final parameters differ from the single process's by %.3g relative", worstParam)
	}
	t.Logf("worst relative difference from one process over %d iterations: loss %.3g, final parameters %.3g",
		iters, worst, worstParam)
}

// TestEquivalenceMNIST is TestEquivalence on MNIST with its recipe: the
// training examples each position maps to, and so the losses, do not
// depend on how many workers share the batch or how.
func TestEquivalenceMNIST(t *testing.T) {
	train, test, err := mnist.Load("")
	if err != nil {
		t.Fatal(err)
	}
	// The recipe's, with a narrower hidden layer: the width is beside the
	// point here, and the race detector slows every loop over it.
	recipe := mlp.MNISTRecipe()
	recipe.Hidden = []int{32}
	// Each rank gets its own MNIST, as separate processes would: the
	// order of examples must come out the same from the seed alone.
	newJob := func(modelSeed uint64) *Job {
		data, err := mlp.NewMNIST(train, test, 7)
		if err != nil {
			t.Fatal(err)
		}
		j, err := NewDataJob(data, recipe, modelSeed)
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	equivalence(t, 20, newJob)
}
