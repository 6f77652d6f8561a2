package ring

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/kernels"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/mem"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction(kernels.DefaultWorker))
}

// cluster is n ranks, each with a transport and a Comm, connected to all
// others.
type cluster struct {
	net   *mem.Network
	ids   []transport.PeerID
	trs   []transport.Transport
	comms []*Comm
}

// testConfig is the Config a test rank gets by default: the default
// collective timeout, long enough that tests that expect another failure
// never see a timeout instead.
func testConfig(tb testing.TB, ids []transport.PeerID, r int) Config {
	cfg := Config{Epoch: 1, Members: ids, Rank: r, Logger: zerolog.Nop()}
	if t, ok := tb.(*testing.T); ok {
		cfg.Logger = zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
	}
	return cfg
}

// newCluster starts n ranks over a fresh mem network; adjust, if not nil,
// changes each rank's Config.
func newCluster(tb testing.TB, n int, adjust func(*Config)) *cluster {
	tb.Helper()
	cl := &cluster{net: mem.NewNetwork(1)}
	for r := range n {
		id := transport.PeerID(fmt.Sprintf("r%d", r))
		tr, err := cl.net.Join(id)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { tr.Close() })
		cl.ids = append(cl.ids, id)
		cl.trs = append(cl.trs, tr)
	}
	ctx := context.Background()
	for r, tr := range cl.trs {
		for q, id := range cl.ids {
			if q != r {
				if err := tr.Connect(ctx, id, string(id)); err != nil {
					tb.Fatal(err)
				}
			}
		}
	}
	cl.comms = cl.newComms(tb, cl.ids, adjust)
	return cl
}

// newComms makes a Comm per member of ids over the cluster's transports.
func (cl *cluster) newComms(tb testing.TB, ids []transport.PeerID, adjust func(*Config)) []*Comm {
	tb.Helper()
	comms := make([]*Comm, len(ids))
	for r, id := range ids {
		cfg := testConfig(tb, ids, r)
		if adjust != nil {
			adjust(&cfg)
		}
		c, err := NewComm(cl.trs[cl.index(id)], cfg)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { c.Close() })
		comms[r] = c
	}
	return comms
}

// setLinks sets l on every link between two ranks.
func (cl *cluster) setLinks(l mem.Link) {
	for _, a := range cl.ids {
		for _, b := range cl.ids {
			if a != b {
				cl.net.SetLink(a, b, l)
			}
		}
	}
}

func (cl *cluster) index(id transport.PeerID) int {
	for i, x := range cl.ids {
		if x == id {
			return i
		}
	}
	panic("no such id " + id)
}

// each runs f for every comm concurrently and returns the errors by rank.
func each(comms []*Comm, f func(r int, c *Comm) error) []error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() { errs[r] = f(r, c) })
	}
	wg.Wait()
	return errs
}

func mustAll(tb testing.TB, errs []error) {
	tb.Helper()
	for r, err := range errs {
		if err != nil {
			tb.Fatalf("rank %d: %v", r, err)
		}
	}
}

// randomInputs returns n buffers of length random elements: floats in
// [-1, 1), integers in [-1000, 1000].
func randomInputs[T kernels.Number](rng *rand.Rand, n, length int) [][]T {
	isFloat := T(1)/2 != 0
	bufs := make([][]T, n)
	for r := range bufs {
		b := make([]T, length)
		for i := range b {
			if isFloat {
				b[i] = T(2*rng.Float64() - 1)
			} else {
				b[i] = T(rng.IntN(2001) - 1000)
			}
		}
		bufs[r] = b
	}
	return bufs
}

// epsilon returns the unit roundoff of T, or 0 for integers.
func epsilon[T kernels.Number]() float64 {
	switch wireDType[T]() {
	case wire.DTypeFloat32:
		return 0x1p-23
	case wire.DTypeFloat64:
		return 0x1p-52
	}
	return 0
}

