package ring

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/kernels"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/transporttest"
)

// otherSizes are the world sizes of the correctness matrix.
var otherSizes = []int{1, 2, 3, 4, 5, 7, 8, 16}

func TestReduceScatterReference(t *testing.T) {
	for _, n := range otherSizes {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			cl := newCluster(t, n, func(c *Config) { c.ChunkBytes = 64 })
			rng := rand.New(rand.NewPCG(uint64(n), 7))
			for _, length := range []int{0, 1, max(n-1, 0), n + 1, 1009} {
				for _, op := range []wire.Op{wire.OpSum, wire.OpMin, wire.OpMax, wire.OpAvg} {
					t.Run(fmt.Sprintf("len=%d/%v", length, op), func(t *testing.T) {
						testReduceScatter[float32](t, cl.comms, rng, op, length)
						testReduceScatter[float64](t, cl.comms, rng, op, length)
						if op != wire.OpAvg {
							testReduceScatter[int32](t, cl.comms, rng, op, length)
							testReduceScatter[int64](t, cl.comms, rng, op, length)
						}
					})
				}
			}
		})
	}
}

func testReduceScatter[T kernels.Number](t *testing.T, comms []*Comm, rng *rand.Rand, op wire.Op, length int) {
	t.Helper()
	inputs := randomInputs[T](rng, len(comms), length)
	bufs := clone(inputs)
	mustAll(t, each(comms, func(r int, c *Comm) error {
		return ReduceScatter(t.Context(), c, op, bufs[r])
	}))
	for r, s := range Segments(length, len(comms)) {
		if err := checkReduced(bufs[r], inputs, op, s.Off, s.End()); err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

func TestAllGatherReference(t *testing.T) {
	for _, n := range otherSizes {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			cl := newCluster(t, n, func(c *Config) { c.ChunkBytes = 64 })
			rng := rand.New(rand.NewPCG(uint64(n), 8))
			for _, k := range []int{0, 1, 3, 257} {
				t.Run(fmt.Sprintf("k=%d", k), func(t *testing.T) {
					length := n * k
					inputs := randomInputs[int64](rng, n, length)
					want := make([]int64, length)
					segs := Segments(length, n)
					for r, s := range segs {
						copy(want[s.Off:s.End()], inputs[r][s.Off:s.End()])
					}
					bufs := clone(inputs)
					mustAll(t, each(cl.comms, func(r int, c *Comm) error {
						return AllGather(t.Context(), c, bufs[r])
					}))
					for r, b := range bufs {
						if !bytes.Equal(kernels.Bytes(b), kernels.Bytes(want)) {
							t.Fatalf("rank %d: got %v, want %v", r, b, want)
						}
					}
				})
			}
		})
	}
}

func TestBroadcastReference(t *testing.T) {
	for _, n := range otherSizes {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			cl := newCluster(t, n, func(c *Config) { c.ChunkBytes = 64 })
			rng := rand.New(rand.NewPCG(uint64(n), 9))
			for _, length := range []int{0, 1, max(n-1, 0), n + 1, 1009} {
				for root := range n {
					t.Run(fmt.Sprintf("len=%d/root=%d", length, root), func(t *testing.T) {
						bufs := randomInputs[float32](rng, n, length)
						want := append([]float32(nil), bufs[root]...)
						mustAll(t, each(cl.comms, func(r int, c *Comm) error {
							return Broadcast(t.Context(), c, root, bufs[r])
						}))
						for r, b := range bufs {
							if !bytes.Equal(kernels.Bytes(b), kernels.Bytes(want)) {
								t.Fatalf("rank %d differs from the root", r)
							}
						}
					})
				}
			}
		})
	}
}

// TestBroadcastRootMismatch checks that ranks disagreeing about the root
// fail with ErrMismatch where a message crosses between them.
func TestBroadcastRootMismatch(t *testing.T) {
	cl := newCluster(t, 4, nil)
	errs := each(cl.comms, func(r int, c *Comm) error {
		root := 0
		if r >= 2 {
			root = 1
		}
		return c.Broadcast(t.Context(), root, wire.DTypeBytes, make([]byte, 100))
	})
	// Rank 2 expects Step 0 from rank 1 (the root to it) and gets Step 1.
	if err := isMismatch(2, errs[2]); err != nil {
		t.Error(err)
	}
}

func TestBarrier(t *testing.T) {
	for _, n := range otherSizes {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			cl := newCluster(t, n, nil)
			for late := range n {
				var entered atomic.Int64
				var early atomic.Bool
				mustAll(t, each(cl.comms, func(r int, c *Comm) error {
					if r == late {
						time.Sleep(20 * time.Millisecond)
					}
					entered.Add(1)
					err := c.Barrier(t.Context())
					if entered.Load() != int64(n) {
						early.Store(true)
					}
					return err
				}))
				if early.Load() {
					t.Fatalf("a rank left the barrier before rank %d entered", late)
				}
			}
		})
	}
}

// driver runs one collective on every rank of a cluster from goroutines it
// keeps, one per rank, so that starting a collective across all ranks
// allocates nothing and testing.AllocsPerRun, which counts allocations
// process-wide, can measure the Comms alone.
type driver struct {
	start []chan struct{}
	done  chan error
}

func newDriver(tb testing.TB, comms []*Comm, f func(r int, c *Comm) error) *driver {
	d := &driver{start: make([]chan struct{}, len(comms)), done: make(chan error, len(comms))}
	for r, c := range comms {
		d.start[r] = make(chan struct{})
		go func() {
			for range d.start[r] {
				d.done <- f(r, c)
			}
		}()
	}
	tb.Cleanup(func() {
		for _, s := range d.start {
			close(s)
		}
	})
	return d
}

