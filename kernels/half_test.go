package kernels

import (
	"flag"
	"math"
	"math/rand/v2"
	"runtime"
	"sort"
	"sync"
	"testing"
)

var exhaustive = flag.Bool("exhaustive", false, "check ToFP16 and ToBF16 on all 2^32 float32 values (about a minute)")

// A format describes a 16-bit float format to the slow references below,
// which share no code with the kernels.
type format struct {
	name      string
	decode    func(h uint16) float64 // exact value of a finite bit pattern, from the format's definition
	maxFinite uint16                 // largest finite positive pattern; patterns 0..maxFinite increase in value
	inf       uint16                 // +Inf
	to        func(float32) uint16
	from      func(uint16) float32
}

var fp16 = format{
	name: "fp16",
	decode: func(h uint16) float64 {
		e, m := int(h>>10&0x1f), float64(h&0x3ff)
		v := math.Ldexp(m, -24)
		if e != 0 {
			v = math.Ldexp(1024+m, e-25)
		}
		if h&0x8000 != 0 {
			v = -v
		}
		return v
	},
	maxFinite: 0x7bff, inf: 0x7c00, to: ToFP16, from: FromFP16,
}

var bf16 = format{
	name: "bf16",
	decode: func(h uint16) float64 {
		e, m := int(h>>7&0xff), float64(h&0x7f)
		v := math.Ldexp(m, -133)
		if e != 0 {
			v = math.Ldexp(128+m, e-134)
		}
		if h&0x8000 != 0 {
			v = -v
		}
		return v
	},
	maxFinite: 0x7f7f, inf: 0x7f80, to: ToBF16, from: FromBF16,
}

func (f format) isNaN(h uint16) bool { return h&0x7fff > f.inf }

// round is the slow reference: it finds the two neighbouring patterns of |x|
// by binary search over the format's values, vals (f.values()), and picks
// the nearer, ties to the even pattern; past the largest finite value plus
// half an ulp, Inf. float64 holds every difference here exactly.
func (f format) round(vals []float64, x float32) uint16 {
	var sign uint16
	if math.Signbit(float64(x)) {
		sign = 0x8000
	}
	ax := math.Abs(float64(x))
	// k is the largest pattern with value <= ax.
	k := sort.Search(int(f.maxFinite)+1, func(i int) bool { return vals[i] > ax }) - 1
	lo := vals[k]
	var hi float64
	if k == int(f.maxFinite) {
		hi = 2*lo - vals[k-1] // the next value, were the exponent range wider
	} else {
		hi = vals[k+1]
	}
	up := hi-ax < ax-lo || hi-ax == ax-lo && k&1 == 1
	if ax == lo {
		up = false
	}
	if up {
		k++ // k+1 == maxFinite+1 is the Inf pattern
	}
	return sign | uint16(k)
}

// values returns decode of every finite positive pattern, in order: the
// table round searches, built once per test rather than decoded at each
// step of every search.
func (f format) values() []float64 {
	vals := make([]float64, int(f.maxFinite)+1)
	for k := range vals {
		vals[k] = f.decode(uint16(k))
	}
	return vals
}

func TestKnownValues(t *testing.T) {
	tests := []struct {
		f          float32
		fp16, bf16 uint16
	}{
		{1, 0x3c00, 0x3f80},
		{-2, 0xc000, 0xc000},
		{0.5, 0x3800, 0x3f00},
		{65504, 0x7bff, 0x4780},                       // bf16: 0x477fe000 rounds up to 65536
		{65519.996, 0x7bff, 0x4780},                   // just under half an ulp past 65504
		{65520, 0x7c00, 0x4780},                       // half an ulp: ties to even, which is Inf
		{1e6, 0x7c00, 0x4974},                         // overflow, and 1e6 in bf16 rounds to 999424
		{float32(math.Ldexp(1, -24)), 0x0001, 0x3380}, // smallest fp16 subnormal
		{float32(math.Ldexp(1, -25)), 0x0000, 0x3300}, // tie between 0 and 2^-24: even is 0
		{float32(math.Ldexp(1.5, -25)), 0x0001, 0x3340},
		{float32(math.Ldexp(3, -25)), 0x0002, 0x33c0},    // 1.5 units: tie, even is 2
		{float32(math.Ldexp(1, -14)), 0x0400, 0x3880},    // smallest normal
		{float32(math.Ldexp(1023, -24)), 0x03ff, 0x3880}, // largest subnormal
		{0.1, 0x2e66, 0x3dcd},
		{3.14159265, 0x4248, 0x4049},
		{float32(math.Copysign(0, -1)), 0x8000, 0x8000},
		{float32(math.Inf(1)), 0x7c00, 0x7f80},
		{float32(math.Inf(-1)), 0xfc00, 0xff80},
		{math.MaxFloat32, 0x7c00, 0x7f80},                  // bf16 rounds the largest float32 up to Inf
		{math.Float32frombits(1), 0x0000, 0x0000},          // smallest float32 subnormal
		{math.Float32frombits(0x00010000), 0x0000, 0x0001}, // a bf16 subnormal
	}
	for _, tt := range tests {
		if got := ToFP16(tt.f); got != tt.fp16 {
			t.Errorf("ToFP16(%g) = %#04x, want %#04x", tt.f, got, tt.fp16)
		}
		if got := ToBF16(tt.f); got != tt.bf16 {
			t.Errorf("ToBF16(%g) = %#04x, want %#04x", tt.f, got, tt.bf16)
		}
	}
	for h, want := range map[uint16]float32{0x3c00: 1, 0x7bff: 65504, 0x0001: float32(math.Ldexp(1, -24)), 0xfc00: float32(math.Inf(-1)), 0x8000: float32(math.Copysign(0, -1))} {
		if got := FromFP16(h); !sameFloat(got, want) {
			t.Errorf("FromFP16(%#04x) = %g, want %g", h, got, want)
		}
	}
	for _, nan := range []float32{float32(math.NaN()), -float32(math.NaN()), math.Float32frombits(0x7f800001), math.Float32frombits(0xff800001)} {
		h, b := ToFP16(nan), ToBF16(nan)
		if !fp16.isNaN(h) || h&0x0200 == 0 || !bf16.isNaN(b) || b&0x0040 == 0 {
			t.Errorf("NaN %#08x -> fp16 %#04x, bf16 %#04x: want quiet NaNs", math.Float32bits(nan), h, b)
		}
		if h>>15 != uint16(math.Float32bits(nan)>>31) || b>>15 != h>>15 {
			t.Errorf("NaN %#08x lost its sign", math.Float32bits(nan))
		}
	}
}

