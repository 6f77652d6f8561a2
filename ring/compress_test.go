package ring

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/kernels"
)

var wireTypes = []wire.DType{wire.DTypeBF16, wire.DTypeFP16}

// roundTo rounds v to the wire precision of wt, as a send does.
func roundTo(wt wire.DType, v float32) float32 {
	if wt == wire.DTypeBF16 {
		return kernels.FromBF16(kernels.ToBF16(v))
	}
	return kernels.FromFP16(kernels.ToFP16(v))
}

// checkCompressed checks got[i] against the reduction by op of the inputs
// at element i, computed in float64, with the error compression allows.
//
// The bound for Sum. Let u be the wire format's unit roundoff, 2^-8 for
// bf16 (8 significant bits) and 2^-11 for fp16 (11). A partial sum is
// rounded to the wire once per hop it travels, and once more when its
// reduction completes (the Final rounding); each rounding errs by at most
// u times the partial sum's magnitude, at most S = Σ|xᵢ|. The ring's
// reduce-scatter takes N-1 hops, recursive doubling at most ⌊log2 N⌋+1
// rounded operands on any path, so N roundings bound both, and the Final
// one makes N+1. The float32 additions (unit roundoff 2^-24) add at most
// N·2^-24·S, which the extra u·S covers. fp16's subnormals have an
// absolute error of half their unit, 2^-25, per rounding instead of a
// relative one, hence the second term. So
//
//	|got - want| ≤ (N+1)·(u·S + a),  a = 2^-25 for fp16, 0 for bf16,
//
// and Avg, which divides once, before the Final rounding, gets the same
// bound divided by N plus one rounding of the result. Min and Max pick an
// input, and rounding is monotonic, so the result is that input rounded
// once (or exact for N = 1, which sends nothing).
func checkCompressed(got []float32, inputs [][]float32, op wire.Op, wt wire.DType, from, to int) error {
	n := len(inputs)
	u, a := 0x1p-8, 0.0
	if wt == wire.DTypeFP16 {
		u, a = 0x1p-11, 0x1p-25
	}
	for i := from; i < to; i++ {
		var sum, abs float64
		ext := inputs[0][i]
		for r := range n {
			v := inputs[r][i]
			sum += float64(v)
			abs += math.Abs(float64(v))
			if op == wire.OpMin {
				ext = min(ext, v)
			} else {
				ext = max(ext, v)
			}
		}
		g := got[i]
		switch op {
		case wire.OpMin, wire.OpMax:
			if g != ext && g != roundTo(wt, ext) {
				return fmt.Errorf("element %d: got %v, want %v or %v", i, g, ext, roundTo(wt, ext))
			}
			continue
		case wire.OpAvg:
			want := sum / float64(n)
			tol := float64(n+1)*(u*abs+a)/float64(n) + u*math.Abs(want) + a
			if d := math.Abs(float64(g) - want); d > tol {
				return fmt.Errorf("element %d: got %v, want %v (off by %g > %g)", i, g, want, d, tol)
			}
		default:
			tol := float64(n+1) * (u*abs + a)
			if d := math.Abs(float64(g) - sum); d > tol {
				return fmt.Errorf("element %d: got %v, want %v (off by %g > %g)", i, g, sum, d, tol)
			}
		}
	}
	return nil
}

var allOps = []wire.Op{wire.OpSum, wire.OpMin, wire.OpMax, wire.OpAvg}

// testAllReduceCompressed runs one compressed allreduce of random inputs
// on every rank of comms and checks it against the reference.
func testAllReduceCompressed(t *testing.T, comms []*Comm, rng *rand.Rand, op wire.Op, wt wire.DType, length int) {
	t.Helper()
	inputs := randomInputs[float32](rng, len(comms), length)
	bufs := clone(inputs)
	mustAll(t, each(comms, func(r int, c *Comm) error {
		return AllReduceCompressed(t.Context(), c, op, bufs[r], wt)
	}))
	if err := checkIdentical(bufs, 0, length); err != nil {
		t.Fatal(err)
	}
	if err := checkCompressed(bufs[0], inputs, op, wt, 0, length); err != nil {
		t.Fatal(err)
	}
}