// checkReduced checks got[i] against the reduction by op of the inputs at
// element i, exactly for Min and Max and for integers, and within the
// rounding error summation order allows for float sums.
func checkReduced[T kernels.Number](got []T, inputs [][]T, op wire.Op, from, to int) error {
	n := len(inputs)
	eps := epsilon[T]()
	for i := from; i < to; i++ {
		var ref, abs float64
		var iref T
		for r := range n {
			v := inputs[r][i]
			switch {
			case r == 0:
				iref = v
			case op == wire.OpMin:
				iref = min(iref, v)
			case op == wire.OpMax:
				iref = max(iref, v)
			default:
				iref += v
			}
			ref += float64(v)
			abs += math.Abs(float64(v))
		}
		g := got[i]
		switch {
		case op == wire.OpMin || op == wire.OpMax || eps == 0:
			if g != iref {
				return fmt.Errorf("element %d: got %v, want %v", i, g, iref)
			}
		case op == wire.OpAvg:
			want := ref / float64(n)
			if d := math.Abs(float64(g) - want); d > (float64(n)*abs/float64(n)+math.Abs(want))*eps*2 {
				return fmt.Errorf("element %d: got %v, want %v (off by %g)", i, g, want, d)
			}
		default:
			if d := math.Abs(float64(g) - ref); d > float64(n)*abs*eps {
				return fmt.Errorf("element %d: got %v, want %v (off by %g)", i, g, ref, d)
			}
		}
	}
	return nil
}

// checkIdentical checks that every rank's buffer is bit-identical to rank
// 0's over [from, to).
func checkIdentical[T kernels.Number](bufs [][]T, from, to int) error {
	want := kernels.Bytes(bufs[0][from:to])
	for r := 1; r < len(bufs); r++ {
		if !bytes.Equal(kernels.Bytes(bufs[r][from:to]), want) {
			return fmt.Errorf("rank %d differs from rank 0", r)
		}
	}
	return nil
}

func clone[T any](in [][]T) [][]T {
	out := make([][]T, len(in))
	for i, b := range in {
		out[i] = append([]T(nil), b...)
	}
	return out
}

// testAllReduce runs one allreduce of random inputs on every rank of comms
// and checks it against the reference.
func testAllReduce[T kernels.Number](t *testing.T, comms []*Comm, rng *rand.Rand, op wire.Op, length int) {
	t.Helper()
	inputs := randomInputs[T](rng, len(comms), length)
	bufs := clone(inputs)
	mustAll(t, each(comms, func(r int, c *Comm) error {
		return AllReduce(t.Context(), c, op, bufs[r])
	}))
	if err := checkIdentical(bufs, 0, length); err != nil {
		t.Fatal(err)
	}
	if err := checkReduced(bufs[0], inputs, op, 0, length); err != nil {
		t.Fatal(err)
	}
}

var algos = []struct {
	name  string
	small int
}{
	{"ring", -1},
	{"doubling", math.MaxInt},
}

func TestAllReduceReference(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4, 5, 7, 8, 16} {
		for _, algo := range algos {
			t.Run(fmt.Sprintf("n=%d/%s", n, algo.name), func(t *testing.T) {
				cl := newCluster(t, n, func(c *Config) {
					c.SmallBytes = algo.small
					c.ChunkBytes = 64 // many chunks per segment
				})
				rng := rand.New(rand.NewPCG(uint64(n), 1))
				for _, length := range []int{0, 1, max(n-1, 0), n + 1, 1009} {
					for _, op := range []wire.Op{wire.OpSum, wire.OpMin, wire.OpMax, wire.OpAvg} {
						name := fmt.Sprintf("len=%d/%v", length, op)
						t.Run(name+"/float32", func(t *testing.T) { testAllReduce[float32](t, cl.comms, rng, op, length) })
						t.Run(name+"/float64", func(t *testing.T) { testAllReduce[float64](t, cl.comms, rng, op, length) })
						if op == wire.OpAvg {
							continue
						}
						t.Run(name+"/int32", func(t *testing.T) { testAllReduce[int32](t, cl.comms, rng, op, length) })
						t.Run(name+"/int64", func(t *testing.T) { testAllReduce[int64](t, cl.comms, rng, op, length) })
					}
				}
			})
		}
	}
}

