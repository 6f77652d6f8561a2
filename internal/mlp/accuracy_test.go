//go:build !race

package mlp

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// TestTaskIsValid is the validity test of the task: the MLP trained with
// the default recipe must reach DefaultTargetAcc on the test split, and
// softmax regression, trained to convergence, must stay below 80%. It runs
// in CI under -race, so it trains on a cached pool of 64k training samples
// (data generation dominates under the race detector) for 1000 iterations,
// less than DefaultIters; TestAccuracyLong runs the full budget on the
// endless stream over several seeds.
//
// These tests are single-goroutine numerics, which the race detector
// slows eightfold (26 s against 3 s) and has nothing to find in: the file
// builds without -race only. CI runs it so (.ci/pure.sh), and
// `go test ./internal/mlp` does.
func TestTaskIsValid(t *testing.T) {
	ds := NewDataset(1)
	pool := newPool(ds, 0, 1<<16)
	test := newPool(ds, TestStart, 5000)

	lin := NewLinear(1)
	linAcc := trainLinear(t, lin, pool, test)
	if linAcc >= 0.80 {
		t.Errorf("linear baseline reaches %.4f test accuracy, want < 0.80: the task is too linear", linAcc)
	}

	const iters = 1000
	m := NewDefault(1)
	first := 0
	start := time.Now()
	pool.train(t, m, NewDefaultSGD(m), 0, iters, DefaultBatch, 100, func(k int) {
		if first == 0 && test.accuracy(m) >= DefaultTargetAcc {
			first = k
		}
	})
	acc := test.accuracy(m)
	t.Logf("MLP %v: %.4f after %d iterations of batch %d (%v); 95%% first at iteration %d",
		m.Sizes(), acc, iters, DefaultBatch, time.Since(start).Round(time.Millisecond), first)
	if acc < DefaultTargetAcc {
		t.Errorf("MLP reaches %.4f test accuracy after %d iterations, want >= %.2f", acc, iters, DefaultTargetAcc)
	}
}

// trainLinear trains softmax regression with a large batch and a decaying
// learning rate until its accuracy stops moving, fails the test if it has
// not, and returns the final test accuracy.
func trainLinear(tb testing.TB, m *Model, train, test *pool) float64 {
	tb.Helper()
	opt := NewSGD(m.Params(), DefaultLR, DefaultMomentum)
	var history []float64
	// Three stages of 128 steps of batch 512 at η, η/10, η/100 (each stage
	// one pass over 64k samples) for 330 parameters: the accuracy is flat
	// after the first stage.
	for stage := range 3 {
		train.train(tb, m, opt, stage*128*512, 128, 512, 0, nil)
		opt.LR /= 10
		history = append(history, test.accuracy(m))
	}
	tb.Logf("linear baseline test accuracy by stage: %.4f", history)
	if d := history[2] - history[1]; d > 0.005 || d < -0.005 {
		tb.Errorf("linear baseline has not converged: accuracy moved %.4f in its last stage", d)
	}
	return history[2]
}

// TestAccuracyLong measures the figures quoted in doc.go: for three seeds,
// the default recipe's test accuracy over DefaultIters iterations, the
// first iteration (checked every 50) at which it reaches 95%, and the
// linear baseline. It takes about a minute, so it runs only with
// MLP_LONG_TESTS=1:
//
//	MLP_LONG_TESTS=1 go test -run TestAccuracyLong -v ./internal/mlp/
func TestAccuracyLong(t *testing.T) {
	if os.Getenv("MLP_LONG_TESTS") == "" {
		t.Skip("set MLP_LONG_TESTS=1 to run the full-budget accuracy measurement")
	}
	for _, seed := range []uint64{1, 2, 3} {
		ds := NewDataset(seed)
		test := TestIndices(DefaultTestSize)
		linAcc := trainLinear(t, NewLinear(seed), newPool(ds, 1<<30, 1<<18), newPool(ds, TestStart, DefaultTestSize))

		m := NewDefault(seed)
		first, firstTime := 0, time.Duration(0)
		var trainTime time.Duration
		start := time.Now()
		var acc float64
		trainLocal(t, m, NewDefaultSGD(m), ds, 0, DefaultIters, DefaultBatch, 50, func(k int) {
			trainTime += time.Since(start) // evaluation is not training time
			acc = m.Accuracy(ds, test)
			if first == 0 && acc >= DefaultTargetAcc {
				first, firstTime = k, trainTime
			}
			if k%250 == 0 {
				t.Logf("seed %d iteration %d: %.4f", seed, k, acc)
			}
			start = time.Now()
		})
		t.Logf("seed %d: linear %.4f; MLP %.4f after %d iterations (%v training); 95%% at iteration %d (%v)",
			seed, linAcc, acc, DefaultIters, trainTime.Round(time.Millisecond), first, firstTime.Round(time.Millisecond))
		if acc < 0.96 || linAcc > 0.75 || first == 0 {
			t.Errorf("seed %d: MLP %.4f (want >= 0.96), linear %.4f (want <= 0.75)", seed, acc, linAcc)
		}
	}
}

// TestMNISTAccuracyLong measures the MNIST figures quoted in doc.go: for
// three seeds (model and data order alike), MNISTRecipe's test accuracy
// on the 10,000 test images over its iteration budget, and the first
// iteration (checked every 50) at which it reaches 97%. It reads the
// files from the module cache and takes a few minutes, so it runs only
// with MLP_LONG_TESTS=1:
//
//	MLP_LONG_TESTS=1 go test -run TestMNISTAccuracyLong -v ./internal/mlp/
func TestMNISTAccuracyLong(t *testing.T) {
	if os.Getenv("MLP_LONG_TESTS") == "" {
		t.Skip("set MLP_LONG_TESTS=1 to run the MNIST accuracy measurement")
	}
	r := MNISTRecipe()
	for _, seed := range []uint64{1, 2, 3} {
		data, err := LoadMNIST("", seed)
		if err != nil {
			t.Fatal(err)
		}
		testX, testY := data.TestSet(0)
		m, err := NewWithActivation(r.Sizes(data.InputWidth()), r.Act, seed)
		if err != nil {
			t.Fatal(err)
		}
		opt := NewSGD(m.Params(), r.LR, r.Mu)
		idx := make([]int64, r.Batch)
		var x []float64
		var y []int
		first, acc := 0, 0.0
		var trainTime time.Duration
		var line []string
		for k := range int(r.Iters) {
			start := time.Now()
			for i := range idx {
				idx[i] = int64(k*r.Batch + i)
			}
			x, y = data.Batch(idx, x, y)
			sgdStep(t, m, opt, x, y)
			trainTime += time.Since(start)
			if (k+1)%50 != 0 {
				continue
			}
			acc = m.AccuracyOn(testX, testY)
			if first == 0 && acc >= r.TargetAcc {
				first = k + 1
				line = append(line, fmt.Sprintf("97%% at %d (%v)", first, trainTime.Round(time.Millisecond)))
			}
			if (k+1)%250 == 0 {
				line = append(line, fmt.Sprintf("@%d %.4f", k+1, acc))
			}
		}
		t.Logf("seed %d: %s", seed, strings.Join(line, ", "))
		if first == 0 || acc < r.TargetAcc {
			t.Errorf("seed %d: %.4f after %d iterations, 97%% first at %d; want it reached and kept", seed, acc, r.Iters, first)
		}
	}
}