// testReduceScatterCompressed is testAllReduceCompressed for
// ReduceScatter, which checks each rank's own segment.
func testReduceScatterCompressed(t *testing.T, comms []*Comm, rng *rand.Rand, op wire.Op, wt wire.DType, length int) {
	t.Helper()
	inputs := randomInputs[float32](rng, len(comms), length)
	bufs := clone(inputs)
	mustAll(t, each(comms, func(r int, c *Comm) error {
		return ReduceScatterCompressed(t.Context(), c, op, bufs[r], wt)
	}))
	for r, s := range Segments(length, len(comms)) {
		if err := checkCompressed(bufs[r], inputs, op, wt, s.Off, s.End()); err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// compressedLengths are TestAllReduceReference's lengths: 0, 1, n-1, n+1
// and a prime.
func compressedLengths(n int) []int { return []int{0, 1, max(n-1, 0), n + 1, 1009} }

func TestAllReduceCompressed(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4, 5, 7, 8, 16} {
		for _, algo := range algos {
			t.Run(fmt.Sprintf("n=%d/%s", n, algo.name), func(t *testing.T) {
				cl := newCluster(t, n, func(c *Config) {
					c.SmallBytes = algo.small
					c.ChunkBytes = 64 // many chunks per segment
				})
				rng := rand.New(rand.NewPCG(uint64(n), 11))
				for _, length := range compressedLengths(n) {
					for _, op := range allOps {
						for _, wt := range wireTypes {
							t.Run(fmt.Sprintf("len=%d/%v/%v", length, op, wt), func(t *testing.T) {
								testAllReduceCompressed(t, cl.comms, rng, op, wt, length)
							})
						}
					}
				}
			})
		}
	}
}

func TestReduceScatterCompressed(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4, 5, 7, 8, 16} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			cl := newCluster(t, n, func(c *Config) { c.ChunkBytes = 64 })
			rng := rand.New(rand.NewPCG(uint64(n), 12))
			for _, length := range compressedLengths(n) {
				for _, op := range allOps {
					for _, wt := range wireTypes {
						t.Run(fmt.Sprintf("len=%d/%v/%v", length, op, wt), func(t *testing.T) {
							testReduceScatterCompressed(t, cl.comms, rng, op, wt, length)
						})
					}
				}
			}
		})
	}
}

// TestCompressedLarge runs largeLength elements, in chunks of
// largeChunkBytes of float32: every op at n = 2, alternating the wire
// formats, and one allreduce and one reduce-scatter at n = 3. Encoding is
// slow under the race detector, so the set is small.
func TestCompressedLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("large buffers")
	}
	const length = largeLength
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			cl := newCluster(t, n, func(c *Config) { c.ChunkBytes = largeChunkBytes })
			rng := rand.New(rand.NewPCG(uint64(n), 13))
			ops := allOps
			if n == 3 {
				ops = []wire.Op{wire.OpAvg}
			}
			for i, op := range ops {
				wt := wireTypes[i%2]
				t.Run(fmt.Sprintf("allreduce/%v/%v", op, wt), func(t *testing.T) {
					testAllReduceCompressed(t, cl.comms, rng, op, wt, length)
				})
			}
			t.Run("reduce-scatter", func(t *testing.T) {
				testReduceScatterCompressed(t, cl.comms, rng, wire.OpSum, wireTypes[n%2], length)
			})
		})
	}
}

