package ring

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport/mem"
)

// fuserLengths are tensor lengths in float64 elements for a 4 KiB bucket:
// small ones that fill buckets, exact fits, and some larger than a bucket.
var fuserLengths = []int{100, 200, 300, 1000, 7, 512, 600, 2000, 1, 50, 0, 511, 1, 3000, 64, 64, 900, 128, 700, 5}

// expectedBuckets is the size rule written out plainly.
func expectedBuckets(lengths []int, es, bucketBytes int) int {
	n, open := 0, -1 // open: bytes in the open bucket, -1 when none
	for _, l := range lengths {
		size := l * es
		if size > bucketBytes && open >= 0 {
			n, open = n+1, -1
		}
		if open < 0 {
			open = 0
		}
		open += size
		if open >= bucketBytes {
			n, open = n+1, -1
		}
	}
	if open >= 0 {
		n++ // the Flush
	}
	return n
}

// newFusers makes a Fuser per Comm, closed at cleanup.
func newFusers[T float32 | float64](tb testing.TB, comms []*Comm, cfg FuserConfig) []*Fuser[T] {
	tb.Helper()
	fs := make([]*Fuser[T], len(comms))
	for r, c := range comms {
		f, err := NewFuser[T](c, cfg)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { f.Close() })
		fs[r] = f
	}
	return fs
}

// integerInputs returns, per rank, tensors of the given lengths holding
// small integers, so that float64 sums are exact in any order.
func integerInputs(rng *rand.Rand, n int, lengths []int) [][][]float64 {
	in := make([][][]float64, n)
	for r := range in {
		for _, l := range lengths {
			t := make([]float64, l)
			for i := range t {
				t[i] = float64(rng.IntN(2001) - 1000)
			}
			in[r] = append(in[r], t)
		}
	}
	return in
}

func TestFuserReference(t *testing.T) {
	const n, bucketBytes = 4, 4 << 10
	cl := newCluster(t, n, func(c *Config) { c.ChunkBytes = 1 << 10 })
	fs := newFusers[float64](t, cl.comms, FuserConfig{BucketBytes: bucketBytes})
	rng := rand.New(rand.NewPCG(7, 13))
	// Two iterations, as a trainer runs them, to exercise buffer reuse.
	for iter := range 2 {
		inputs := integerInputs(rng, n, fuserLengths)
		bufs := make([][][]float64, n)
		for r := range bufs {
			bufs[r] = clone(inputs[r])
		}
		mustAll(t, each(cl.comms, func(r int, c *Comm) error {
			f := fs[r]
			var hs []*Handle
			for _, x := range bufs[r] {
				hs = append(hs, f.AllReduceAsync(t.Context(), "t", x))
			}
			f.Flush(t.Context())
			for _, h := range hs {
				if err := h.Wait(t.Context()); err != nil {
					return err
				}
			}
			return nil
		}))
		for r := range n {
			for i, got := range bufs[r] {
				for j := range got {
					var want float64
					for q := range n {
						want += inputs[q][i][j]
					}
					if got[j] != want {
						t.Fatalf("iteration %d rank %d tensor %d element %d: got %v, want %v", iter, r, i, j, got[j], want)
					}
				}
			}
		}
		want := int64((iter + 1) * expectedBuckets(fuserLengths, 8, bucketBytes))
		for r, f := range fs {
			if got := f.buckets.Load(); got != want {
				t.Errorf("iteration %d rank %d: %d buckets, want %d", iter, r, got, want)
			}
		}
	}
}