// TestAllReduceLarge runs allreduces of largeLength elements in chunks of
// largeChunkBytes.
func TestAllReduceLarge(t *testing.T) {
	const length = largeLength
	for _, n := range []int{2, 5} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			cl := newCluster(t, n, func(c *Config) { c.ChunkBytes = largeChunkBytes })
			rng := rand.New(rand.NewPCG(uint64(n), 2))
			testAllReduce[float32](t, cl.comms, rng, wire.OpSum, length)
			testAllReduce[float64](t, cl.comms, rng, wire.OpAvg, length)
		})
	}
}

func TestAllReduce64(t *testing.T) {
	cl := newCluster(t, 64, func(c *Config) { c.ChunkBytes = 1 << 10 })
	rng := rand.New(rand.NewPCG(64, 3))
	testAllReduce[float32](t, cl.comms, rng, wire.OpSum, 10007) // the ring
	testAllReduce[int64](t, cl.comms, rng, wire.OpSum, 100)     // recursive doubling
}

// TestKill64 kills one of 64 ranks mid-collective: every survivor fails
// promptly with an error naming it.
func TestKill64(t *testing.T) {
	const n, victim = 64, 10
	cl := newCluster(t, n, func(c *Config) { c.ChunkBytes = 1 << 10 })
	cl.setLinks(mem.Link{Delay: 50 * time.Millisecond})
	go func() {
		time.Sleep(20 * time.Millisecond)
		cl.net.Kill(cl.ids[victim])
	}()
	start := time.Now()
	errs := each(cl.comms, func(r int, c *Comm) error {
		return AllReduce(t.Context(), c, wire.OpSum, make([]float32, 10007))
	})
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("survivors took %v to fail", d)
	}
	for r, err := range errs {
		if peer, _ := transport.PeerOf(err); r != victim && (!errors.Is(err, transport.ErrPeerGone) || peer != cl.ids[victim]) {
			t.Errorf("rank %d: got %v, want a peer error naming %s", r, err, cl.ids[victim])
		}
	}
}

// TestAvgSingle checks that Avg over one rank is the identity.
func TestAvgSingle(t *testing.T) {
	cl := newCluster(t, 1, nil)
	b := []float32{1, 2, 3}
	if err := AllReduce(t.Context(), cl.comms[0], wire.OpAvg, b); err != nil {
		t.Fatal(err)
	}
	if b[0] != 1 || b[1] != 2 || b[2] != 3 {
		t.Fatalf("got %v", b)
	}
}

func TestCommInvalidArguments(t *testing.T) {
	cl := newCluster(t, 2, nil)
	c := cl.comms[0]
	ctx := t.Context()
	for name, err := range map[string]error{
		"avg of ints":   AllReduce(ctx, c, wire.OpAvg, []int32{1}),
		"unknown op":    AllReduce(ctx, c, wire.Op(9), []int32{1}),
		"no op":         AllReduce(ctx, c, wire.OpNone, []int32{1}),
		"ragged bytes":  c.AllReduce(ctx, wire.DTypeFloat32, wire.OpSum, make([]byte, 6)),
		"misaligned":    c.AllReduce(ctx, wire.DTypeFloat32, wire.OpSum, make([]byte, 12)[1:9]),
		"reduce bf16":   c.AllReduce(ctx, wire.DTypeBF16, wire.OpSum, make([]byte, 4)),
		"bad root":      c.Broadcast(ctx, 2, wire.DTypeBytes, make([]byte, 4)),
		"unknown dtype": c.AllGather(ctx, wire.DType(99), make([]byte, 4)),
	} {
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: got %v, want ErrInvalid", name, err)
		}
	}
	for name, cfg := range map[string]Config{
		"no members": {},
		"bad rank":   {Members: []transport.PeerID{"a"}, Rank: 1},
		"duplicate":  {Members: []transport.PeerID{"a", "a"}},
		"empty id":   {Members: []transport.PeerID{"a", ""}},
		"chunk":      {Members: []transport.PeerID{"a"}, ChunkBytes: -1},
	} {
		if _, err := NewComm(cl.trs[0], cfg); !errors.Is(err, ErrInvalid) {
			t.Errorf("config %s: got %v, want ErrInvalid", name, err)
		}
	}
}

