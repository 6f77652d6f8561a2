package gyre

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gyre-ml/gyre/internal/launch"
	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/mem"
	"github.com/gyre-ml/gyre/transport/transporttest"
)

// counter is Metadata for tests: an epoch counter and a label.
type counter struct {
	epoch int64
	label string
}

func (c *counter) MarshalBinary() ([]byte, error) {
	return append(binary.LittleEndian.AppendUint64(nil, uint64(c.epoch)), c.label...), nil
}

func (c *counter) UnmarshalBinary(b []byte) error {
	if len(b) < 8 {
		return errors.New("short counter")
	}
	c.epoch, c.label = int64(binary.LittleEndian.Uint64(b)), string(b[8:])
	return nil
}

// cluster describes a test job: how many workers, over which transport,
// and each worker's config and options.
type cluster struct {
	n       int
	quic    bool // real QUIC on loopback; otherwise the in-memory transport
	adjust  func(rank int, c *Config)
	options func(rank int) []Option
	onNet   func(*mem.Network) // called with the in-memory network, if any
}

// start joins every worker concurrently and returns them in rank order,
// or the Join errors.
func (cl cluster) start(t *testing.T) ([]*Worker, []error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	peers := make([]string, cl.n)
	var key string
	var net *mem.Network
	if cl.quic {
		addrs, err := launch.FreePorts(cl.n)
		if err != nil {
			t.Fatal(err)
		}
		copy(peers, addrs)
		key = testKey(t)
	} else {
		net = mem.NewNetwork(1)
		if cl.onNet != nil {
			cl.onNet(net)
		}
		for r := range peers {
			peers[r] = fmt.Sprintf("127.0.0.1:%d", 1000+r)
		}
	}
	workers := make([]*Worker, cl.n)
	errs := make([]error, cl.n)
	var wg sync.WaitGroup
	for r := range cl.n {
		cfg := Config{Key: key, Peers: peers, Rank: r, Logger: transporttest.Logger(t)}
		if cl.adjust != nil {
			cl.adjust(r, &cfg)
		}
		var opts []Option
		if cl.options != nil {
			opts = cl.options(r)
		}
		if net != nil {
			tr, err := net.Join(transport.PeerID(peers[r]))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { tr.Close() })
			opts = append(opts, WithTransport(tr))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			workers[r], errs[r] = Join(ctx, cfg, opts...)
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, w := range workers {
			if w != nil {
				w.Close()
			}
		}
	})
	return workers, errs
}

// mustStart is start for jobs that must join.
func (cl cluster) mustStart(t *testing.T) []*Worker {
	t.Helper()
	ws, errs := cl.start(t)
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("Join: %v", err)
	}
	return ws
}

// each runs f on every worker concurrently and returns the errors.
func each(ws []*Worker, f func(r int, w *Worker) error) []error {
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for r, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = f(r, w)
		}()
	}
	wg.Wait()
	return errs
}

func randomF64(seed uint64, n int) []float64 {
	rng := rand.New(rand.NewPCG(seed, 0))
	v := make([]float64, n)
	for i := range v {
		v[i] = rng.NormFloat64()
	}
	return v
}

func TestJoinBroadcastsRankZeroState(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const n = 4
	params := make([][]float64, n)
	bias := make([][]float32, n)
	meta := make([]*counter, n)
	ws := cluster{n: n, quic: true, options: func(r int) []Option {
		// Every worker starts from its own random weights.
		params[r] = randomF64(uint64(r)+1, 1000)
		bias[r] = []float32{float32(r), float32(r) * 2}
		meta[r] = &counter{epoch: int64(r) + 10, label: fmt.Sprint("rank", r)}
		return []Option{WithState(NewState().Float64("w", params[r]).Float32("b", bias[r]).Meta("counter", meta[r]))}
	}}.mustStart(t)
	want := randomF64(1, 1000)
	for r, w := range ws {
		if !slices.Equal(params[r], want) || !slices.Equal(bias[r], []float32{0, 0}) {
			t.Errorf("rank %d does not hold rank 0's tensors after Join", r)
		}
		if *meta[r] != (counter{epoch: 10, label: "rank0"}) {
			t.Errorf("rank %d metadata = %+v, want rank 0's", r, *meta[r])
		}
		if w.Size() != n || w.Rank() != r || w.Iter() != 0 {
			t.Errorf("rank %d: size %d rank %d iter %d", r, w.Size(), w.Rank(), w.Iter())
		}
	}
	errs := each(ws, func(_ int, w *Worker) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return w.Leave(ctx)
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("Leave: %v", err)
	}
}