// run runs the collective once and returns the first error.
func (d *driver) run() error {
	for _, s := range d.start {
		s <- struct{}{}
	}
	var first error
	for range d.start {
		if err := <-d.done; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// alwaysHeard is a Liveness whose peers are always just heard from.
type alwaysHeard struct{}

func (alwaysHeard) LastHeard(transport.PeerID) time.Time { return time.Now() }

// TestAllReduceZeroAllocs checks that a large allreduce in steady state
// allocates nothing, uncompressed and compressed.
func TestAllReduceZeroAllocs(t *testing.T) {
	for _, algo := range algos {
		for _, wt := range []wire.DType{wire.DTypeBytes, wire.DTypeBF16, wire.DTypeFP16} {
			name := algo.name
			if wt != wire.DTypeBytes {
				name += "/" + wt.String()
			}
			t.Run(name, func(t *testing.T) { testZeroAllocs(t, algo.small, wt) })
		}
	}
}

// testZeroAllocs measures a float32 Sum allreduce over 4 ranks, sent as wt
// (wire.DTypeBytes: uncompressed).
func testZeroAllocs(t *testing.T, small int, wt wire.DType) {
	// Several chunks per segment. A larger buffer only costs more under
	// -race.
	const n = 4
	size, chunk := 1<<20, 64<<10
	if small > 0 {
		size = 4 << 10 // recursive doubling is for small buffers
	}
	cl := newCluster(t, n, func(c *Config) {
		c.SmallBytes, c.ChunkBytes = small, chunk
		// Liveness checks every millisecond, and the stall report every
		// 1.25 s, once or more in the compressed runs' measurements: the
		// watchdog's ticks must not allocate either. No collective may
		// last the threshold, since a report allocates: with a 2 s
		// threshold, one compressed allreduce did on a loaded machine.
		c.Liveness, c.PeerTimeout = alwaysHeard{}, 4*time.Millisecond
		c.StallThreshold, c.OnStall = 10*time.Second, func(s Stall) { t.Errorf("a stall report: %+v", s) }
	})
	bufs := make([][]float32, n)
	for r := range bufs {
		bufs[r] = make([]float32, size/4)
	}
	ctx := context.Background()
	d := newDriver(t, cl.comms, func(r int, c *Comm) error {
		return AllReduceCompressed(ctx, c, wire.OpSum, bufs[r], wt)
	})
	for range 3 { // warm the plan cache, scratch, pools and queues
		if err := d.run(); err != nil {
			t.Fatal(err)
		}
	}
	var err error
	allocs := testing.AllocsPerRun(10, func() {
		if e := d.run(); e != nil {
			err = e
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if allocs != 0 {
		t.Errorf("%d-byte allreduce over %d ranks: %v allocations per op, want 0", size, n, allocs)
	}
}

// BenchmarkAllReduce measures a float32 Sum allreduce over mem, all ranks
// in this process. SetBytes is the buffer size, so MB/s is algbw; busbw is
// algbw·2(n-1)/n, as nccl-tests reports it.
func BenchmarkAllReduce(b *testing.B) { benchAllReduce(b, wire.DTypeBytes) }

// BenchmarkAllReduceCompressed is BenchmarkAllReduce with bf16 and fp16 on
// the wire. SetBytes is still the float32 buffer size.
func BenchmarkAllReduceCompressed(b *testing.B) {
	for _, wt := range wireTypes {
		b.Run(wt.String(), func(b *testing.B) { benchAllReduce(b, wt) })
	}
}

func benchAllReduce(b *testing.B, wt wire.DType) {
	for _, n := range []int{2, 4, 8} {
		for _, size := range []int{64 << 10, 1 << 20, 16 << 20} {
			b.Run(fmt.Sprintf("n=%d/%s", n, transporttest.SizeName(size)), func(b *testing.B) { benchOne(b, n, size, wt) })
		}
	}
}

// benchOne measures a float32 Sum allreduce of size bytes over n ranks,
// sent as wt, and reports its busbw.
func benchOne(b *testing.B, n, size int, wt wire.DType) {
	cl := newCluster(b, n, nil)
	bufs := make([][]float32, n)
	for r := range bufs {
		bufs[r] = make([]float32, size/4)
	}
	ctx := context.Background()
	d := newDriver(b, cl.comms, func(r int, c *Comm) error {
		return AllReduceCompressed(ctx, c, wire.OpSum, bufs[r], wt)
	})
	if err := d.run(); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	for b.Loop() {
		if err := d.run(); err != nil {
			b.Fatal(err)
		}
	}
	sec := b.Elapsed().Seconds() / float64(b.N)
	b.ReportMetric(float64(size)/sec*2*float64(n-1)/float64(n)/1e9, "busbw-GB/s")
}

// BenchmarkWireImage is the bf16 allreduce at 16 MiB with and without the
// wire image (compress.go): the sends that forward what their receive
// left skip the encode with it.
func BenchmarkWireImage(b *testing.B) {
	for _, n := range []int{2, 4} {
		for _, image := range []bool{false, true} {
			b.Run(fmt.Sprintf("n=%d/image=%v", n, image), func(b *testing.B) {
				useWireImage = image
				defer func() { useWireImage = true }()
				benchOne(b, n, 16<<20, wire.DTypeBF16)
			})
		}
	}
}