// failAll runs f on every comm and checks that every rank fails with an
// error matching want within limit.
func failAll(t *testing.T, comms []*Comm, limit time.Duration, f func(r int, c *Comm) error, check func(r int, err error) error) {
	t.Helper()
	start := time.Now()
	errs := each(comms, f)
	if d := time.Since(start); d > limit {
		t.Errorf("the ranks took %v to fail, want under %v", d, limit)
	}
	for r, err := range errs {
		if err == nil {
			t.Errorf("rank %d: no error", r)
		} else if cerr := check(r, err); cerr != nil {
			t.Errorf("rank %d: %v", r, cerr)
		}
	}
}

func isMismatch(_ int, err error) error {
	if !errors.Is(err, ErrMismatch) {
		return fmt.Errorf("got %v, want ErrMismatch", err)
	}
	return nil
}

func TestMismatch(t *testing.T) {
	for _, n := range []int{2, 3, 4, 7} {
		for _, algo := range algos {
			t.Run(fmt.Sprintf("n=%d/%s", n, algo.name), func(t *testing.T) {
				cl := newCluster(t, n, func(c *Config) { c.SmallBytes = algo.small; c.ChunkBytes = 64 })
				odd := n / 2
				t.Run("length", func(t *testing.T) {
					failAll(t, cl.comms, 5*time.Second, func(r int, c *Comm) error {
						length := 1000
						if r == odd {
							length++
						}
						return AllReduce(t.Context(), c, wire.OpSum, make([]float32, length))
					}, isMismatch)
				})
				t.Run("dtype", func(t *testing.T) {
					failAll(t, cl.comms, 5*time.Second, func(r int, c *Comm) error {
						if r == odd {
							return AllReduce(t.Context(), c, wire.OpSum, make([]int32, 100))
						}
						return AllReduce(t.Context(), c, wire.OpSum, make([]float32, 100))
					}, isMismatch)
				})
				t.Run("op", func(t *testing.T) {
					failAll(t, cl.comms, 5*time.Second, func(r int, c *Comm) error {
						op := wire.OpSum
						if r == odd {
							op = wire.OpMax
						}
						return AllReduce(t.Context(), c, op, make([]float64, 100))
					}, isMismatch)
				})
				// The leftovers of the failed collectives are discarded and
				// the same Comms work again.
				t.Run("after", func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(n), 4))
					testAllReduce[float32](t, cl.comms, rng, wire.OpSum, 1000)
					testAllReduce[float32](t, cl.comms, rng, wire.OpSum, 3)
				})
			})
		}
	}
}

// TestMismatchAlgo checks lengths on either side of SmallBytes: the ranks
// then run different algorithms, so some wait for messages that no peer's
// plan sends, and only the abort markers to all members reach them.
func TestMismatchAlgo(t *testing.T) {
	for _, n := range []int{2, 3, 4, 5, 8} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			cl := newCluster(t, n, nil)
			failAll(t, cl.comms, 5*time.Second, func(r int, c *Comm) error {
				length := 1000 // recursive doubling
				if r == 1 {
					length = 1 << 20 // the ring
				}
				return AllReduce(t.Context(), c, wire.OpSum, make([]float32, length))
			}, isMismatch)
		})
	}
}

