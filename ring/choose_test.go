package ring

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/gyre-ml/gyre/internal/wire"
)

func TestChoose(t *testing.T) {
	m := DefaultCostModel
	for _, n := range []int{2, 3, 4, 5, 7, 8, 16, 64, 256} {
		th := m.Threshold(n)
		if th <= 0 || th == math.MaxInt {
			t.Fatalf("n=%d: threshold %d", n, th)
		}
		t.Logf("n=%d: threshold %d B (%.0f KiB)", n, th, float64(th)/1024)
		for _, s := range []int{th / 2, th - 1, th, th + 1, 2 * th} {
			want := AlgoRing
			if m.RecursiveDoubling(n, s) < m.Ring(n, s) {
				want = AlgoRecursiveDoubling
			}
			if got := Choose(n, s, th); got != want {
				t.Errorf("n=%d size %d: Choose = %v, model prefers %v (ring %.1f µs, rd %.1f µs)",
					n, s, got, want, m.Ring(n, s)*1e6, m.RecursiveDoubling(n, s)*1e6)
			}
		}
	}
	// The crossovers DefaultCostModel's comment quotes.
	for n, kb := range map[int]float64{2: 80, 3: 15, 4: 107, 8: 160, 64: 683} {
		if got := float64(m.Threshold(n)) / 1000; math.Abs(got-kb) > 0.5 {
			t.Errorf("n=%d: threshold %.1f kB, comment says %.0f", n, got, kb)
		}
	}
	// And its claims about the benchmark sizes.
	for _, n := range []int{2, 3, 4, 5, 7, 8, 16, 64} {
		if Choose(n, 4<<10, m.Threshold(n)) != AlgoRecursiveDoubling || Choose(n, 1<<20, m.Threshold(n)) != AlgoRing {
			t.Errorf("n=%d: 4 KiB or 1 MiB gets the wrong algorithm", n)
		}
		if want := n != 3 && n != 5; (Choose(n, 64<<10, m.Threshold(n)) == AlgoRecursiveDoubling) != want {
			t.Errorf("n=%d: recursive doubling at 64 KiB is %v, comment says %v", n, !want, want)
		}
	}
	if got := m.Threshold(1); got != 0 {
		t.Errorf("Threshold(1) = %d, want 0", got)
	}
	if got := (CostModel{Alpha: 1e-5, Beta: 1e9, Gamma: math.Inf(1)}).Threshold(2); got != math.MaxInt {
		t.Errorf("free reduction at n=2: threshold %d, want MaxInt (recursive doubling always wins)", got)
	}
}

// TestFitCostModel: the model takes the ring's slowest link at its better
// direction, the longest latency among the ring's links at their quicker
// direction, and the slowest rank's reduction; links off the ring and
// unknown figures do not count, and a table that measured nothing gives
// DefaultCostModel.
func TestFitCostModel(t *testing.T) {
	const n = 4
	table := func() Probes {
		p := Probes{Speed: make([][]float64, n), Latency: make([][]float64, n), Reduce: []float64{8e9, 6e9, 0, 9e9}}
		for a := range n {
			p.Speed[a], p.Latency[a] = make([]float64, n), make([]float64, n)
			for b := range n {
				if a != b {
					p.Speed[a][b], p.Latency[a][b] = 2e9, 10e-6
				}
			}
		}
		return p
	}
	p := table()
	// Link 1-2 is slow one way only, 2-3 is slow both ways, 0-2 is off
	// the ring through 0, 1, 2, 3 and slower still.
	p.Speed[1][2], p.Speed[2][3], p.Speed[3][2] = 1e8, 5e8, 6e8
	p.Speed[0][2], p.Speed[2][0] = 1e6, 1e6
	p.Latency[0][1], p.Latency[1][0] = 40e-6, 30e-6
	p.Latency[0][2], p.Latency[2][0] = 1, 1
	p.Latency[3][0] = 0 // unknown: 0-3's other direction counts
	p.Encode, p.Decode = []float64{3e9, 0, 5e9, math.Inf(1)}, []float64{7e9, 8e9, 9e9, 1e10}
	want := CostModel{Alpha: 30e-6, Beta: 6e8, Gamma: 6e9, Encode: 3e9, Decode: 7e9}
	if got := FitCostModel(p, nil); got != want {
		t.Errorf("rank order: %+v, want %+v", got, want)
	}
	// The ring through 0, 2, 1, 3 crosses 0-2.
	if got := FitCostModel(p, []int{0, 2, 1, 3}); got.Beta != 1e6 || got.Alpha != 1 {
		t.Errorf("ring 0 2 1 3: %+v, want Beta 1e6 and Alpha 1 from link 0-2", got)
	}
	empty := Probes{Speed: make([][]float64, n), Latency: make([][]float64, n), Reduce: make([]float64, n)}
	for a := range n {
		empty.Speed[a], empty.Latency[a] = make([]float64, n), make([]float64, n)
	}
	if got := FitCostModel(empty, nil); got != DefaultCostModel {
		t.Errorf("nothing measured: %+v, want DefaultCostModel", got)
	}
	if got := FitCostModel(Probes{}, nil); got != DefaultCostModel {
		t.Errorf("no members: %+v, want DefaultCostModel", got)
	}
	// A latency 100 times longer moves the threshold up at n = 2, where
	// it is α·γ: the choice follows the slow link.
	two := Probes{Speed: [][]float64{{0, 2e9}, {2e9, 0}}, Latency: [][]float64{{0, 10e-6}, {10e-6, 0}}, Reduce: []float64{8e9, 8e9}}
	fast := FitCostModel(two, nil).Threshold(2)
	two.Latency[0][1], two.Latency[1][0] = 1e-3, 1e-3
	if slow := FitCostModel(two, nil).Threshold(2); slow < 50*fast {
		t.Errorf("threshold %d with 1 ms links, %d with 10 µs: want it about 100 times larger", slow, fast)
	}
}

