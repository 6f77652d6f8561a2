// Command embed is the smallest complete trainer that embeds Gyre: linear
// regression on generated data, trained data-parallel by every worker that
// `gyre launch` starts. A worker started later with --seed joins the
// running job, and SIGTERM makes a worker leave it at the next boundary.
//
//	go build -o embed ./examples/embed
//	go run ./cmd/gyre launch -n 4 -- ./embed
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"os/signal"
	"syscall"

	"github.com/gyre-ml/gyre"
)

const dim = 16

// sample returns sample i: features x and target y = Σ (j+1)·x[j] + noise.
func sample(i int64, x []float64) (y float64) {
	rng := rand.New(rand.NewPCG(uint64(i), 0))
	for j := range x {
		x[j] = rng.NormFloat64()
		y += float64(j+1) * x[j]
	}
	return y + 0.1*rng.NormFloat64()
}

func main() {
	cfg, err := gyre.ConfigFromEnv(os.LookupEnv) // set by gyre launch
	if err != nil {
		log.Fatal(err)
	}
	cfg.BindFlags(flag.CommandLine) // --batch, --peers, --key-file, ...
	iters := flag.Int64("iters", 200, "iterations")
	flag.Parse()

	ctx := context.Background()
	weights, grad, x := make([]float64, dim), make([]float64, dim), make([]float64, dim)
	w, err := gyre.Join(ctx, cfg, gyre.WithState(gyre.NewState().Float64("weights", weights)))
	if err != nil {
		log.Fatal(err)
	}
	defer w.Close()
	// SIGTERM (a scheduler, or gyre launch stopping the job) leaves the job
	// at the next boundary; the others carry on.
	sigterm := make(chan os.Signal, 1)
	signal.Notify(sigterm, syscall.SIGTERM)
	go func() {
		<-sigterm
		w.RequestLeave()
	}()

	for w.Iter() < *iters {
		b := w.Batch() // this worker's share of the global batch
		clear(grad)
		loss := 0.0 // summed over this worker's samples
		for _, i := range b.Indices {
			residual := -sample(i, x)
			for j := range x {
				residual += weights[j] * x[j]
			}
			for j := range x {
				grad[j] += residual * x[j] / float64(len(b.Indices)) // local mean gradient
			}
			loss += residual * residual / 2
		}
		w.AllReduceAsync64(ctx, "grad", grad) // becomes the global mean
		if err := w.Wait(ctx); err != nil {
			log.Print(err) // a lost worker: Boundary recovers
		}
		if (b.Iter+1)%50 == 0 {
			// Every worker of the iteration reports, before the boundary
			// that may change the view: the global mean loss is the sum
			// over all samples over the global batch.
			sum := []float64{loss}
			if err := w.Reduce(ctx, gyre.ReduceSum, sum); err != nil {
				log.Print(err) // a lost worker: Boundary recovers
			} else {
				w.ReportLoss(sum[0] / float64(b.Global)) // for gyre status
				if w.Rank() == 0 {
					fmt.Printf("iter %d loss %.5f\n", b.Iter+1, sum[0]/float64(b.Global))
				}
			}
		}
		for j := range weights {
			weights[j] -= 0.05 * grad[j]
		}
		change, err := w.Boundary(ctx) // agree on the next iteration
		if err != nil {
			log.Fatal(err)
		}
		if change.Redo {
			fmt.Printf("lost %v: redo from iteration %d\n", change.Lost, change.Iter) // the state was replaced
		}
		if change.Left {
			fmt.Printf("left the job after iteration %d\n", change.Iter-1)
			return // RequestLeave was honoured: out of the job
		}
		if err := w.Commit(); err != nil { // the point a recovery returns to, after a Redo too
			log.Fatal(err)
		}
	}
	if err := w.Leave(ctx); err != nil {
		log.Fatal(err)
	}
}