// TestStaleEpoch checks that ranks left in an older epoch never mix with
// the newer ones, and that nobody waits for a deadline: a stale rank fails
// with a StaleEpochError naming a newer peer and both epochs, on the first
// newer message or on the notice a newer rank sends back when it receives
// an older one; the stale rank then aborts the newer ranks' collective, so
// they fail with an AbortError naming a stale rank (AbortBehind). Over mem
// and quic, in the ring and in recursive doubling (where a newer rank may
// wait for a stale one before sending it anything), with one or two stale
// ranks of three.
func TestStaleEpoch(t *testing.T) {
	const timeout = 30 * time.Second // far beyond "promptly"
	for _, kind := range []string{"mem", "quic"} {
		for _, algo := range []string{"ring", "doubling"} {
			for _, stale := range [][]int{{2}, {0, 2}} {
				t.Run(fmt.Sprintf("%s/%s/stale=%v", kind, algo, stale), func(t *testing.T) {
					adjust := func(c *Config) {
						if algo == "ring" {
							c.SmallBytes = -1
						}
						c.CollectiveTimeout = timeout
						c.Epoch = 2
						if slices.Contains(stale, c.Rank) {
							c.Epoch = 1
						}
					}
					var comms []*Comm
					if kind == "mem" {
						cl := newCluster(t, 3, nil)
						for _, c := range cl.comms {
							c.Close()
						}
						comms = cl.newComms(t, cl.ids, adjust)
					} else {
						comms = realComms(t, kind, 3, adjust)
					}
					start := time.Now()
					errs := each(comms, func(r int, c *Comm) error {
						return AllReduce(t.Context(), c, wire.OpSum, make([]float32, 100))
					})
					if d := time.Since(start); d > timeout/3 {
						t.Errorf("the ranks took %v to fail", d)
					}
					for r, err := range errs {
						var se *StaleEpochError
						var ae *AbortError
						switch {
						case slices.Contains(stale, r):
							if !errors.As(err, &se) {
								t.Errorf("stale rank %d: got %v, want a StaleEpochError", r, err)
							} else if slices.Contains(stale, se.Rank) != se.Relayed || se.Epoch != 1 || se.PeerEpoch != 2 {
								t.Errorf("stale rank %d: %v, want a newer rank in epoch 2, or a stale one relaying", r, err)
							}
						case errors.As(err, &ae) && ae.Reason == AbortBehind:
							if !slices.Contains(stale, ae.CulpritRank) || ae.Culprit != comms[ae.CulpritRank].members[ae.CulpritRank] {
								t.Errorf("newer rank %d: %v, want a stale rank as the culprit", r, err)
							}
							if errors.Is(err, ErrStaleEpoch) || errors.Is(err, ErrTimeout) {
								t.Errorf("newer rank %d: %v matches ErrStaleEpoch or ErrTimeout", r, err)
							}
						default:
							t.Errorf("newer rank %d: got %v, want an AbortError for a rank behind", r, err)
						}
					}
				})
			}
		}
	}
}

func TestKill(t *testing.T) {
	for _, algo := range algos {
		t.Run(algo.name, func(t *testing.T) {
			const n, victim = 5, 1
			cl := newCluster(t, n, func(c *Config) { c.SmallBytes = algo.small; c.ChunkBytes = 4 << 10 })
			// Slow links keep the collective running when the victim dies.
			cl.setLinks(mem.Link{Delay: 100 * time.Millisecond})
			go func() {
				time.Sleep(30 * time.Millisecond)
				cl.net.Kill(cl.ids[victim])
			}()
			start := time.Now()
			errs := each(cl.comms, func(r int, c *Comm) error {
				return AllReduce(t.Context(), c, wire.OpSum, make([]float32, 64<<10))
			})
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("survivors took %v to fail", d)
			}
			for r, err := range errs {
				if r == victim {
					continue
				}
				peer, ok := transport.PeerOf(err)
				if !errors.Is(err, transport.ErrPeerGone) || !ok || peer != cl.ids[victim] {
					t.Errorf("rank %d: got %v, want a peer error naming %s", r, err, cl.ids[victim])
				}
			}
			// The survivors carry on in a new epoch without the victim.
			cl.setLinks(mem.Link{})
			var ids []transport.PeerID
			for r, id := range cl.ids {
				if r != victim {
					ids = append(ids, id)
				}
			}
			comms := cl.newComms(t, ids, func(c *Config) { c.Epoch = 2; c.SmallBytes = algo.small })
			rng := rand.New(rand.NewPCG(5, 5))
			testAllReduce[float32](t, comms, rng, wire.OpSum, 5000)
		})
	}
}

// startKernelPool starts the kernels' default pool, if no test has yet:
// a synctest bubble must not start it, since its workers live as long as
// the process.
func startKernelPool(tb testing.TB) {
	tb.Helper()
	big := make([]float32, kernels.ParallelThreshold)
	if err := kernels.Reduce(kernels.OpSum, big, big); err != nil {
		tb.Fatal(err)
	}
}