func TestFuserBucketRule(t *testing.T) {
	for _, tc := range []struct {
		lengths []int
		want    int
	}{
		{[]int{512}, 1},           // exactly full
		{[]int{511, 1}, 1},        // fills up
		{[]int{511, 2}, 1},        // overshoots by less than a tensor
		{[]int{100, 600, 10}, 3},  // the large one closes the open bucket first
		{[]int{600, 600}, 2},      // each large one alone
		{[]int{100, 100, 100}, 1}, // only the Flush
	} {
		if got := expectedBuckets(tc.lengths, 8, 4096); got != tc.want {
			t.Errorf("%v: %d buckets, want %d", tc.lengths, got, tc.want)
		}
		cl := newCluster(t, 1, nil)
		f := newFusers[float64](t, cl.comms, FuserConfig{BucketBytes: 4096})[0]
		var hs []*Handle
		for _, l := range tc.lengths {
			hs = append(hs, f.AllReduceAsync(t.Context(), "t", make([]float64, l)))
		}
		f.Flush(t.Context())
		for _, h := range hs {
			if err := h.Wait(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		if got := f.buckets.Load(); got != int64(tc.want) {
			t.Errorf("%v: the Fuser closed %d buckets, want %d", tc.lengths, got, tc.want)
		}
	}
}

func TestFuserFloat32Avg(t *testing.T) {
	const n = 3
	cl := newCluster(t, n, nil)
	fs := newFusers[float32](t, cl.comms, FuserConfig{BucketBytes: 1 << 10, Op: wire.OpAvg})
	mustAll(t, each(cl.comms, func(r int, c *Comm) error {
		x := []float32{float32(3 * r), 6}
		y := make([]float32, 300)
		for i := range y {
			y[i] = float32(r)
		}
		hx, hy := fs[r].AllReduceAsync(t.Context(), "t", x), fs[r].AllReduceAsync(t.Context(), "t", y)
		fs[r].Flush(t.Context())
		if err := errors.Join(hx.Wait(t.Context()), hy.Wait(t.Context())); err != nil {
			return err
		}
		if x[0] != 3 || x[1] != 6 || y[0] != 1 || y[299] != 1 {
			t.Errorf("rank %d: got %v %v..%v", r, x, y[0], y[299])
		}
		return nil
	}))
}

// TestFuserKill kills one rank while buckets are in flight: every
// survivor's pending handle fails with an error, none hangs.
func TestFuserKill(t *testing.T) {
	const n, victim = 4, 1
	cl := newCluster(t, n, func(c *Config) { c.ChunkBytes = 1 << 10 })
	cl.setLinks(mem.Link{Delay: 50 * time.Millisecond})
	fs := newFusers[float64](t, cl.comms, FuserConfig{BucketBytes: 4 << 10})
	go func() {
		time.Sleep(30 * time.Millisecond)
		cl.net.Kill(cl.ids[victim])
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	start := time.Now()
	errs := each(cl.comms, func(r int, c *Comm) error {
		var hs []*Handle
		for _, l := range fuserLengths {
			hs = append(hs, fs[r].AllReduceAsync(t.Context(), "t", make([]float64, l)))
		}
		fs[r].Flush(t.Context())
		var failed error
		for i, h := range hs {
			err := h.Wait(ctx)
			if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
				t.Errorf("rank %d: handle %d hangs", r, i)
				return err
			}
			if failed != nil && err == nil {
				t.Errorf("rank %d: handle %d succeeded after a failed bucket", r, i)
			}
			if err != nil && failed == nil {
				failed = err
			}
		}
		return failed
	})
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("survivors took %v to fail", d)
	}
	for r, err := range errs {
		if r != victim && err == nil {
			t.Errorf("rank %d: every handle succeeded, want a failure", r)
		}
	}
	// A failed Fuser fails new tensors at once.
	if err := fs[0].AllReduceAsync(t.Context(), "t", make([]float64, 1)).Wait(t.Context()); err == nil {
		t.Error("after a failure: got nil, want the failure")
	}
}

// TestFuserWaitCancel checks that a cancelled Wait returns at once while
// the bucket completes later.
func TestFuserWaitCancel(t *testing.T) {
	cl := newCluster(t, 2, nil)
	fs := newFusers[float64](t, cl.comms, FuserConfig{})
	x := []float64{1, 2}
	h := fs[0].AllReduceAsync(t.Context(), "t", x)
	fs[0].Flush(t.Context())
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(20*time.Millisecond, cancel)
	start := time.Now()
	if err := h.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("the cancelled Wait took %v", d)
	}
	// Rank 1 joins late; the bucket still completes.
	y := []float64{10, 20}
	h1 := fs[1].AllReduceAsync(t.Context(), "t", y)
	fs[1].Flush(t.Context())
	if err := errors.Join(h.Wait(t.Context()), h1.Wait(t.Context())); err != nil {
		t.Fatal(err)
	}
	if x[0] != 11 || x[1] != 22 || y[0] != 11 || y[1] != 22 {
		t.Errorf("got %v and %v, want [11 22]", x, y)
	}
}

func TestFuserInvalid(t *testing.T) {
	cl := newCluster(t, 1, nil)
	for _, cfg := range []FuserConfig{{BucketBytes: -1}, {Op: wire.Op(200)}, {AutoCompress: true, Compress: wire.DTypeBF16}} {
		if _, err := NewFuser[float32](cl.comms[0], cfg); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: got %v, want ErrInvalid", cfg, err)
		}
	}
	if _, err := NewFuser[float64](cl.comms[0], FuserConfig{AutoCompress: true}); !errors.Is(err, ErrInvalid) {
		t.Errorf("automatic compression of float64: got %v, want ErrInvalid", err)
	}
	if _, err := NewFuser[float32](nil, FuserConfig{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("nil comm: got %v, want ErrInvalid", err)
	}
}

// TestFuserClose checks that Close fails unsent handles with ErrClosed and
// that Close leaks no goroutine.
func TestFuserClose(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	cl := newCluster(t, 2, nil)
	fs := newFusers[float32](t, cl.comms, FuserConfig{})
	mustAll(t, each(cl.comms, func(r int, c *Comm) error {
		h := fs[r].AllReduceAsync(t.Context(), "t", []float32{1})
		fs[r].Flush(t.Context())
		return h.Wait(t.Context())
	}))
	h := fs[0].AllReduceAsync(t.Context(), "t", []float32{1}) // left open
	for r, f := range fs {
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		f.Close()
		cl.comms[r].Close()
		cl.trs[r].Close()
	}
	if err := h.Wait(t.Context()); !errors.Is(err, ErrClosed) {
		t.Errorf("open bucket: got %v, want ErrClosed", err)
	}
	if err := fs[1].AllReduceAsync(t.Context(), "t", []float32{1}).Wait(t.Context()); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: got %v, want ErrClosed", err)
	}
}