func TestJoinRejectsDifferentState(t *testing.T) {
	_, errs := cluster{n: 3, options: func(r int) []Option {
		n := 8
		if r == 2 {
			n = 9
		}
		return []Option{WithState(NewState().Float64("w", make([]float64, n)))}
	}}.start(t)
	for r, err := range errs {
		if !errors.Is(err, ErrDiverged) || !containsAll(err.Error(), "rank 2", "different state") {
			t.Errorf("rank %d: Join = %v, want ErrDiverged naming rank 2's state", r, err)
		}
	}
}

func TestJoinRejectsDifferentBatchSettings(t *testing.T) {
	_, errs := cluster{n: 3, adjust: func(r int, c *Config) {
		if r == 1 {
			c.RNGSeed = 99
		}
	}}.start(t)
	for r, err := range errs {
		if !errors.Is(err, ErrDiverged) || !containsAll(err.Error(), "rank 1", "batch settings") {
			t.Errorf("rank %d: Join = %v, want ErrDiverged naming rank 1's settings", r, err)
		}
	}
}

func TestJoinRejectsBadConfig(t *testing.T) {
	_, err := Join(context.Background(), Config{Key: testKey(t), Shares: []int{3, 4}})
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("Join = %v, want ErrConfig", err)
	}
	if _, err := Join(context.Background(), Config{Key: testKey(t)}, WithState(NewState().Float64("x", nil).Float64("x", nil))); !errors.Is(err, ErrConfig) {
		t.Fatalf("duplicate state: Join = %v, want ErrConfig", err)
	}
}