// TestTimeout checks, in fake time, that a rank cut off from the others
// (with no liveness to tell) makes every rank fail with ErrTimeout at the
// collective timeout.
func TestTimeout(t *testing.T) {
	startKernelPool(t)
	synctest.Test(t, func(t *testing.T) {
		cl := newCluster(t, 4, nil)
		cl.net.Partition([]transport.PeerID{cl.ids[0]})
		const length = 1 << 20
		want := DefaultCollectiveTimeout
		start := time.Now()
		errs := each(cl.comms, func(r int, c *Comm) error {
			return AllReduce(t.Context(), c, wire.OpSum, make([]float32, length))
		})
		if d := time.Since(start); d < want || d > want+stopGrace {
			t.Errorf("the ranks failed after %v, want %v", d, want)
		}
		// Every deadline fires at the same fake instant, so a rank may learn
		// of a peer's timeout from its abort marker before its own fires.
		for r, err := range errs {
			own := errors.Is(err, context.DeadlineExceeded)
			if !errors.Is(err, ErrTimeout) || !own && !errors.Is(err, ErrAborted) {
				t.Errorf("rank %d: got %v, want ErrTimeout", r, err)
			}
		}
		var te *TimeoutError
		if !errors.As(errs[1], &te) || te.Peer != cl.ids[0] || te.Rank != 0 || te.Deadline != want {
			t.Errorf("rank 1: got %v, want a TimeoutError waiting for %s after %v", errs[1], cl.ids[0], want)
		}
	})
}

// TestBandwidthEstimate checks that the estimate starts from
// InitialBandwidth, follows large collectives and ignores small ones.
func TestBandwidthEstimate(t *testing.T) {
	cl := newCluster(t, 1, func(c *Config) { c.InitialBandwidth = 5e8 })
	c := cl.comms[0]
	if got := c.Bandwidth(); got != 5e8 {
		t.Errorf("initial estimate %v, want 5e8", got)
	}
	for range 50 {
		c.observe(1e9, time.Second) // 1 GB/s
	}
	if got := c.Bandwidth(); got < 0.99e9 || got > 1.01e9 {
		t.Errorf("after 1 GB/s collectives: %v", got)
	}
	c.observe(1000, time.Hour) // too small to count
	if got := c.Bandwidth(); got < 0.99e9 {
		t.Errorf("a small collective moved the estimate: %v", got)
	}
}

// TestTimeoutRearms checks, in fake time, that the deadline of a
// collective that timed out ends no later one, and that every collective
// gets its own.
func TestTimeoutRearms(t *testing.T) {
	startKernelPool(t)
	synctest.Test(t, testTimeoutRearms)
}

func testTimeoutRearms(t *testing.T) {
	const timeout = 300 * time.Millisecond
	cl := newCluster(t, 2, func(c *Config) { c.CollectiveTimeout = timeout })
	for round := range 2 {
		// Rank 1 does not join: rank 0 times out.
		start := time.Now()
		err := AllReduce(t.Context(), cl.comms[0], wire.OpSum, make([]float32, 10))
		if d := time.Since(start); !errors.Is(err, ErrTimeout) || d < timeout {
			t.Fatalf("round %d: got %v after %v, want ErrTimeout after %v", round, err, d, timeout)
		}
		// Rank 1 now runs the collective rank 0 gave up on (rank 0's data
		// and abort marker are queued, so either outcome is right); then
		// both run collectives in step, together longer than the timeout
		// but each well within it.
		_ = AllReduce(t.Context(), cl.comms[1], wire.OpSum, make([]float32, 10))
		for range 5 {
			time.Sleep(timeout / 4)
			mustAll(t, each(cl.comms, func(r int, c *Comm) error {
				return AllReduce(t.Context(), c, wire.OpSum, make([]float32, 10))
			}))
		}
	}
}

// TestCancelReusedParent checks that a context passed to earlier
// collectives still cancels a later one: the Comm watches each parent
// once, not once per collective.
func TestCancelReusedParent(t *testing.T) {
	cl := newCluster(t, 2, nil)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	for range 3 {
		mustAll(t, each(cl.comms, func(r int, c *Comm) error {
			return AllReduce(ctx, c, wire.OpSum, make([]float32, 10))
		}))
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		cancel()
	}()
	if err := AllReduce(ctx, cl.comms[0], wire.OpSum, make([]float32, 10)); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	if err := AllReduce(ctx, cl.comms[0], wire.OpSum, make([]float32, 10)); !errors.Is(err, context.Canceled) {
		t.Fatalf("with the parent already cancelled: got %v, want context.Canceled", err)
	}
}

