package gyre_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/internal/secret"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
)

// Two workers sharing a cluster secret exchange one message over QUIC.
func ExampleNewTransport() {
	key, _ := secret.Generate() // normally: Config.KeyFile from `gyre keygen`
	open := func(name string) transport.Transport {
		t, err := gyre.NewTransport(gyre.Config{Name: name, Key: key.Hex(), DataAddr: "127.0.0.1:0"})
		if err != nil {
			log.Fatal(err)
		}
		return t
	}
	a, b := open("a"), open("b")
	defer a.Close()
	defer b.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Connect(ctx, "b", b.(transport.Listener).Addr()); err != nil {
		log.Fatal(err)
	}
	if err := a.Send(ctx, "b", transport.ChanData, wire.Header{Kind: wire.KindData, Seq: 1}, []byte("gradients")); err != nil {
		log.Fatal(err)
	}
	buf := make([]byte, 64)
	h, n, err := b.Recv(ctx, "a", transport.ChanData, buf)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("seq %d: %s\n", h.Seq, buf[:n])
	// Output: seq 1: gradients
}

// The iteration loop every trainer follows, on a job of one worker, which
// needs no secret and binds no port. Under `gyre launch` the same code
// runs on every worker, with the Config read from the environment
// (ConfigFromEnv). This example is the loop's one source: README's copy
// and the loops of the examples and of `gyre train` are checked against
// it (loops_test.go).
//
// The Worker, not the trainer, owns the iteration, the sampler and the
// committed state, so the loop stays right when the view or the shares
// change: iterations 0 and 1 cover the 8 samples of the first epoch once,
// and iteration 2 starts the second epoch's permutation.
func Example() {
	cfg := gyre.Config{GlobalBatch: 4, DatasetSize: 8, RNGSeed: 1}
	weights, iters := []float64{0, 0}, int64(3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := gyre.Join(ctx, cfg, gyre.WithState(gyre.NewState().Float64("weights", weights)))
	if err != nil {
		log.Fatal(err)
	}
	defer w.Close()
	for w.Iter() < iters {
		b := w.Batch()                                 // this worker's sample indices: b.Share of b.Global
		grad := []float64{-1, float64(len(b.Indices))} // the local mean gradient over b.Indices
		loss := float64(len(b.Indices))                // the loss summed over b.Indices
		w.AllReduceAsync64(ctx, "grad", grad)          // local mean in, global mean out
		if err := w.Wait(ctx); err != nil {
			log.Print(err) // a *gyre.PeerLostError names a worker that died; Boundary recovers
		}
		for i := range weights {
			weights[i] -= 0.5 * grad[i] // the optimizer step, on the global mean
		}
		sum := []float64{loss}
		if err := w.Reduce(ctx, gyre.ReduceSum, sum); err == nil && w.Rank() == 0 {
			fmt.Printf("iteration %d: samples %v, loss %.1f, weights %v\n", b.Iter, b.Indices, sum[0]/float64(b.Global), weights)
		}
		change, err := w.Boundary(ctx) // agree on the next iteration
		if err != nil {
			log.Fatal(err) // terminal, the same on every worker
		}
		if change.Redo {
			log.Printf("lost %v: redo from iteration %d", change.Lost, change.Iter) // the state was replaced
		}
		if change.Left {
			return // RequestLeave was honoured: out of the job
		}
		if err := w.Commit(); err != nil { // the point a recovery returns to, after a Redo too
			log.Fatal(err)
		}
	}
	if err := w.Leave(ctx); err != nil { // the job's end, on every worker
		log.Fatal(err)
	}
	// Output:
	// iteration 0: samples [5 3 1 2], loss 1.0, weights [0.5 -2]
	// iteration 1: samples [6 7 0 4], loss 1.0, weights [1 -4]
	// iteration 2: samples [6 3 2 1], loss 1.0, weights [1.5 -6]
}