// TestCompressMismatch gives one rank another wire format, or none: the
// messages then disagree on dtype, and every rank fails with ErrMismatch.
// The same Comms work afterwards.
func TestCompressMismatch(t *testing.T) {
	for _, n := range []int{2, 3, 4} {
		for _, algo := range algos {
			t.Run(fmt.Sprintf("n=%d/%s", n, algo.name), func(t *testing.T) {
				cl := newCluster(t, n, func(c *Config) { c.SmallBytes = algo.small; c.ChunkBytes = 64 })
				odd := n / 2
				for _, tc := range []struct {
					name       string
					most, oddT wire.DType
				}{
					{"bf16-vs-none", wire.DTypeBF16, wire.DTypeBytes},
					{"none-vs-fp16", wire.DTypeBytes, wire.DTypeFP16},
					{"bf16-vs-fp16", wire.DTypeBF16, wire.DTypeFP16},
				} {
					t.Run(tc.name, func(t *testing.T) {
						failAll(t, cl.comms, 5*time.Second, func(r int, c *Comm) error {
							wt := tc.most
							if r == odd {
								wt = tc.oddT
							}
							return AllReduceCompressed(t.Context(), c, wire.OpSum, make([]float32, 100), wt)
						}, isMismatch)
					})
				}
				t.Run("reduce-scatter", func(t *testing.T) {
					failAll(t, cl.comms, 5*time.Second, func(r int, c *Comm) error {
						wt := wire.DTypeFP16
						if r == odd {
							wt = wire.DTypeBF16
						}
						return ReduceScatterCompressed(t.Context(), c, wire.OpSum, make([]float32, 100), wt)
					}, isMismatch)
				})
				t.Run("after", func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(n), 14))
					testAllReduceCompressed(t, cl.comms, rng, wire.OpSum, wire.DTypeBF16, 1000)
					testAllReduce[float32](t, cl.comms, rng, wire.OpSum, 1000)
				})
			})
		}
	}
}

// TestCompressInvalid checks that invalid compression requests fail with
// ErrInvalid before taking a sequence number: after every rank made them,
// the ranks are still in step.
func TestCompressInvalid(t *testing.T) {
	cl := newCluster(t, 2, nil)
	ctx := t.Context()
	for _, c := range cl.comms {
		for name, err := range map[string]error{
			"float64":      c.AllReduceCompressed(ctx, wire.DTypeFloat64, wire.OpSum, make([]byte, 8), wire.DTypeBF16),
			"int32":        c.AllReduceCompressed(ctx, wire.DTypeInt32, wire.OpSum, make([]byte, 4), wire.DTypeFP16),
			"rs float64":   c.ReduceScatterCompressed(ctx, wire.DTypeFloat64, wire.OpSum, make([]byte, 8), wire.DTypeBF16),
			"to float32":   AllReduceCompressed(ctx, c, wire.OpSum, []float32{1}, wire.DTypeFloat32),
			"to int64":     ReduceScatterCompressed(ctx, c, wire.OpSum, []float32{1}, wire.DTypeInt64),
			"unknown type": AllReduceCompressed(ctx, c, wire.OpSum, []float32{1}, wire.DType(99)),
		} {
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%s: got %v, want ErrInvalid", name, err)
			}
		}
	}
	rng := rand.New(rand.NewPCG(2, 15))
	testAllReduceCompressed(t, cl.comms, rng, wire.OpSum, wire.DTypeFP16, 10)
}

