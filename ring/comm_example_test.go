package ring_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/mem"
)

// ExampleAllReduce sums a buffer over three in-process ranks. Each rank
// connects to the others, builds a Comm over its transport and calls
// AllReduce with its own data; every rank ends with the sum.
func ExampleAllReduce() {
	net := mem.NewNetwork(1)
	ids := []transport.PeerID{"a", "b", "c"}
	trs := make([]*mem.Transport, len(ids))
	for i, id := range ids {
		trs[i], _ = net.Join(id)
		defer trs[i].Close()
	}
	ctx := context.Background()
	for i, tr := range trs {
		for j, id := range ids {
			if i != j {
				if err := tr.Connect(ctx, id, string(id)); err != nil {
					panic(err)
				}
			}
		}
	}
	results := make([][]float32, len(ids))
	var wg sync.WaitGroup
	for r := range ids {
		wg.Go(func() {
			c, err := ring.NewComm(trs[r], ring.Config{Epoch: 1, Members: ids, Rank: r})
			if err != nil {
				panic(err)
			}
			defer c.Close()
			data := []float32{1, 2, float32(r)}
			if err := ring.AllReduce(ctx, c, wire.OpSum, data); err != nil {
				panic(err)
			}
			results[r] = data
		})
	}
	wg.Wait()
	fmt.Println(results)
	// Output: [[3 6 3] [3 6 3] [3 6 3]]
}