// TestDecodeTable checks the fp16 decode table (used by DecodeFP16 and
// ReduceFP16) against FromFP16, bit for bit, over all patterns.
func TestDecodeTable(t *testing.T) {
	hs := make([]uint16, 1<<16)
	for i := range hs {
		hs[i] = uint16(i)
	}
	for _, f := range []format{fp16, bf16} {
		decode := DecodeFP16
		if f.name == "bf16" {
			decode = DecodeBF16
		}
		out := make([]float32, len(hs))
		must(t, decode(out, hs))
		for i, h := range hs {
			if math.Float32bits(out[i]) != math.Float32bits(f.from(h)) {
				t.Fatalf("%s decode(%#04x) = %#08x, want %#08x", f.name, h, math.Float32bits(out[i]), math.Float32bits(f.from(h)))
			}
		}
	}
}

// TestFromHalfExhaustive decodes all 65536 patterns of each format against
// the format's definition, and checks that rounding the result back gives
// the same pattern.
func TestFromHalfExhaustive(t *testing.T) {
	for _, f := range []format{fp16, bf16} {
		for i := range 1 << 16 {
			h := uint16(i)
			got := f.from(h)
			if f.isNaN(h) {
				if got == got || math.Float32bits(got)>>31 != uint32(h>>15) {
					t.Fatalf("%s from(%#04x) = %v, want NaN of the same sign", f.name, h, got)
				}
				if back := f.to(got); back != h|quietBit(f) {
					t.Fatalf("%s NaN %#04x round trip = %#04x, want the payload kept and quieted", f.name, h, back)
				}
				continue
			}
			var want float64
			switch h & 0x7fff {
			case f.inf:
				want = math.Inf(1)
			default:
				want = math.Abs(f.decode(h))
			}
			if h&0x8000 != 0 {
				want = -want
			}
			if float64(got) != want || math.Signbit(float64(got)) != (h&0x8000 != 0) {
				t.Fatalf("%s from(%#04x) = %g, want %g", f.name, h, got, want)
			}
			if back := f.to(got); back != h {
				t.Fatalf("%s round trip %#04x -> %g -> %#04x", f.name, h, got, back)
			}
		}
	}
}

func quietBit(f format) uint16 {
	if f.name == "fp16" {
		return 0x0200
	}
	return 0x0040
}

// boundaryInputs returns float32 values around every rounding boundary of
// the format: each midpoint between neighbours, and the float32 values just
// below and above it, on both signs.
func boundaryInputs(f format) []float32 {
	var xs []float32
	for k := uint16(0); k <= f.maxFinite; k++ {
		lo := f.decode(k)
		hi := 2*lo - f.decode(k-1)
		if k < f.maxFinite {
			hi = f.decode(k + 1)
		}
		if k == 0 {
			hi = f.decode(1)
		}
		mid := float32((lo + hi) / 2) // exact: the midpoint needs one more bit
		for _, x := range []float32{mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, float32(math.Inf(1))), float32(lo)} {
			xs = append(xs, x, -x)
		}
	}
	return xs
}