// TestFuserCompressed runs float32 buckets compressed to bf16 and checks
// them against the reference; Fuser[float64] refuses compression.
func TestFuserCompressed(t *testing.T) {
	const n = 3
	cl := newCluster(t, n, func(c *Config) { c.ChunkBytes = 256 })
	fs := newFusers[float32](t, cl.comms, FuserConfig{BucketBytes: 1 << 10, Op: wire.OpAvg, Compress: wire.DTypeBF16})
	rng := rand.New(rand.NewPCG(n, 16))
	lengths := []int{100, 300, 7, 1000, 1}
	inputs := make([][][]float32, len(lengths)) // by tensor, then rank
	for i, l := range lengths {
		inputs[i] = randomInputs[float32](rng, n, l)
	}
	tensors := make([][][]float32, len(lengths))
	for i := range inputs {
		tensors[i] = clone(inputs[i])
	}
	mustAll(t, each(cl.comms, func(r int, _ *Comm) error {
		hs := make([]*Handle, len(lengths))
		for i := range lengths {
			hs[i] = fs[r].AllReduceAsync(t.Context(), "t", tensors[i][r])
		}
		fs[r].Flush(t.Context())
		for _, h := range hs {
			if err := h.Wait(t.Context()); err != nil {
				return err
			}
		}
		return nil
	}))
	for i, l := range lengths {
		if err := checkIdentical(tensors[i], 0, l); err != nil {
			t.Fatalf("tensor %d: %v", i, err)
		}
		if err := checkCompressed(tensors[i][0], inputs[i], wire.OpAvg, wire.DTypeBF16, 0, l); err != nil {
			t.Fatalf("tensor %d: %v", i, err)
		}
	}

	if _, err := NewFuser[float64](cl.comms[0], FuserConfig{Compress: wire.DTypeFP16}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Fuser[float64] with fp16: got %v, want ErrInvalid", err)
	}
	if _, err := NewFuser[float32](cl.comms[0], FuserConfig{Compress: wire.DTypeFloat32}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Fuser[float32] compressed to float32: got %v, want ErrInvalid", err)
	}
}

// TestWireImageChangesNoBit runs compressed ring allreduces and
// reduce-scatters with and without the wire image, from the same inputs,
// and finds every result bit-identical: forwarding the image sends what
// encoding again would have sent. It also checks that the image is used:
// every allgather step of the ring allreduce forwards.
func TestWireImageChangesNoBit(t *testing.T) {
	for _, n := range []int{2, 3, 4, 5} {
		p, err := RingAllReduce(n, 1, 1000, 50)
		if err != nil {
			t.Fatal(err)
		}
		forwards, _ := forwardedImages(p)
		got := 0
		for _, f := range forwards {
			if f {
				got++
			}
		}
		if want := len(p.Sends) / 2; got != want { // the allgather half
			t.Errorf("n=%d: %d of %d sends forward the image, want %d", n, got, len(p.Sends), want)
		}
		// A ring order other than rank order, and inputs with the values
		// the codecs treat apart: NaN, ±Inf, ±0, and fp16's subnormals
		// and overflow.
		order := RankOrder(n)
		slices.Reverse(order)
		cl := newCluster(t, n, func(c *Config) { c.ChunkBytes, c.SmallBytes, c.Order = 64, -1, order })
		rng := rand.New(rand.NewPCG(uint64(n), 29))
		special := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), 0, float32(math.Copysign(0, -1)),
			3e-6, -4e-7, 65519, 70000, 1e-40}
		for _, length := range []int{1, n + 1, 1009, 4096} {
			for _, op := range allOps {
				for _, wt := range wireTypes {
					inputs := randomInputs[float32](rng, n, length)
					for r := range inputs {
						for i := r; i < length; i += 7 {
							inputs[r][i] = special[(i/7+r)%len(special)]
						}
					}
					var results [2][][]float32
					for k, image := range []bool{false, true} {
						useWireImage = image
						bufs := clone(inputs)
						mustAll(t, each(cl.comms, func(r int, c *Comm) error {
							if length%2 == 0 {
								return ReduceScatterCompressed(t.Context(), c, op, bufs[r], wt)
							}
							return AllReduceCompressed(t.Context(), c, op, bufs[r], wt)
						}))
						results[k] = bufs
					}
					useWireImage = true
					for r := range n {
						for i := range length {
							if a, b := math.Float32bits(results[0][r][i]), math.Float32bits(results[1][r][i]); a != b {
								t.Fatalf("n=%d len=%d %v %v: rank %d element %d: %#x without the image, %#x with it", n, length, op, wt, r, i, a, b)
							}
						}
					}
				}
			}
		}
	}
}