func TestCostModelValidate(t *testing.T) {
	if err := DefaultCostModel.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, m := range []CostModel{{}, {Alpha: 1e-5, Beta: 1e9}, {Alpha: -1, Beta: 1e9, Gamma: 1e9},
		{Alpha: 1e-5, Beta: math.NaN(), Gamma: 1e9}, {Alpha: 1e-5, Beta: 1e9, Gamma: math.Inf(1)}} {
		if err := m.Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: Validate = %v, want ErrInvalid", m, err)
		}
	}
}

// TestSetCostModel: a model with slow links raises the size from which
// the ring runs, on every rank alike, and the collectives that follow run
// the algorithm it chose; with SmallBytes pinned the model changes
// nothing but itself.
func TestSetCostModel(t *testing.T) {
	const n = 2
	cl := newCluster(t, n, nil)
	c := cl.comms[0]
	if c.CostModel() != DefaultCostModel || c.SmallBytes() != DefaultCostModel.Threshold(n) {
		t.Fatalf("new Comm: model %+v, small %d; want DefaultCostModel's", c.CostModel(), c.SmallBytes())
	}
	const size = 1 << 20
	if c.AllReduceAlgo(size) != AlgoRing {
		t.Fatalf("1 MiB runs %v by default, want the ring", c.AllReduceAlgo(size))
	}
	slow := CostModel{Alpha: 1e-3, Beta: 1e8, Gamma: 4e9, Encode: 4e9, Decode: 8e9}
	if err := c.SetCostModel(CostModel{Alpha: 1e-3}); !errors.Is(err, ErrInvalid) {
		t.Errorf("SetCostModel of an incomplete model = %v, want ErrInvalid", err)
	}
	mustAll(t, each(cl.comms, func(r int, c *Comm) error { return c.SetCostModel(slow) }))
	for r, c := range cl.comms {
		if c.CostModel() != slow || c.SmallBytes() != slow.Threshold(n) || c.AllReduceAlgo(size) != AlgoRecursiveDoubling {
			t.Fatalf("rank %d: model %+v, small %d, 1 MiB runs %v; want the slow model, threshold %d, recursive doubling",
				r, c.CostModel(), c.SmallBytes(), c.AllReduceAlgo(size), slow.Threshold(n))
		}
	}
	bufs := make([][]float32, n)
	for r := range bufs {
		bufs[r] = make([]float32, size/4)
		for i := range bufs[r] {
			bufs[r][i] = float32(r + i%7)
		}
	}
	mustAll(t, each(cl.comms, func(r int, c *Comm) error { return AllReduce(t.Context(), c, wire.OpSum, bufs[r]) }))
	for i, v := range bufs[1] {
		if want := float32(1 + 2*(i%7)); v != want || bufs[0][i] != v {
			t.Fatalf("element %d: %v and %v, want %v", i, bufs[0][i], v, want)
		}
	}
	pinned := newCluster(t, n, func(c *Config) { c.SmallBytes = -1 })
	if err := pinned.comms[0].SetCostModel(slow); err != nil {
		t.Fatal(err)
	}
	if got := pinned.comms[0]; got.SmallBytes() != 0 || got.CostModel() != slow {
		t.Errorf("SmallBytes pinned to the ring: small %d, model %+v after SetCostModel; want 0 and the slow model", got.SmallBytes(), got.CostModel())
	}
	c.Close()
	if err := c.SetCostModel(slow); !errors.Is(err, ErrClosed) {
		t.Errorf("SetCostModel on a closed Comm = %v, want ErrClosed", err)
	}
}

