package train

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/internal/launch"
	"github.com/gyre-ml/gyre/internal/secret"
	"github.com/gyre-ml/gyre/transport/transporttest"
)

// runJob trains the default job on n in-process workers over real QUIC on
// loopback, each starting from its own random weights (model seed rank+1),
// and returns every worker's per-iteration global loss and final result.
func runJob(t *testing.T, n int, shares []int, iters int64, o Options) ([][]float64, []Result) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	key, err := secret.Generate()
	if err != nil {
		t.Fatal(err)
	}
	peers, err := launch.FreePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	losses := make([][]float64, n)
	results := make([]Result, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			job := NewJob(uint64(r)+1, 7)
			cfg := gyre.Config{Key: key.Hex(), Peers: peers, Rank: r, Shares: shares, GlobalBatch: 64,
				Logger: transporttest.Logger(t)}
			w, err := gyre.Join(ctx, cfg, gyre.WithState(job.State()))
			if err != nil {
				errs[r] = err
				return
			}
			defer w.Close()
			o := o
			o.Iters = iters
			o.OnIteration = func(_ int64, loss float64) { losses[r] = append(losses[r], loss) }
			if results[r], errs[r] = Run(ctx, w, job, o); errs[r] == nil {
				errs[r] = w.Leave(ctx)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return losses, results
}

// TestEquivalence checks that 4 workers, with equal and with unequal
// shares, follow the single-process loss trajectory of the same global
// batch and seed: the sample-weighted mean makes data parallelism exact up
// to the order of floating-point sums.
func TestEquivalence(t *testing.T) {
	const iters = 50
	o := Options{EvalEvery: iters, TestSize: 500}
	single, _ := runJob(t, 1, nil, iters, o)
	for _, tc := range []struct {
		name   string
		shares []int
	}{
		{"equal", nil},
		{"unequal", []int{30, 3, 0, 31}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			losses, _ := runJob(t, 4, tc.shares, iters, o)
			worst := 0.0
			for r, ls := range losses {
				if len(ls) != iters {
					t.Fatalf("rank %d ran %d iterations, want %d", r, len(ls), iters)
				}
				for k, l := range ls {
					rel := math.Abs(l-single[0][k]) / math.Abs(single[0][k])
					worst = max(worst, rel)
					if rel > 1e-9 || math.IsNaN(l) {
						t.Fatalf("rank %d iteration %d: loss %v, single process %v (relative %.3g)", r, k, l, single[0][k], rel)
					}
				}
			}
			if single[0][iters-1] >= single[0][0] {
				t.Fatalf("the loss did not fall: %v to %v", single[0][0], single[0][iters-1])
			}
			t.Logf("worst relative loss difference over %d iterations: %.3g", iters, worst)
		})
	}
}
