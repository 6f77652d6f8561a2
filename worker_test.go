package gyre_test

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

	quicgo "github.com/quic-go/quic-go"
	"go.uber.org/goleak"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/gyretest"
	"github.com/gyre-ml/gyre/internal/launch"
	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/quic"
	"github.com/gyre-ml/gyre/transport/transporttest"
)

// The multi-worker tests of package gyre, through the gyretest harness.

// counter is gyre.Metadata for tests: an epoch counter and a label.
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

func randomF64(seed uint64, n int) []float64 {
	rng := rand.New(rand.NewPCG(seed, 0))
	v := make([]float64, n)
	for i := range v {
		v[i] = rng.NormFloat64()
	}
	return v
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

func TestJoinBroadcastsRankZeroState(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const n = 4
	params := make([][]float64, n)
	bias := make([][]float32, n)
	meta := make([]*counter, n)
	ws := gyretest.MakeCluster(t, gyretest.Options{N: n, Transport: gyretest.QUIC, Options: func(r int) []gyre.Option {
		// Every worker starts from its own random weights.
		params[r] = randomF64(uint64(r)+1, 1000)
		bias[r] = []float32{float32(r), float32(r) * 2}
		meta[r] = &counter{epoch: int64(r) + 10, label: fmt.Sprint("rank", r)}
		return []gyre.Option{gyre.WithState(gyre.NewState().Float64("w", params[r]).Float32("b", bias[r]).Meta("counter", meta[r]))}
	}}).Workers
	want := randomF64(1, 1000)
	for r, w := range ws {
		if !slices.Equal(params[r], want) || !slices.Equal(bias[r], []float32{0, 0}) {
			t.Errorf("rank %d does not hold rank 0's tensors after gyre.Join", r)
		}
		if *meta[r] != (counter{epoch: 10, label: "rank0"}) {
			t.Errorf("rank %d metadata = %+v, want rank 0's", r, *meta[r])
		}
		if w.Size() != n || w.Rank() != r || w.Iter() != 0 {
			t.Errorf("rank %d: size %d rank %d iter %d", r, w.Size(), w.Rank(), w.Iter())
		}
	}
	errs := gyretest.Each(ws, func(_ int, w *gyre.Worker) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return w.Leave(ctx)
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("Leave: %v", err)
	}
}

func TestJoinRejectsDifferentState(t *testing.T) {
	errs := gyretest.Start(t, gyretest.Options{N: 3, Options: func(r int) []gyre.Option {
		n := 8
		if r == 2 {
			n = 9
		}
		return []gyre.Option{gyre.WithState(gyre.NewState().Float64("w", make([]float64, n)))}
	}}).Errs
	for r, err := range errs {
		// The tensor, with both shapes.
		if !errors.Is(err, gyre.ErrDiverged) || !containsAll(err.Error(), "rank 2", `state entry "w"`, "float64[9] at rank 2", "float64[8] at rank 0") {
			t.Errorf("rank %d: gyre.Join = %v, want gyre.ErrDiverged naming rank 2's tensor w and both shapes", r, err)
		}
	}
}

func TestJoinRejectsDifferentBatchSettings(t *testing.T) {
	errs := gyretest.Start(t, gyretest.Options{N: 3, Config: func(r int, c *gyre.Config) {
		if r == 1 {
			c.RNGSeed = 99
		}
	}}).Errs
	for r, err := range errs {
		// The field, with both values, and no list of suspects.
		if !errors.Is(err, gyre.ErrDiverged) || !containsAll(err.Error(), "rank 1", "RNGSeed (--rng-seed)", "99 at rank 1", "0 at rank 0") ||
			strings.Contains(err.Error(), "GlobalBatch") {
			t.Errorf("rank %d: gyre.Join = %v, want gyre.ErrDiverged naming rank 1's RNGSeed and both values", r, err)
		}
	}
}

// TestWeightedMean checks that AllReduceAsync applies bᵢ/B: with unequal
// shares, one of them 0 and its local mean NaN, every worker gets the
// sample-weighted global mean.
func TestWeightedMean(t *testing.T) {
	shares := []int{5, 3, 0, 8}
	ws := gyretest.MakeCluster(t, gyretest.Options{N: 4, Config: func(_ int, c *gyre.Config) { c.Shares = shares }}).Workers
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
	errs := gyretest.Each(ws, func(r int, w *gyre.Worker) error {
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
	ws := gyretest.MakeCluster(t, gyretest.Options{N: 1}).Workers
	w := ws[0]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	w.AllReduceAsync(ctx, "a", []float32{1})
	h := w.AllReduceAsync64(ctx, "b", []float64{1})
	if err := h.Wait(ctx); !errors.Is(err, gyre.ErrConfig) || !containsAll(err.Error(), `"b"`, "one gradient type") {
		t.Fatalf("mixed types: Wait = %v", err)
	}
	if err := w.Wait(ctx); err == nil {
		t.Fatal("Wait hid the failed submission")
	}
}

func TestBoundaryNeedsIdle(t *testing.T) {
	ws := gyretest.MakeCluster(t, gyretest.Options{N: 1}).Workers
	w := ws[0]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	w.AllReduceAsync(ctx, "a", []float32{1})
	if _, err := w.Boundary(ctx); !errors.Is(err, gyre.ErrPending) {
		t.Fatalf("Boundary with pending gradients = %v, want gyre.ErrPending", err)
	}
	if err := w.Commit(); !errors.Is(err, gyre.ErrPending) {
		t.Fatalf("Commit with pending gradients = %v, want gyre.ErrPending", err)
	}
	if err := w.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	ch, err := w.Boundary(ctx)
	if err != nil || ch.Iter != 1 || ch.Redo || ch.ViewChanged || ch.SharesChanged {
		t.Fatalf("Boundary = %+v, %v", ch, err)
	}
	w.Close()
	if _, err := w.Boundary(ctx); !errors.Is(err, gyre.ErrClosed) {
		t.Fatalf("Boundary after Close = %v", err)
	}
}

// TestBoundaryCatchesDivergence has one worker go back to an old commit
// alone: every worker's Boundary then fails with gyre.ErrDiverged.
func TestBoundaryCatchesDivergence(t *testing.T) {
	ws := gyretest.MakeCluster(t, gyretest.Options{N: 3}).Workers
	step := func(f func(r int, w *gyre.Worker) error) []error {
		return gyretest.Each(ws, func(r int, w *gyre.Worker) error {
			return f(r, w)
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 2 {
		if err := errors.Join(step(func(_ int, w *gyre.Worker) error { _, err := w.Boundary(ctx); return err })...); err != nil {
			t.Fatal(err)
		}
	}
	if err := ws[1].Restore(); err != nil || ws[1].Iter() != 0 {
		t.Fatalf("Restore = %v, iter %d", err, ws[1].Iter())
	}
	for r, err := range step(func(_ int, w *gyre.Worker) error { _, err := w.Boundary(ctx); return err }) {
		if !errors.Is(err, gyre.ErrDiverged) {
			t.Errorf("rank %d: Boundary = %v, want gyre.ErrDiverged", r, err)
		}
	}
}

// TestJoinTimesOutNamingTheMissingWorker starts one worker of two: gyre.Join
// gives up after JoinTimeout and says which rank never came.
func TestJoinTimesOutNamingTheMissingWorker(t *testing.T) {
	peers, err := launch.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = gyre.Join(context.Background(), gyre.Config{Key: gyretest.Key(t), Peers: peers, JoinTimeout: time.Second, Logger: quiet()})
	if !errors.Is(err, context.DeadlineExceeded) || !containsAll(err.Error(), "rank 1", peers[1], "gave up after JoinTimeout 1s") {
		t.Fatalf("gyre.Join = %v, want a deadline naming rank 1", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("gyre.Join took %v with a 1 s timeout", d)
	}
}

// TestCompressedGradients checks gyre.Config.Compress: float32 gradients come
// back as the weighted mean within bf16 rounding, identical on every
// worker; float64 gradients are not compressed.
func TestCompressedGradients(t *testing.T) {
	ws := gyretest.MakeCluster(t, gyretest.Options{N: 3, Config: func(_ int, c *gyre.Config) { c.Compress = "bf16"; c.Shares = []int{2, 1, 1}; c.GlobalBatch = 4 }}).Workers
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
	errs := gyretest.Each(ws, func(r int, w *gyre.Worker) error {
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
	ws := gyretest.MakeCluster(t, gyretest.Options{N: 3, Config: func(_ int, c *gyre.Config) { c.Shares = []int{5, 0, 3} }}).Workers
	gather := func(row func(r int) []float64) ([][][]float64, []error) {
		got := make([][][]float64, len(ws))
		errs := gyretest.Each(ws, func(r int, w *gyre.Worker) error {
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
	w := gyretest.MakeCluster(t, gyretest.Options{N: 1}).Workers[0]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	w.AllReduceAsync(ctx, "g", []float32{1})
	if _, err := w.AllGather64(ctx, []float64{1}); !errors.Is(err, gyre.ErrPending) {
		t.Fatalf("AllGather64 with gradients pending = %v, want gyre.ErrPending", err)
	}
	if err := w.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestBoundaryOutcomeAgreement: rank 1 fails a collective that rank 0, the
// broadcast's root, completes. Both must report the same outcome at the
// boundary: an gyre.IterationError naming rank 1, with the iteration not
// advanced on either.
func TestBoundaryOutcomeAgreement(t *testing.T) {
	ws := gyretest.MakeCluster(t, gyretest.Options{N: 2}).Workers
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done, stop := context.WithCancel(ctx)
	stop()
	buf := make([]float64, 64)
	if err := ring.Broadcast(ctx, gyre.DataComm(ws[0]), 0, buf); err != nil {
		t.Fatalf("root's broadcast: %v", err)
	}
	err := ring.Broadcast(done, gyre.DataComm(ws[1]), 0, buf)
	if err == nil {
		t.Fatal("rank 1's broadcast with an ended context succeeded")
	}
	gyre.FailIteration(ws[1], err) // as Wait records a failed bucket
	errs := gyretest.Each(ws, func(_ int, w *gyre.Worker) error {
		_, err := w.Boundary(ctx)
		return err
	})
	for r, err := range errs {
		var ie *gyre.IterationError
		if !errors.As(err, &ie) || !errors.Is(err, gyre.ErrIterationFailed) {
			t.Fatalf("rank %d: Boundary = %v, want an gyre.IterationError", r, err)
		}
		if !slices.Equal(ie.Ranks, []int{1}) || !slices.Equal(ie.Reasons, []string{"canceled"}) || ie.Iter != 0 {
			t.Errorf("rank %d: outcome %+v, want iteration 0 failed on rank 1 (canceled)", r, ie)
		}
		if (ie.Local != nil) != (r == 1) {
			t.Errorf("rank %d: Local = %v", r, ie.Local)
		}
		if ws[r].Iter() != 0 {
			t.Errorf("rank %d advanced to iteration %d after a failed one", r, ws[r].Iter())
		}
	}
}

// TestBoundaryComparesStates: a worker whose state drifts fails every
// worker's boundary with gyre.ErrDiverged naming it, and the digests of equal
// states pass.
func TestBoundaryComparesStates(t *testing.T) {
	params := make([][]float64, 3)
	ws := gyretest.MakeCluster(t, gyretest.Options{N: 3, Options: func(r int) []gyre.Option {
		params[r] = randomF64(uint64(r)+1, 100)
		return []gyre.Option{gyre.WithState(gyre.NewState().Float64("w", params[r]))}
	}}).Workers
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	boundary := func(_ int, w *gyre.Worker) error {
		// An iteration long enough that hashing stays within its budget,
		// so this boundary checks the states.
		time.Sleep(100 * time.Millisecond)
		_, err := w.Boundary(ctx)
		return err
	}
	if err := errors.Join(gyretest.Each(ws, boundary)...); err != nil {
		t.Fatalf("equal states: %v", err)
	}
	params[2][17] += 1e-12
	// Hashing that a loaded machine stalls may push the next check a
	// boundary or two further (its cost over the iteration's sets the
	// interval); every rank still meets it at the same boundary.
	for range 10 {
		errs := gyretest.Each(ws, boundary)
		if errors.Join(errs...) == nil {
			continue // not checked at this boundary, on any rank
		}
		for r, err := range errs {
			if !errors.Is(err, gyre.ErrDiverged) || !containsAll(err.Error(), "rank 2", "different state") {
				t.Errorf("rank %d: Boundary = %v, want gyre.ErrDiverged naming rank 2's state", r, err)
			}
		}
		return
	}
	t.Fatal("10 boundaries after the states diverged, none checked them")
}

// TestCloseWhileSubmitting closes a worker from another goroutine while
// its trainer submits gradients: no data race, and submissions after the
// close fail with gyre.ErrClosed instead of hanging.
func TestCloseWhileSubmitting(t *testing.T) {
	for range 10 {
		ws := gyretest.MakeCluster(t, gyretest.Options{N: 2}).Workers
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			ws[0].Close()
		}()
		var last error
		for range 200 {
			h := ws[0].AllReduceAsync(ctx, "g", make([]float32, 1024))
			if err := h.Wait(ctx); err != nil {
				last = err
			}
			if errors.Is(last, gyre.ErrClosed) || errors.Is(last, ring.ErrClosed) {
				break
			}
		}
		wg.Wait()
		if err := ws[0].AllReduceAsync(ctx, "g", make([]float32, 8)).Wait(ctx); !errors.Is(err, gyre.ErrClosed) {
			t.Fatalf("allreduce after Close = %v, want gyre.ErrClosed", err)
		}
		cancel()
	}
}

// TestWaitTimeoutThenAbandon: a Wait that gives up before a late peer
// arrives must not abort the collective; after Abandon on every worker the
// next iteration works everywhere and gives the right answer.
func TestWaitTimeoutThenAbandon(t *testing.T) {
	ws := gyretest.MakeCluster(t, gyretest.Options{N: 2}).Workers
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := gyretest.Each(ws, func(r int, w *gyre.Worker) error {
		w.Batch()
		g := []float64{float64(r + 1)}
		if r == 1 {
			time.Sleep(500 * time.Millisecond) // late, not dead
		}
		w.AllReduceAsync64(ctx, "g", g)
		if r == 0 {
			short, stop := context.WithTimeout(ctx, 50*time.Millisecond)
			err := w.Wait(short)
			stop()
			if !errors.Is(err, context.DeadlineExceeded) {
				return errors.Join(errors.New("impatient Wait did not time out"), err)
			}
		}
		if err := w.Abandon(ctx); err != nil {
			return err
		}
		w.Batch()
		g[0] = float64(r + 1)
		w.AllReduceAsync64(ctx, "g", g)
		if err := w.Wait(ctx); err != nil {
			return err
		}
		if g[0] != 1.5 { // equal shares: (1 + 2) / 2
			return errors.New("wrong mean after Abandon")
		}
		_, err := w.Boundary(ctx)
		return err
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// TestLateWorkerIsWaitedFor: over mem and over QUIC on loopback, a worker
// that reaches the allreduce 5 s after the others (slower than any
// deadline the ring used to have) does not fail it, since it keeps
// answering heartbeats.
func TestLateWorkerIsWaitedFor(t *testing.T) {
	for _, transport := range []string{gyretest.Mem, gyretest.QUIC} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			ws := gyretest.MakeCluster(t, gyretest.Options{N: 3, Transport: transport, Config: func(_ int, c *gyre.Config) { c.GlobalBatch = 3 }}).Workers
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			errs := gyretest.Each(ws, func(r int, w *gyre.Worker) error {
				w.Batch()
				if r == 2 {
					time.Sleep(5 * time.Second) // evaluation, a checkpoint, a GC pause
				}
				g := []float64{float64(r)}
				w.AllReduceAsync64(ctx, "g", g)
				if err := w.Wait(ctx); err != nil {
					return err
				}
				if g[0] != 1 { // equal shares: (0 + 1 + 2) / 3
					return errors.New("wrong mean")
				}
				_, err := w.Boundary(ctx)
				return err
			})
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestLateBeyondCollectiveTimeout: with CollectiveTimeout below the delay,
// the waiting worker fails with a TimeoutError naming the late one, and
// the boundary fails on both (the vote waits no longer than any other
// collective).
func TestLateBeyondCollectiveTimeout(t *testing.T) {
	ws := gyretest.MakeCluster(t, gyretest.Options{N: 2, Config: func(_ int, c *gyre.Config) { c.CollectiveTimeout = 500 * time.Millisecond }}).Workers
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	waits := make([]error, 2)
	errs := gyretest.Each(ws, func(r int, w *gyre.Worker) error {
		if r == 1 {
			time.Sleep(1500 * time.Millisecond)
		}
		w.AllReduceAsync64(ctx, "g", []float64{1})
		waits[r] = w.Wait(ctx)
		_, err := w.Boundary(ctx)
		return err
	})
	var te *ring.TimeoutError
	if !errors.As(waits[0], &te) || te.Rank != 1 || string(te.Peer) != ws[1].View().Members[1] {
		t.Fatalf("rank 0: Wait = %v, want a TimeoutError naming rank 1", waits[0])
	}
	for r, err := range errs {
		if !errors.Is(err, ring.ErrTimeout) && !errors.Is(err, gyre.ErrIterationFailed) {
			t.Errorf("rank %d: Boundary = %v, want it failed by the timeout", r, err)
		}
	}
}

// TestFrozenWorkerIsLost: a worker frozen mid-iteration (SIGSTOP) makes
// every survivor's boundary fail with a gyre.PeerLostError naming its rank,
// within about PeerTimeout.
func TestFrozenWorkerIsLost(t *testing.T) {
	const victim = 1
	c := gyretest.MakeCluster(t, gyretest.Options{N: 3, Config: func(_ int, c *gyre.Config) { c.PeerTimeout = 300 * time.Millisecond }})
	ws := c.Workers
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	victimID := c.IDs[victim]
	t.Cleanup(func() { c.Thaw(t, victim) })
	c.Freeze(t, victim)
	start := time.Now()
	took := make([]time.Duration, len(ws))
	errs := gyretest.Each(ws, func(r int, w *gyre.Worker) error {
		if r == victim {
			return nil // stopped
		}
		w.AllReduceAsync64(ctx, "g", []float64{1})
		w.Wait(ctx)
		_, err := w.Boundary(ctx)
		took[r] = time.Since(start)
		return err
	})
	for r, err := range errs {
		if r == victim {
			continue
		}
		var pl *gyre.PeerLostError
		if !errors.As(err, &pl) || pl.Rank != victim || pl.Peer != victimID || !errors.Is(err, transport.ErrPeerGone) {
			t.Errorf("rank %d: Boundary = %v, want a gyre.PeerLostError naming rank %d", r, err, victim)
		}
		if took[r] > 3*time.Second {
			t.Errorf("rank %d took %v", r, took[r])
		}
	}
}

// TestCrashIsBlamedNotTheSurvivorThatGaveUp: rank 1 crashes and, 20 ms
// later, so do ranks 2 and 3, as survivors that saw it first and exited
// on the error. Rank 0's ring (order 0-2-1-3) never touches rank 1: its
// allreduce fails on rank 2, yet it names rank 1, whose heartbeat
// connection broke first. The peer timeout is long, so silence cannot be
// what decides.
func TestCrashIsBlamedNotTheSurvivorThatGaveUp(t *testing.T) {
	c := gyretest.MakeCluster(t, gyretest.Options{N: 4, Config: func(_ int, c *gyre.Config) { c.PeerTimeout = 10 * time.Second }})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	w := c.Workers[0]
	if err := gyre.DataComm(w).SetOrder([]int{0, 2, 1, 3}); err != nil {
		t.Fatal(err)
	}
	c.Kill(t, 1)
	time.Sleep(20 * time.Millisecond)
	c.Kill(t, 2)
	c.Kill(t, 3)
	w.AllReduceAsync64(ctx, "g", make([]float64, 1<<20)) // large enough for the ring
	err := w.Wait(ctx)
	var pl *gyre.PeerLostError
	if !errors.As(err, &pl) || pl.Rank != 1 || pl.Peer != c.IDs[1] {
		t.Fatalf("rank 0: Wait = %v, want a gyre.PeerLostError naming rank 1", err)
	}
}

// toy is a linear least-squares model trained with SGD and momentum: small
// enough to check exactly, with state of every kind.
type toy struct {
	theta, mom []float64
	steps      *counter
}

const toyDim = 8

func newToy() *toy {
	return &toy{theta: make([]float64, toyDim), mom: make([]float64, toyDim), steps: &counter{}}
}

func (m *toy) state() *gyre.State {
	return gyre.NewState().Float64("theta", m.theta).Float64("momentum", m.mom).Meta("steps", m.steps)
}

// grad returns the mean gradient of ½(x·θ - y)² over the samples.
func (m *toy) grad(idx []int64) []float64 {
	g := make([]float64, toyDim)
	x := make([]float64, toyDim)
	for _, i := range idx {
		rng := rand.New(rand.NewPCG(uint64(i), 3))
		y := 0.0
		for j := range x {
			x[j] = rng.NormFloat64()
			y += x[j] * float64(j+1)
		}
		pred := 0.0
		for j := range x {
			pred += x[j] * m.theta[j]
		}
		for j := range g {
			g[j] += (pred - y) * x[j]
		}
	}
	for j := range g {
		g[j] /= float64(max(len(idx), 1))
	}
	return g
}

func (m *toy) step(g []float64) {
	for j := range m.theta {
		m.mom[j] = 0.9*m.mom[j] + g[j]
		m.theta[j] -= 0.05 * m.mom[j]
	}
	m.steps.epoch++
}

// train runs iters iterations of the toy on w. If failAt >= 0, the
// iteration failAt fails midway once, on every worker: after submitting
// half of the gradient and corrupting the model, as a trainer whose own
// code errs would; the trainer abandons it and redoes it.
func train(ctx context.Context, w *gyre.Worker, m *toy, iters, failAt int64, check func(*toy) error) error {
	failed := false
	var abandoned []int64 // the indices of the abandoned attempt
	for w.Iter() < iters {
		b := w.Batch()
		if w.Iter() == failAt && failed && !slices.Equal(b.Indices, abandoned) {
			return fmt.Errorf("the redone iteration %d got indices %v, the abandoned one %v", failAt, b.Indices, abandoned)
		}
		g := m.grad(b.Indices)
		if w.Iter() == failAt && !failed {
			failed = true
			abandoned = slices.Clone(b.Indices)
			committed := &toy{theta: slices.Clone(m.theta), mom: slices.Clone(m.mom), steps: &counter{m.steps.epoch, m.steps.label}}
			w.AllReduceAsync64(ctx, "g0", g[:toyDim/2])
			m.theta[0], m.mom[3], m.steps.epoch = 1e9, -1, 99
			if err := w.Abandon(ctx); err != nil {
				return err
			}
			if w.Iter() != failAt || !slices.Equal(m.theta, committed.theta) || !slices.Equal(m.mom, committed.mom) ||
				*m.steps != *committed.steps {
				return fmt.Errorf("Abandon did not restore the commit: iter %d", w.Iter())
			}
			continue
		}
		w.AllReduceAsync64(ctx, "g0", g[:toyDim/2])
		w.AllReduceAsync64(ctx, "g1", g[toyDim/2:])
		if err := w.Wait(ctx); err != nil {
			return err
		}
		m.step(g)
		if _, err := w.Boundary(ctx); err != nil {
			return err
		}
		if err := w.Commit(); err != nil {
			return err
		}
	}
	return nil
}

// TestStaticAbandonAfterAFailureFails: a static view stays fail-fast.
// After a collective failed (here sizes that differ), Abandon returns
// the failure instead of restoring, and the iteration stays where it was.
func TestStaticAbandonAfterAFailureFails(t *testing.T) {
	c := gyretest.MakeCluster(t, gyretest.Options{N: 2})
	errs := c.Run(func(r int, w *gyre.Worker) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		w.Batch()
		w.AllReduceAsync64(ctx, "g", make([]float64, 8+r))
		if err := w.Wait(ctx); !errors.Is(err, ring.ErrMismatch) {
			return fmt.Errorf("rank %d: Wait returned %v, want a mismatch", r, err)
		}
		if err := w.Abandon(ctx); !errors.Is(err, ring.ErrMismatch) {
			return fmt.Errorf("rank %d: Abandon after the failure returned %v, want the mismatch", r, err)
		}
		if w.Iter() != 0 {
			return fmt.Errorf("rank %d: at iteration %d after Abandon, want 0", r, w.Iter())
		}
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// TestAbandonAndRedo checks that an iteration abandoned midway and redone
// ends exactly where an uninterrupted run does, on every worker.
func TestAbandonAndRedo(t *testing.T) {
	shares := []int{7, 2, 0, 5}
	run := func(failAt int64) [][]float64 {
		models := make([]*toy, len(shares))
		ws := gyretest.MakeCluster(t, gyretest.Options{N: len(shares), Config: func(_ int, c *gyre.Config) { c.Shares = shares; c.DatasetSize = 100 },
			Options: func(r int) []gyre.Option {
				models[r] = newToy()
				return []gyre.Option{gyre.WithState(models[r].state())}
			}}).Workers
		errs := gyretest.Each(ws, func(r int, w *gyre.Worker) error {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			return train(ctx, w, models[r], 12, failAt, nil)
		})
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		out := make([][]float64, len(models))
		for r, m := range models {
			if m.steps.epoch != 12 {
				t.Fatalf("rank %d took %d steps, want 12", r, m.steps.epoch)
			}
			out[r] = m.theta
		}
		return out
	}
	clean, redone := run(-1), run(5)
	for r := range clean {
		if !slices.Equal(clean[r], clean[0]) || !slices.Equal(redone[r], clean[0]) {
			t.Fatalf("rank %d: uninterrupted %v, redone %v, rank 0 %v", r, clean[r], redone[r], clean[0])
		}
	}
}

// TestJoinNamesARefusedPeer: a worker of the view with another cluster
// secret dials once and goes away. The good worker's Join does not wait
// for it until JoinTimeout: its transport refused that worker's
// connection, so Join fails at once with ErrUnauthenticated naming its
// rank. The odd worker here presents its certificate without checking the
// server's first (as a worker whose check passed would), so the refusal
// carries the name it claims; and it never listens, so the good worker's
// dials to it find nobody and only the refusal can tell it what is wrong.
func TestJoinNamesARefusedPeer(t *testing.T) {
	t.Parallel()
	peers, err := launch.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := gyre.Join(context.Background(), gyre.Config{Key: gyretest.Key(t), Peers: peers, Rank: 0, JoinTimeout: time.Minute, Logger: quiet()})
		done <- err
	}()
	tc := transporttest.Issue(t, transporttest.NewCA(t), peers[1]).ClientTLS(quic.ALPN)
	tc.InsecureSkipVerify = true
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		dctx, dcancel := context.WithTimeout(ctx, 300*time.Millisecond)
		conn, err := quicgo.DialAddr(dctx, peers[0], tc, nil)
		dcancel()
		if err == nil {
			<-conn.Context().Done() // refused after the handshake
			break
		}
		if strings.Contains(err.Error(), "CRYPTO_ERROR") {
			break
		}
	}
	err = <-done
	if !errors.Is(err, transport.ErrUnauthenticated) || !containsAll(err.Error(), "rank 1", peers[1], "did not issue", "secrets differ") {
		t.Fatalf("Join = %v, want ErrUnauthenticated naming rank 1", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("Join took %v", d)
	}
}

func TestJoinRejectsBadConfig(t *testing.T) {
	_, err := gyre.Join(context.Background(), gyre.Config{Key: gyretest.Key(t), Shares: []int{3, 4}})
	if !errors.Is(err, gyre.ErrConfig) {
		t.Fatalf("Join = %v, want ErrConfig", err)
	}
	if _, err := gyre.Join(context.Background(), gyre.Config{Key: gyretest.Key(t)}, gyre.WithState(gyre.NewState().Float64("x", nil).Float64("x", nil))); !errors.Is(err, gyre.ErrConfig) {
		t.Fatalf("duplicate state: Join = %v, want ErrConfig", err)
	}
}