// TestFuserAutoCompress: with automatic compression a 1 MiB bucket goes
// as bf16 where the Comm's cost model has a 1 Gbit/s link, and as float32
// where it has loopback's: a sum bf16 cannot hold comes back rounded in
// the first case, exact in the second, on every rank alike.
func TestFuserAutoCompress(t *testing.T) {
	const n, elems = 2, 1 << 18
	loopback := CostModel{Alpha: 14e-6, Beta: 2.4e9, Gamma: 30e9, Encode: 4e9, Decode: 8e9}
	gbit := loopback
	gbit.Alpha, gbit.Beta = 100e-6, 0.125e9
	const x = 1 + 1.0/1024 // each rank's value; the sum 2 + 2⁻⁹ needs 10 bits
	for _, tc := range []struct {
		name  string
		model CostModel
		want  float32
	}{{"loopback", loopback, 2 * x}, {"1gbit", gbit, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			cl := newCluster(t, n, nil)
			mustAll(t, each(cl.comms, func(r int, c *Comm) error { return c.SetCostModel(tc.model) }))
			fs := newFusers[float32](t, cl.comms, FuserConfig{AutoCompress: true})
			mustAll(t, each(cl.comms, func(r int, c *Comm) error {
				g := make([]float32, elems)
				for i := range g {
					g[i] = x
				}
				h := fs[r].AllReduceAsync(t.Context(), "t", g)
				fs[r].Flush(t.Context())
				if err := h.Wait(t.Context()); err != nil {
					return err
				}
				if g[0] != tc.want || g[elems-1] != tc.want {
					t.Errorf("rank %d: %v .. %v, want %v", r, g[0], g[elems-1], tc.want)
				}
				return nil
			}))
		})
	}
}

// bucketLog records the buckets a Fuser reports.
type bucketLog struct {
	mu      sync.Mutex
	buckets []BucketStats
}

func (l *bucketLog) Bucket(s BucketStats) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s.Tensors = slices.Clone(s.Tensors) // reused once Bucket returns
	l.buckets = append(l.buckets, s)
}

// TestFuserPendingAndObserver checks that a bucket waiting for a late rank
// lists its tensors as pending, and that the observer hears of each bucket
// with its tensors' names and phases in order.
func TestFuserPendingAndObserver(t *testing.T) {
	cl := newCluster(t, 2, nil)
	logs := []*bucketLog{{}, {}}
	fs := make([]*Fuser[float32], 2)
	for r, c := range cl.comms {
		f, err := NewFuser[float32](c, FuserConfig{BucketBytes: 16, Observer: logs[r]})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		fs[r] = f
	}
	submit := func(f *Fuser[float32]) []*Handle {
		hs := []*Handle{f.AllReduceAsync(t.Context(), "layer1.weight", make([]float32, 4)),
			f.AllReduceAsync(t.Context(), "layer1.bias", make([]float32, 2))}
		f.Flush(t.Context())
		return hs
	}
	early := submit(fs[0]) // rank 1 is late: rank 0's first bucket waits for it
	if got, want := fs[0].Pending(), []string{"layer1.weight", "layer1.bias"}; !slices.Equal(got, want) {
		t.Errorf("pending while rank 1 is late: %q, want %q", got, want)
	}
	for _, h := range append(early, submit(fs[1])...) {
		if err := h.Wait(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	for r, f := range fs {
		if p := f.Pending(); len(p) != 0 {
			t.Errorf("rank %d: pending after every wait: %q", r, p)
		}
		logs[r].mu.Lock()
		got := logs[r].buckets
		logs[r].mu.Unlock()
		if len(got) != 2 || !slices.Equal(got[0].Tensors, []string{"layer1.weight"}) || !slices.Equal(got[1].Tensors, []string{"layer1.bias"}) {
			t.Fatalf("rank %d: buckets %+v, want [layer1.weight] then [layer1.bias]", r, got)
		}
		for _, b := range got {
			times := []time.Time{b.Closed, b.Started, b.Packed, b.Reduced, b.Done}
			if b.Err != nil || b.Closed.IsZero() || !slices.IsSortedFunc(times, time.Time.Compare) {
				t.Errorf("rank %d bucket %q: err %v, phases not in order: %v", r, b.Tensors, b.Err, times)
			}
		}
		if got[0].Bytes != 16 || got[1].Bytes != 8 {
			t.Errorf("rank %d: bucket bytes %d and %d, want 16 and 8", r, got[0].Bytes, got[1].Bytes)
		}
	}
}
