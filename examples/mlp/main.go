// Command mlp trains the MLP classifier of internal/mlp data-parallel with
// Gyre: each layer's gradient is allreduced as soon as backward produces
// it, while the earlier layers are still being computed. --overlap=false
// submits them only after backward, for comparison. At the end, rank 0
// prints where each iteration's time went.
//
//	go build -o mlp ./examples/mlp
//	go run ./cmd/gyre launch -n 4 -- ./mlp --target-acc 0.95
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/internal/mlp"
)

func main() {
	cfg, err := gyre.ConfigFromEnv(os.LookupEnv)
	if err != nil {
		log.Fatal(err)
	}
	cfg.GlobalBatch = mlp.DefaultBatch
	cfg.BindFlags(flag.CommandLine)
	iters := flag.Int64("iters", mlp.DefaultIters, "stop after this many iterations")
	target := flag.Float64("target-acc", mlp.DefaultTargetAcc, "stop on reaching this test accuracy")
	evalEvery := flag.Int64("eval-every", 50, "evaluate every this many iterations")
	overlap := flag.Bool("overlap", true, "allreduce each layer's gradient while backward continues")
	flag.Parse()
	if err := run(cfg, *iters, *target, *evalEvery, *overlap); err != nil {
		log.Fatal(err)
	}
}

// spanTimes adds up the trainer-side spans the worker reports.
type spanTimes map[gyre.SpanKind]time.Duration

func (s spanTimes) add(sp gyre.Span) { s[sp.Kind] += sp.End.Sub(sp.Start) }

func run(cfg gyre.Config, iters int64, target float64, evalEvery int64, overlap bool) error {
	ctx := context.Background()
	model := mlp.NewDefault(uint64(cfg.Rank) + 1) // rank 0's weights are broadcast at Join
	opt := mlp.NewDefaultSGD(model)
	data := mlp.NewDataset(1)
	testX, testLabels := data.Batch(mlp.TestIndices(mlp.DefaultTestSize), nil, nil) // generated once

	// Register everything a restore must bring back: parameters and the
	// optimizer's momentum.
	state := gyre.NewState()
	for l := range model.Layers() {
		state.Float64(fmt.Sprint("param", l), model.Params()[l])
		state.Float64(fmt.Sprint("momentum", l), opt.Momentum()[l])
	}
	spans := spanTimes{}
	w, err := gyre.Join(ctx, cfg, gyre.WithState(state), gyre.WithHooks(gyre.Hooks{Span: spans.add}))
	if err != nil {
		return err
	}
	defer w.Close()

	var (
		x      []float64
		labels []int
		waited time.Duration
		loss   = []float64{0}
		start  = time.Now()
		acc    float64
	)
	for w.Iter() < iters {
		b := w.Batch()
		x, labels = data.Batch(b.Indices, x, labels)

		end := w.StartSpan(gyre.SpanForward)
		if loss[0], err = model.Forward(x, labels); err != nil {
			return err
		}
		end()
		end = w.StartSpan(gyre.SpanBackward)
		var late []int
		model.Backward(func(layer int, grad []float64) {
			if overlap {
				w.AllReduceAsync64(ctx, fmt.Sprint("grad", layer), grad) // sent while backward goes on
			} else {
				late = append(late, layer)
			}
		})
		end()
		for _, layer := range late {
			w.AllReduceAsync64(ctx, fmt.Sprint("grad", layer), model.Grads()[layer])
		}
		t := time.Now()
		if err := w.Wait(ctx); err != nil {
			log.Print(err) // a lost worker: Boundary recovers
		}
		waited += time.Since(t)
		report := (b.Iter+1)%evalEvery == 0 || b.Iter+1 == iters
		if report {
			// The global mean loss: each worker's mean weighted by its
			// share. Every worker of the iteration reduces, before the
			// boundary, which may change the view.
			loss[0] *= float64(b.Share) / float64(b.Global)
			if b.Share == 0 {
				loss[0] = 0 // the mean of no samples is NaN
			}
			if err := w.Reduce(ctx, gyre.ReduceSum, loss); err != nil {
				log.Print(err) // a lost worker: Boundary recovers
			}
		}
		end = w.StartSpan(gyre.SpanStep)
		if err := opt.Step(model.Params(), model.Grads()); err != nil {
			return err
		}
		end()
		change, err := w.Boundary(ctx)
		if err != nil {
			return err
		}
		if change.Redo {
			log.Printf("lost %v: redo from iteration %d", change.Lost, change.Iter) // the state was replaced
		}
		if change.Left {
			return nil // RequestLeave was honoured: out of the job
		}
		if err := w.Commit(); err != nil {
			return err
		}
		if report {
			// Every worker evaluates the same samples with the same weights,
			// so all of them stop at the same iteration.
			acc = model.AccuracyOn(testX, testLabels)
			if w.Rank() == 0 {
				fmt.Printf("iter %5d  loss %.4f  test accuracy %.2f%%\n", w.Iter(), loss[0], 100*acc)
			}
			if acc >= target {
				break
			}
		}
	}
	if w.Rank() == 0 {
		n := time.Duration(max(w.Iter(), 1))
		fmt.Printf("%d workers, overlap %v: %d iterations in %v, %.2f%% test accuracy\n",
			w.Size(), overlap, w.Iter(), time.Since(start).Round(time.Millisecond), 100*acc)
		fmt.Printf("per iteration: forward %v  backward %v  waiting for allreduce %v  step %v\n",
			spans[gyre.SpanForward]/n, spans[gyre.SpanBackward]/n, waited/n, spans[gyre.SpanStep]/n)
	}
	return w.Leave(ctx)
}
