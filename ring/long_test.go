package ring

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/kernels"
)

// TestLongMatrix is the whole correctness matrix at the largest length:
// every collective against its reference on 1,000,003 elements, for every
// world size 1, 2, 3, 4, 5, 7, 8 and 16, every dtype and op, and both wire
// compressions for the reducing ones. The smaller lengths of the matrix
// run with the race detector (TestAllReduceReference, TestAllReduceCompressed
// and the others); this one moves gigabytes through the in-memory transport,
// which the race detector makes take minutes, so it runs with
// GYRE_LONG_TESTS=1, as CI does without -race (about 25 s on 2 cores):
//
//	GYRE_LONG_TESTS=1 go test -run TestLongMatrix -v ./ring/
func TestLongMatrix(t *testing.T) {
	if os.Getenv("GYRE_LONG_TESTS") == "" {
		t.Skip("set GYRE_LONG_TESTS=1 to run the full matrix at 1,000,003 elements")
	}
	const length = 1_000_003
	for _, n := range []int{1, 2, 3, 4, 5, 7, 8, 16} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			cl := newCluster(t, n, nil)
			rng := rand.New(rand.NewPCG(uint64(n), 21))
			for _, op := range allOps {
				t.Run(fmt.Sprintf("allreduce/%v", op), func(t *testing.T) {
					testAllReduce[float32](t, cl.comms, rng, op, length)
					testAllReduce[float64](t, cl.comms, rng, op, length)
					if op != wire.OpAvg {
						testAllReduce[int32](t, cl.comms, rng, op, length)
						testAllReduce[int64](t, cl.comms, rng, op, length)
					}
					for _, wt := range wireTypes {
						testAllReduceCompressed(t, cl.comms, rng, op, wt, length)
					}
				})
				t.Run(fmt.Sprintf("reduce-scatter/%v", op), func(t *testing.T) {
					testReduceScatter[float32](t, cl.comms, rng, op, length)
					testReduceScatter[float64](t, cl.comms, rng, op, length)
					if op != wire.OpAvg {
						testReduceScatter[int32](t, cl.comms, rng, op, length)
						testReduceScatter[int64](t, cl.comms, rng, op, length)
					}
					for _, wt := range wireTypes {
						testReduceScatterCompressed(t, cl.comms, rng, op, wt, length)
					}
				})
			}
			t.Run("allgather", func(t *testing.T) {
				inputs := randomInputs[int32](rng, n, length)
				want := make([]int32, length)
				for r, s := range Segments(length, n) {
					copy(want[s.Off:s.End()], inputs[r][s.Off:s.End()])
				}
				mustAll(t, each(cl.comms, func(r int, c *Comm) error { return AllGather(t.Context(), c, inputs[r]) }))
				for r, b := range inputs {
					if !bytes.Equal(kernels.Bytes(b), kernels.Bytes(want)) {
						t.Fatalf("rank %d differs from the reference", r)
					}
				}
			})
			t.Run("broadcast", func(t *testing.T) {
				bufs := randomInputs[float64](rng, n, length)
				root := n - 1
				want := append([]float64(nil), bufs[root]...)
				mustAll(t, each(cl.comms, func(r int, c *Comm) error { return Broadcast(t.Context(), c, root, bufs[r]) }))
				for r, b := range bufs {
					if !bytes.Equal(kernels.Bytes(b), kernels.Bytes(want)) {
						t.Fatalf("rank %d differs from the root", r)
					}
				}
			})
		})
	}
}