// TestClosedAfterAFailure: a collective that begins after Close, having
// won the Comm's lock before it, fails with ErrClosed, not with what ended
// the collective before it.
func TestClosedAfterAFailure(t *testing.T) {
	o := newOpCtx()
	later := time.Now().Add(time.Hour)
	o.begin(context.Background(), later)
	o.cancel(errDeadline)
	o.end()
	o.shutdown(ErrClosed)
	v := o.begin(context.Background(), later)
	select {
	case <-v.Done():
	default:
		t.Fatal("a collective begun after shutdown is not ended")
	}
	if err := v.Err(); err != ErrClosed {
		t.Fatalf("Err = %v, want ErrClosed", err)
	}
}

// TestCancelAlternatingParents: contexts passed in turn each still cancel
// their collective, whichever the Comm watched last.
func TestCancelAlternatingParents(t *testing.T) {
	cl := newCluster(t, 2, nil)
	a, cancelA := context.WithCancel(t.Context())
	b, cancelB := context.WithCancel(t.Context())
	defer cancelB()
	for _, ctx := range []context.Context{a, b, a, a, b, b, a} {
		mustAll(t, each(cl.comms, func(r int, c *Comm) error {
			return AllReduce(ctx, c, wire.OpSum, make([]float32, 10))
		}))
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		cancelA()
	}()
	if err := AllReduce(a, cl.comms[0], wire.OpSum, make([]float32, 10)); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	// Rank 1 now runs the collective rank 0 gave up on (either outcome is
	// right); then both go on under b.
	_ = AllReduce(b, cl.comms[1], wire.OpSum, make([]float32, 10))
	mustAll(t, each(cl.comms, func(r int, c *Comm) error {
		return AllReduce(b, c, wire.OpSum, make([]float32, 10))
	}))
}

func TestCancel(t *testing.T) {
	cl := newCluster(t, 2, nil)
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		time.Sleep(20 * time.Millisecond)
		cancel()
	}()
	// Rank 1 never joins: rank 0 waits until its context ends.
	err := AllReduce(ctx, cl.comms[0], wire.OpSum, make([]float32, 10))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
}

// TestCanceledBefore checks that a rank called with a context already
// ended fails the collective on every rank at once, and that all stay in
// step for the next one.
func TestCanceledBefore(t *testing.T) {
	cl := newCluster(t, 3, nil)
	ended, cancel := context.WithCancel(t.Context())
	cancel()
	failAll(t, cl.comms, 5*time.Second, func(r int, c *Comm) error {
		ctx := t.Context()
		if r == 1 {
			ctx = ended
		}
		return AllReduce(ctx, c, wire.OpSum, make([]float32, 100))
	}, func(r int, err error) error {
		if r == 1 && !errors.Is(err, context.Canceled) || r != 1 && !errors.Is(err, ErrAborted) {
			return fmt.Errorf("got %v", err)
		}
		return nil
	})
	testAllReduce[float32](t, cl.comms, rand.New(rand.NewPCG(3, 11)), wire.OpSum, 100)
}

func TestCloseDuring(t *testing.T) {
	cl := newCluster(t, 2, nil)
	go func() {
		time.Sleep(20 * time.Millisecond)
		cl.comms[0].Close()
	}()
	if err := AllReduce(t.Context(), cl.comms[0], wire.OpSum, make([]float32, 10)); !errors.Is(err, ErrClosed) {
		t.Fatalf("got %v, want ErrClosed", err)
	}
	if err := cl.comms[0].Barrier(t.Context()); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: got %v, want ErrClosed", err)
	}
}

// TestNoLeak checks that Close stops every goroutine a Comm started, also
// after a failed collective.
func TestNoLeak(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	cl := newCluster(t, 3, nil)
	rng := rand.New(rand.NewPCG(3, 6))
	testAllReduce[float32](t, cl.comms, rng, wire.OpSum, 1000)
	each(cl.comms, func(r int, c *Comm) error {
		return AllReduce(t.Context(), c, wire.OpSum, make([]float32, 10+r))
	})
	for r, c := range cl.comms {
		c.Close()
		cl.trs[r].Close()
	}
}