// TestCompression: with loopback's measured figures bf16 never pays, at
// any size or n; over a 1 Gbit/s link it does from a size where the bytes
// outweigh the latency, and the prediction for those sizes is a speed-up
// near the 1.8 to 1.9 measured there.
func TestCompression(t *testing.T) {
	loopback := CostModel{Alpha: 14e-6, Beta: 2.4e9, Gamma: 30e9, Encode: 4e9, Decode: 8e9}
	gbit := loopback
	gbit.Alpha, gbit.Beta = 100e-6, 0.125e9
	for _, n := range []int{2, 3, 4, 8, 64} {
		for _, size := range []int{4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20} {
			if got := loopback.Compression(n, size, loopback.Threshold(n)); got != wire.DTypeBytes {
				t.Errorf("loopback n=%d, %d bytes: %v, want none", n, size, got)
			}
		}
		for _, size := range []int{16 << 20, 64 << 20} {
			th := gbit.Threshold(n)
			if got := gbit.Compression(n, size, th); got != wire.DTypeBF16 {
				t.Errorf("1 Gbit n=%d, %d bytes: %v, want bf16", n, size, got)
			}
			if gain := gbit.AllReduce(n, size, th) / gbit.AllReduceBF16(n, size, th); gain < 1.7 || gain > 2 {
				t.Errorf("1 Gbit n=%d, %d bytes: predicted speed-up %.2f, want 1.7 to 2", n, size, gain)
			}
		}
	}
	if got := gbit.Compression(1, 64<<20, 0); got != wire.DTypeBytes {
		t.Errorf("one rank sends nothing, yet compression is %v", got)
	}
}

// ExampleCostModel_projection projects allreduce times to 256 workers on
// 25 Gbit/s links. Alpha is a TCP hop across a switch, about twice the
// 12–15 µs measured on loopback; Beta the line rate; Gamma the slowest
// one-core float32 sum the link probes measured (16 GB/s, 8 workers on
// 2 shared cores). At 256 the ring's 510 hops cost 12.8 ms, so recursive
// doubling, 8 exchanges of the whole buffer, runs up to about 5.2 MB,
// and the ring needs 256 MiB to come near the line rate.
func ExampleCostModel_projection() {
	m := CostModel{Alpha: 25e-6, Beta: 25e9 / 8, Gamma: 16e9, Encode: 4e9, Decode: 8e9}
	const n = 256
	th := m.Threshold(n)
	fmt.Printf("n=%d: recursive doubling below %d bytes\n", n, th)
	for _, size := range []int{64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20} {
		t := m.AllReduce(n, size, th)
		busbw := float64(size) / t * 2 * (n - 1) / n / 1e9
		fmt.Printf("%9d bytes: %-18v %8.2f ms  busbw %.2f GB/s\n", size, Choose(n, size, th), t*1e3, busbw)
	}
	// Output:
	// n=256: recursive doubling below 5180599 bytes
	//     65536 bytes: recursive-doubling     0.40 ms  busbw 0.33 GB/s
	//   1048576 bytes: recursive-doubling     3.41 ms  busbw 0.61 GB/s
	//  16777216 bytes: ring                  23.45 ms  busbw 1.43 GB/s
	//  67108864 bytes: ring                  55.53 ms  busbw 2.41 GB/s
	// 268435456 bytes: ring                 183.88 ms  busbw 2.91 GB/s
}

// TestSetChunk: a chunk size set alike on every rank changes the ring's
// pipeline and keeps its result; ranks whose chunk sizes differ fail
// with ErrMismatch rather than hang; 0 restores the default.
func TestSetChunk(t *testing.T) {
	const n, size = 3, 3 << 20
	cl := newCluster(t, n, nil)
	if got := cl.comms[0].ChunkBytes(); got != DefaultChunkBytes {
		t.Fatalf("new Comm: chunk %d bytes, want %d", got, DefaultChunkBytes)
	}
	if err := cl.comms[0].SetChunk(-1); !errors.Is(err, ErrInvalid) {
		t.Errorf("SetChunk(-1) = %v, want ErrInvalid", err)
	}
	mustAll(t, each(cl.comms, func(_ int, c *Comm) error { return c.SetChunk(64 << 10) }))
	bufs := make([][]float32, n)
	for r := range bufs {
		bufs[r] = make([]float32, size/4)
		for i := range bufs[r] {
			bufs[r][i] = float32(r + i%5)
		}
	}
	mustAll(t, each(cl.comms, func(r int, c *Comm) error { return AllReduce(t.Context(), c, wire.OpSum, bufs[r]) }))
	for r := range n {
		for i, v := range bufs[r] {
			if want := float32(3 + 3*(i%5)); v != want {
				t.Fatalf("rank %d element %d: %v, want %v", r, i, v, want)
			}
		}
	}
	if err := cl.comms[1].SetChunk(0); err != nil || cl.comms[1].ChunkBytes() != DefaultChunkBytes {
		t.Fatalf("SetChunk(0): %v, chunk %d; want the default", err, cl.comms[1].ChunkBytes())
	}
	errs := each(cl.comms, func(r int, c *Comm) error { return AllReduce(t.Context(), c, wire.OpSum, bufs[r]) })
	for r, err := range errs {
		if !errors.Is(err, ErrMismatch) {
			t.Errorf("rank %d with chunk sizes that differ: %v, want ErrMismatch", r, err)
		}
	}
}
