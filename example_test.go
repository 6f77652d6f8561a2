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

// A one-worker job runs the iteration loop every trainer follows: the
// Worker hands out the batch (iterations 0 and 1 cover the 8 samples of the
// first epoch once; iteration 2 starts the second epoch's permutation),
// averages the gradient and keeps the state it can restore. A worker alone
// needs no secret and binds no port. Under `gyre launch` the same code runs
// on every worker, with the Config read from the environment.
func ExampleJoin() {
	cfg := gyre.Config{GlobalBatch: 4, DatasetSize: 8, RNGSeed: 1}
	weights := []float64{0, 0}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := gyre.Join(ctx, cfg, gyre.WithState(gyre.NewState().Float64("weights", weights)))
	if err != nil {
		log.Fatal(err)
	}
	defer w.Close()
	for w.Iter() < 3 {
		b := w.Batch()
		grad := []float64{-1, float64(len(b.Indices))} // the mean gradient over b.Indices
		w.AllReduceAsync64(ctx, "grad", grad)
		if err := w.Wait(ctx); err != nil {
			log.Print(err) // a lost worker: Boundary recovers
		}
		for i := range weights {
			weights[i] -= 0.5 * grad[i]
		}
		change, err := w.Boundary(ctx)
		if err != nil {
			log.Fatal(err)
		}
		if change.Redo {
			log.Printf("lost %v: redo from iteration %d", change.Lost, change.Iter)
		}
		if change.Left {
			return
		}
		if err := w.Commit(); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("iteration %d: samples %v, weights %v\n", b.Iter, b.Indices, weights)
	}
	// Output:
	// iteration 0: samples [5 3 1 2], weights [0.5 -2]
	// iteration 1: samples [6 7 0 4], weights [1 -4]
	// iteration 2: samples [6 3 2 1], weights [1.5 -6]
}
