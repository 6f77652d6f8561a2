package gyre_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/gyretest"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/ring"
)

// TestHierarchicalAllReduce: 4 workers over QUIC, standing for 2
// machines of 2 (the probes' machine, overridden), with Algo
// hierarchical learn the machines from their link probes and run the
// hierarchical allreduce from the ring's sizes, every rank alike, to the
// exact sum; on one machine the same setting keeps the flat ring.
func TestHierarchicalAllReduce(t *testing.T) {
	for _, tc := range []struct {
		name    string
		machine func(int) string
		want    ring.Algo
	}{
		{"2x2", func(i int) string { return fmt.Sprintf("machine-%d", i%2) }, ring.AlgoHierarchical},
		{"one machine", nil, ring.AlgoRing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n, size = 4, 4 << 20
			c := gyretest.MakeCluster(t, gyretest.Options{N: n, Transport: gyretest.QUIC, Machine: tc.machine,
				Config: func(_ int, c *gyre.Config) { c.Algo = gyre.AlgoHierarchical }})
			comms := make([]*ring.Comm, n)
			for r, w := range c.Workers {
				comm, err := w.Comm()
				if err != nil {
					t.Fatal(err)
				}
				comms[r] = comm
				if got := comm.AllReduceAlgo(size); got != tc.want {
					t.Fatalf("rank %d runs %v for %d bytes, want %v (hierarchy %+v)", r, got, size, tc.want, comm.Hierarchy())
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			bufs := make([][]int64, n)
			errs := make(chan error, n)
			for r := range n {
				bufs[r] = make([]int64, size/8)
				for i := range bufs[r] {
					bufs[r][i] = int64(r+1) * int64(i%1000)
				}
				go func() { errs <- ring.AllReduce(ctx, comms[r], wire.OpSum, bufs[r]) }()
			}
			for range n {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			for r := range n {
				for i, v := range bufs[r] {
					if want := int64(10) * int64(i%1000); v != want {
						t.Fatalf("rank %d element %d = %d, want %d", r, i, v, want)
					}
				}
			}
		})
	}
}