func TestToHalfReference(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for _, f := range []format{fp16, bf16} {
		vals := f.values()
		xs := boundaryInputs(f)
		for range 1 << 16 {
			xs = append(xs, math.Float32frombits(r.Uint32()))
		}
		for _, x := range xs {
			got := f.to(x)
			if x != x {
				if !f.isNaN(got) {
					t.Fatalf("%s to(NaN %#08x) = %#04x, want NaN", f.name, math.Float32bits(x), got)
				}
				continue
			}
			if want := f.round(vals, x); got != want {
				t.Fatalf("%s to(%g = %#08x) = %#04x, want %#04x", f.name, x, math.Float32bits(x), got, want)
			}
		}
		// The slice encoders, whose loops repeat the scalar fast path, agree.
		enc := make([]uint16, len(xs))
		encode := EncodeFP16
		if f.name == "bf16" {
			encode = EncodeBF16
		}
		must(t, encode(enc, xs))
		for i, x := range xs {
			if enc[i] != f.to(x) {
				t.Fatalf("%s encode(%g) = %#04x, scalar %#04x", f.name, x, enc[i], f.to(x))
			}
		}
	}
}

// TestToHalfExhaustive checks every float32 against a fast oracle: the
// result's value is at least as near as both neighbours', ties go to even,
// and overflow goes to Inf. It takes about a minute; run with -exhaustive.
func TestToHalfExhaustive(t *testing.T) {
	if !*exhaustive {
		t.Skip("run with -exhaustive")
	}
	for _, f := range []format{fp16, bf16} {
		// Finite values by pattern, with one guard value past the end.
		vals := make([]float64, int(f.maxFinite)+2)
		for k := range vals[:len(vals)-1] {
			vals[k] = f.decode(uint16(k))
		}
		vals[len(vals)-1] = 2*vals[len(vals)-2] - vals[len(vals)-3]
		encode := EncodeFP16
		if f.name == "bf16" {
			encode = EncodeBF16
		}
		// Blocks of consecutive patterns, each also run through the slice
		// encoder, which must agree with the scalar one.
		const block = 1 << 16
		workers := runtime.GOMAXPROCS(0)
		var wg sync.WaitGroup
		bad := make(chan string, workers)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				xs, enc := make([]float32, block), make([]uint16, block)
				for base := uint64(w) * block; base < 1<<32; base += uint64(workers) * block {
					for i := range xs {
						xs[i] = math.Float32frombits(uint32(base) + uint32(i))
					}
					_ = encode(enc, xs)
					for i, x := range xs {
						if x != x {
							if !f.isNaN(enc[i]) {
								bad <- f.name + ": NaN lost by the slice encoder"
								return
							}
							continue
						}
						if enc[i] != f.to(x) {
							bad <- f.name + ": slice encoder differs from scalar for " + formatBits(x)
							return
						}
						if msg := checkNearest(f, vals, x); msg != "" {
							bad <- msg
							return
						}
					}
				}
			}()
		}
		wg.Wait()
		close(bad)
		for msg := range bad {
			t.Error(msg)
		}
	}
}

func checkNearest(f format, vals []float64, x float32) string {
	h := f.to(x)
	k := int(h & 0x7fff)
	ax := math.Abs(float64(x))
	if h>>15 != uint16(math.Float32bits(x)>>31) {
		return f.name + ": sign lost"
	}
	if k > int(f.inf) {
		return f.name + ": NaN from a number"
	}
	d := math.Abs(vals[k] - ax)
	ok := true
	if k > 0 {
		dl := ax - vals[k-1]
		ok = ok && (d < dl || d == dl && k&1 == 0)
	}
	if k+1 < len(vals) {
		du := vals[k+1] - ax
		ok = ok && (d < du || d == du && k&1 == 0)
	}
	if !ok {
		return f.name + ": not nearest-even for " + formatBits(x)
	}
	return ""
}

func formatBits(x float32) string {
	const hex = "0123456789abcdef"
	b := math.Float32bits(x)
	s := make([]byte, 8)
	for i := range s {
		s[7-i] = hex[b>>(4*i)&0xf]
	}
	return "0x" + string(s)
}

// TestFusedReduce checks ReduceBF16 and ReduceFP16 against decoding into a
// float32 buffer and reducing that, for every op, length and pool.
func TestFusedReduce(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, np := range testPools(t) {
		name, p := np.name, np.p
		for _, f := range []format{fp16, bf16} {
			fused, decode := p.ReduceFP16, p.DecodeFP16
			if f.name == "bf16" {
				fused, decode = p.ReduceBF16, p.DecodeBF16
			}
			for _, op := range ops {
				for _, n := range lengths {
					if skip(np, n) {
						continue
					}
					h := make([]uint16, n)
					for i := range h {
						h[i] = uint16(r.Uint32())
					}
					dst := randFloats[float32](r, n)
					dec := make([]float32, n)
					must(t, decode(dec, h))
					for i := range dec {
						if !sameFloat(dec[i], f.from(h[i])) {
							t.Fatalf("%s %s decode[%d] = %v, want %v", name, f.name, i, dec[i], f.from(h[i]))
						}
					}
					want := make([]float32, n)
					for i := range want {
						want[i] = refFloat(op, dst[i], dec[i])
					}
					must(t, fused(op, dst, h))
					for i := range want {
						if !sameFloat(dst[i], want[i]) {
							t.Fatalf("%s %s %v n=%d: [%d] = %v, want %v", name, f.name, op, n, i, dst[i], want[i])
						}
					}
				}
			}
		}
	}
}