// TestWeightedMean checks that AllReduceAsync applies bᵢ/B: with unequal
// shares, one of them 0 and its local mean NaN, every worker gets the
// sample-weighted global mean.
func TestWeightedMean(t *testing.T) {
	shares := []int{5, 3, 0, 8}
	ws := cluster{n: 4, adjust: func(_ int, c *Config) { c.Shares = shares }}.mustStart(t)
	const n = 50
	grads := make([][]float64, len(ws))
	want := make([]float64, n)
	for r := range ws {
		grads[r] = randomF64(uint64(r)+7, n)
		if shares[r] == 0 {
			for i := range grads[r] {
				grads[r][i] = math.NaN() // a mean over no samples
			}
			continue
		}
		for i, g := range grads[r] {
			want[i] += g * float64(shares[r]) / 16
		}
	}
	errs := each(ws, func(r int, w *Worker) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		b := w.Batch()
		if b.Share != shares[r] || b.Global != 16 || len(b.Indices) != shares[r] {
			return fmt.Errorf("batch %+v", b)
		}
		h := w.AllReduceAsync64(ctx, "g0", grads[r][:20])
		w.AllReduceAsync64(ctx, "g1", grads[r][20:])
		if err := w.Wait(ctx); err != nil {
			return err
		}
		if err := h.Wait(ctx); err != nil {
			return err
		}
		_, err := w.Boundary(ctx)
		return err
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for r := range ws {
		for i, g := range grads[r] {
			if math.Abs(g-want[i]) > 1e-12 {
				t.Fatalf("rank %d element %d = %v, want %v", r, i, g, want[i])
			}
		}
		if !slices.Equal(grads[r], grads[0]) {
			t.Fatalf("rank %d differs from rank 0", r)
		}
	}
}

func TestOneGradientType(t *testing.T) {
	ws := cluster{n: 1}.mustStart(t)
	w := ws[0]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	w.AllReduceAsync(ctx, "a", []float32{1})
	h := w.AllReduceAsync64(ctx, "b", []float64{1})
	if err := h.Wait(ctx); !errors.Is(err, ErrConfig) || !containsAll(err.Error(), `"b"`, "one gradient type") {
		t.Fatalf("mixed types: Wait = %v", err)
	}
	if err := w.Wait(ctx); err == nil {
		t.Fatal("Wait hid the failed submission")
	}
}

func TestBoundaryNeedsIdle(t *testing.T) {
	ws := cluster{n: 1}.mustStart(t)
	w := ws[0]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	w.AllReduceAsync(ctx, "a", []float32{1})
	if _, err := w.Boundary(ctx); !errors.Is(err, ErrPending) {
		t.Fatalf("Boundary with pending gradients = %v, want ErrPending", err)
	}
	if err := w.Commit(); !errors.Is(err, ErrPending) {
		t.Fatalf("Commit with pending gradients = %v, want ErrPending", err)
	}
	if err := w.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	ch, err := w.Boundary(ctx)
	if err != nil || ch.Iter != 1 || ch.Redo || ch.ViewChanged || ch.SharesChanged {
		t.Fatalf("Boundary = %+v, %v", ch, err)
	}
	w.Close()
	if _, err := w.Boundary(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Boundary after Close = %v", err)
	}
}

// TestBoundaryCatchesDivergence has one worker go back to an old commit
// alone: every worker's Boundary then fails with ErrDiverged.
func TestBoundaryCatchesDivergence(t *testing.T) {
	ws := cluster{n: 3}.mustStart(t)
	step := func(f func(r int, w *Worker) error) []error {
		return each(ws, func(r int, w *Worker) error {
			return f(r, w)
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 2 {
		if err := errors.Join(step(func(_ int, w *Worker) error { _, err := w.Boundary(ctx); return err })...); err != nil {
			t.Fatal(err)
		}
	}
	if err := ws[1].Restore(); err != nil || ws[1].Iter() != 0 {
		t.Fatalf("Restore = %v, iter %d", err, ws[1].Iter())
	}
	for r, err := range step(func(_ int, w *Worker) error { _, err := w.Boundary(ctx); return err }) {
		if !errors.Is(err, ErrDiverged) {
			t.Errorf("rank %d: Boundary = %v, want ErrDiverged", r, err)
		}
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// TestJoinTimesOutNamingTheMissingWorker starts one worker of two: Join
// gives up after JoinTimeout and says which rank never came.
func TestJoinTimesOutNamingTheMissingWorker(t *testing.T) {
	peers, err := launch.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = Join(context.Background(), Config{Key: testKey(t), Peers: peers, JoinTimeout: time.Second})
	if !errors.Is(err, context.DeadlineExceeded) || !containsAll(err.Error(), "rank 1", peers[1]) {
		t.Fatalf("Join = %v, want a deadline naming rank 1", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Join took %v with a 1 s timeout", d)
	}
}

// TestCompressedGradients checks Config.Compress: float32 gradients come
// back as the weighted mean within bf16 rounding, identical on every
// worker; float64 gradients are not compressed.
func TestCompressedGradients(t *testing.T) {
	ws := cluster{n: 3, adjust: func(_ int, c *Config) { c.Compress = "bf16"; c.Shares = []int{2, 1, 1}; c.GlobalBatch = 4 }}.mustStart(t)
	const n = 1000
	grads := make([][]float32, len(ws))
	want := make([]float64, n)
	for r := range ws {
		g := randomF64(uint64(r)+1, n)
		grads[r] = make([]float32, n)
		for i := range g {
			grads[r][i] = float32(g[i])
			want[i] += float64(grads[r][i]) * float64([]int{2, 1, 1}[r]) / 4
		}
	}
	errs := each(ws, func(r int, w *Worker) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		w.AllReduceAsync(ctx, "g", grads[r])
		return w.Wait(ctx)
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	exact := 0
	for i := range want {
		// Each value crosses the wire rounded to bf16 (8 significant bits)
		// a few times: allow 4 roundings of the largest term.
		if d := math.Abs(float64(grads[0][i]) - want[i]); d > 4*math.Pow(2, -8)*2 {
			t.Fatalf("element %d = %v, want %v within bf16 rounding", i, grads[0][i], want[i])
		}
		if float64(grads[0][i]) == want[i] {
			exact++
		}
	}
	if exact > n/2 {
		t.Fatalf("%d of %d elements are exact: the gradients were not compressed", exact, n)
	}
	for r := range ws {
		if !slices.Equal(grads[r], grads[0]) {
			t.Fatalf("rank %d differs from rank 0", r)
		}
	}
}

// TestAllGather64 checks the unweighted gather: every worker gets every
// row as given, whatever the shares (one of them 0); rows of different
// lengths fail on every worker; and it refuses to run with gradients
// pending.
func TestAllGather64(t *testing.T) {
	ws := cluster{n: 3, adjust: func(_ int, c *Config) { c.Shares = []int{5, 0, 3} }}.mustStart(t)
	gather := func(row func(r int) []float64) ([][][]float64, []error) {
		got := make([][][]float64, len(ws))
		errs := each(ws, func(r int, w *Worker) error {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var err error
			got[r], err = w.AllGather64(ctx, row(r))
			return err
		})
		return got, errs
	}
	got, errs := gather(func(r int) []float64 { return []float64{float64(r), float64(10 * r)} })
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for r := range ws {
		for q, row := range got[r] {
			if !slices.Equal(row, []float64{float64(q), float64(10 * q)}) {
				t.Fatalf("rank %d got row %d = %v", r, q, row)
			}
		}
	}
	_, errs = gather(func(r int) []float64 { return make([]float64, 2+r%2) })
	for r, err := range errs {
		if !errors.Is(err, ring.ErrMismatch) && !errors.Is(err, ring.ErrAborted) {
			t.Errorf("rank %d: rows of different lengths gave %v, want a mismatch", r, err)
		}
	}
	w := cluster{n: 1}.mustStart(t)[0]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	w.AllReduceAsync(ctx, "g", []float32{1})
	if _, err := w.AllGather64(ctx, []float64{1}); !errors.Is(err, ErrPending) {
		t.Fatalf("AllGather64 with gradients pending = %v, want ErrPending", err)
	}
	if err := w.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}
