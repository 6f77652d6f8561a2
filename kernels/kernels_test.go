package kernels

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction(DefaultWorker))
}

// lengths are the awkward sizes every kernel is checked at: empty, one
// element, shorter than an unrolled block, and a large odd count that
// splits unevenly across workers (smaller under the race detector).
var lengths = []int{0, 1, 7, 1000, largeLength}

type namedPool struct {
	name string
	p    *Pool
}

// testPools returns the pools every kernel runs on: none (serial), a
// private pool that splits everything (threshold 0), and Default().
func testPools(tb testing.TB) []namedPool {
	tb.Helper()
	split := NewPool(3) // more goroutines than cores, to exercise uneven splits
	split.minBytes, split.minRange = 0, 0
	tb.Cleanup(split.Close)
	return []namedPool{{"serial", nil}, {"split", split}, {"default", Default()}}
}

// skip reports whether a test skips length n on pool np: the largest
// length runs on the serial and split pools only, since Default() splits
// the same way and the race detector makes every element costly.
func skip(np namedPool, n int) bool { return np.name == "default" && n > 1000 }

// randFloats fills a buffer with values from a wide range of magnitudes,
// with specials (NaN, ±Inf, ±0, subnormals) at about 1 in 50.
func randFloats[T float32 | float64](r *rand.Rand, n int) []T {
	s := make([]T, n)
	for i := range s {
		switch r.IntN(100) {
		case 0:
			s[i] = T(math.NaN())
		case 1:
			s[i] = T(math.Inf(1 - 2*r.IntN(2)))
		case 2:
			s[i] = T(math.Copysign(0, float64(1-2*r.IntN(2))))
		case 3:
			s[i] = T(math.Float32frombits(r.Uint32() & 0x807fffff)) // float32 subnormal
		default:
			s[i] = T(r.NormFloat64() * math.Exp2(float64(r.IntN(40)-20)))
		}
	}
	return s
}

func randInts[T int32 | int64](r *rand.Rand, n int) []T {
	s := make([]T, n)
	for i := range s {
		if r.IntN(10) == 0 {
			s[i] = T(r.Uint64()) // extremes: sums wrap
		} else {
			s[i] = T(r.IntN(2001) - 1000)
		}
	}
	return s
}

// refFloat is the naive reference for one float element, written without
// the built-in min and max so that it checks the NaN and signed-zero rule
// independently.
func refFloat[T float32 | float64](op Op, a, b T) T {
	switch op {
	case OpSum:
		return a + b
	case OpMin, OpMax:
		if a != a || b != b {
			return T(math.NaN())
		}
		if a == 0 && b == 0 { // ±0: min prefers -0, max prefers +0
			na, nb := math.Signbit(float64(a)), math.Signbit(float64(b))
			if op == OpMin && (na || nb) || op == OpMax && na && nb {
				return T(math.Copysign(0, -1))
			}
			return 0
		}
		if (op == OpMin) == (a < b) {
			return a
		}
		return b
	}
	panic("bad op")
}

func refInt[T int32 | int64](op Op, a, b T) T {
	switch op {
	case OpSum:
		return a + b
	case OpMin:
		if a < b {
			return a
		}
		return b
	case OpMax:
		if a > b {
			return a
		}
		return b
	}
	panic("bad op")
}

// sameFloat reports whether a and b are the same value: both NaN, or equal
// with the same sign.
func sameFloat[T float32 | float64](a, b T) bool {
	if a != a || b != b {
		return a != a && b != b
	}
	return a == b && math.Signbit(float64(a)) == math.Signbit(float64(b))
}

var ops = []Op{OpSum, OpMin, OpMax}

func checkReduce[T float32 | float64 | int32 | int64](t *testing.T, gen func(*rand.Rand, int) []T, ref func(Op, T, T) T, same func(a, b T) bool) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, np := range testPools(t) {
		name, p := np.name, np.p
		for _, op := range ops {
			for _, n := range lengths {
				if skip(np, n) {
					continue
				}
				dst, src := gen(r, n), gen(r, n)
				want := make([]T, n)
				for i := range want {
					want[i] = ref(op, dst[i], src[i])
				}
				if err := ReduceWith(p, op, dst, src); err != nil {
					t.Fatalf("%s %v n=%d: %v", name, op, n, err)
				}
				for i := range want {
					if !same(dst[i], want[i]) {
						t.Fatalf("%s %v n=%d: [%d] = %v, want %v", name, op, n, i, dst[i], want[i])
					}
				}
			}
		}
	}
}

func TestReduceFloat32(t *testing.T) {
	checkReduce(t, randFloats[float32], refFloat[float32], sameFloat[float32])
}

func TestReduceFloat64(t *testing.T) {
	checkReduce(t, randFloats[float64], refFloat[float64], sameFloat[float64])
}

func TestReduceInt32(t *testing.T) {
	checkReduce(t, randInts[int32], refInt[int32], func(a, b int32) bool { return a == b })
}

func TestReduceInt64(t *testing.T) {
	checkReduce(t, randInts[int64], refInt[int64], func(a, b int64) bool { return a == b })
}

func TestMinMaxSpecials(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	negz := float32(math.Copysign(0, -1))
	tests := []struct {
		op   Op
		a, b float32
		want float32
	}{
		{OpMin, nan, 1, nan},
		{OpMin, 1, nan, nan},
		{OpMax, nan, 1, nan},
		{OpMax, 1, nan, nan},
		{OpMax, nan, nan, nan},
		{OpMin, -inf, nan, nan},
		{OpMin, negz, 0, negz},
		{OpMin, 0, negz, negz},
		{OpMax, negz, 0, 0},
		{OpMax, 0, negz, 0},
		{OpMin, -inf, inf, -inf},
		{OpMax, -inf, inf, inf},
		{OpSum, inf, -inf, nan},
	}
	for _, tt := range tests {
		dst := []float32{tt.a}
		if err := Reduce(tt.op, dst, []float32{tt.b}); err != nil {
			t.Fatal(err)
		}
		if !sameFloat(dst[0], tt.want) {
			t.Errorf("%v(%v, %v) = %v, want %v", tt.op, tt.a, tt.b, dst[0], tt.want)
		}
	}
}

// TestSplitBitwise checks that a split call leaves exactly the bits a
// serial call leaves, NaN payloads included, for every kernel.
func TestSplitBitwise(t *testing.T) {
	p := NewPool(2)
	p.minBytes, p.minRange = 0, 0
	defer p.Close()
	r := rand.New(rand.NewPCG(3, 4))
	const n = largeLength
	f32, f32src := randFloats[float32](r, n), randFloats[float32](r, n)
	f64, f64src := randFloats[float64](r, n), randFloats[float64](r, n)
	h := make([]uint16, n)
	for i := range h {
		h[i] = uint16(r.Uint32())
	}
	for _, op := range ops {
		d0, d1 := append([]float32(nil), f32...), append([]float32(nil), f32...)
		must(t, ReduceWith(nil, op, d0, f32src))
		must(t, ReduceWith(p, op, d1, f32src))
		if string(Bytes(d0)) != string(Bytes(d1)) {
			t.Fatalf("float32 %v: split result differs from serial", op)
		}
		e0, e1 := append([]float64(nil), f64...), append([]float64(nil), f64...)
		must(t, ReduceWith(nil, op, e0, f64src))
		must(t, ReduceWith(p, op, e1, f64src))
		if string(Bytes(e0)) != string(Bytes(e1)) {
			t.Fatalf("float64 %v: split result differs from serial", op)
		}
		for _, f := range []func(*Pool, Op, []float32, []uint16) error{(*Pool).ReduceBF16, (*Pool).ReduceFP16} {
			d0, d1 := append([]float32(nil), f32...), append([]float32(nil), f32...)
			must(t, f(nil, op, d0, h))
			must(t, f(p, op, d1, h))
			if string(Bytes(d0)) != string(Bytes(d1)) {
				t.Fatalf("fused %v: split result differs from serial", op)
			}
		}
	}
}

func must(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}

func TestScale(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, np := range testPools(t) {
		name, p := np.name, np.p
		for _, n := range lengths {
			if skip(np, n) {
				continue
			}
			s := randFloats[float32](r, n)
			want := make([]float32, n)
			for i := range s {
				want[i] = s[i] * 0.25
			}
			ScaleWith(p, s, 0.25)
			for i := range s {
				if !sameFloat(s[i], want[i]) {
					t.Fatalf("%s n=%d: [%d] = %v, want %v", name, n, i, s[i], want[i])
				}
			}
			d := randFloats[float64](r, n)
			wantd := make([]float64, n)
			for i := range d {
				wantd[i] = d[i] / 3
			}
			ScaleWith(p, d, 1.0/3)
			for i := range d {
				if d[i] != wantd[i] && !(d[i] != d[i] && wantd[i] != wantd[i]) && math.Abs(d[i]-wantd[i]) > 1e-15*math.Abs(wantd[i]) {
					t.Fatalf("%s n=%d: [%d] = %v, want %v", name, n, i, d[i], wantd[i])
				}
			}
		}
	}
}

// TestAvg is the ring's Avg: Sum of N buffers, then Scale by 1/N.
func TestAvg(t *testing.T) {
	bufs := [][]float32{{1, 2, 3}, {3, 4, 5}, {5, 6, 7}, {7, 8, 9}}
	acc := append([]float32(nil), bufs[0]...)
	for _, b := range bufs[1:] {
		must(t, Reduce(OpSum, acc, b))
	}
	Scale(acc, 1/float32(len(bufs)))
	for i, want := range []float32{4, 5, 6} {
		if acc[i] != want {
			t.Fatalf("avg[%d] = %v, want %v", i, acc[i], want)
		}
	}
}

type myFloat float32
type myInt int64

func TestNamedTypes(t *testing.T) {
	if dtypeOf[myFloat]() != Float32 || dtypeOf[myInt]() != Int64 ||
		dtypeOf[float64]() != Float64 || dtypeOf[int32]() != Int32 {
		t.Fatal("dtypeOf maps a type to the wrong DType")
	}
	dst := []myFloat{1.5, 2}
	must(t, Reduce(OpSum, dst, []myFloat{0.25, -2}))
	if dst[0] != 1.75 || dst[1] != 0 {
		t.Fatalf("got %v", dst)
	}
}

func TestErrors(t *testing.T) {
	f := []float32{1, 2}
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"length", Reduce(OpSum, f, f[:1]), ErrLength},
		{"length zero", Reduce(OpMax, f[:0], f), ErrLength},
		{"op zero", Reduce(Op(0), f, f), ErrOp},
		{"op unknown", Reduce(Op(9), []int64{1}, []int64{1}), ErrOp},
		{"bf16 length", ReduceBF16(OpSum, f, make([]uint16, 3)), ErrLength},
		{"fp16 op", ReduceFP16(Op(0), f, make([]uint16, 2)), ErrOp},
		{"encode length", EncodeFP16(make([]uint16, 1), f), ErrLength},
		{"decode length", DecodeBF16(f, nil), ErrLength},
		{"bytes dtype", ReduceBytes(DType(0), OpSum, make([]byte, 8), make([]byte, 8)), ErrDType},
		{"bytes op", ReduceBytes(Float32, Op(4), make([]byte, 8), make([]byte, 8)), ErrOp},
		{"bytes length", ReduceBytes(Float32, OpSum, make([]byte, 8), make([]byte, 4)), ErrLength},
		{"bytes partial", ReduceBytes(Float64, OpSum, make([]byte, 12), make([]byte, 12)), ErrLength},
		{"bytes align", ReduceBytes(Int32, OpSum, misaligned(8), make([]byte, 8)), ErrAlign},
		{"scale int", ScaleBytes(Int32, make([]byte, 8), 2), ErrDType},
		{"scale partial", ScaleBytes(Float32, make([]byte, 6), 2), ErrLength},
	}
	for _, tt := range tests {
		if !errors.Is(tt.err, tt.want) {
			t.Errorf("%s: err = %v, want %v", tt.name, tt.err, tt.want)
		}
	}
	// A rejected call leaves dst untouched.
	if f[0] != 1 || f[1] != 2 {
		t.Fatalf("dst changed by failed calls: %v", f)
	}
}

func TestReduceBytes(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, dt := range []DType{Float32, Float64, Int32, Int64} {
		for _, op := range ops {
			n := 1001 * dt.Size()
			dst, src, want := make([]byte, n), make([]byte, n), make([]byte, n)
			for i := range dst {
				dst[i], src[i] = byte(r.Uint32()), byte(r.Uint32())
			}
			copy(want, dst)
			// The reference is the generic path over views of the same bytes.
			var err error
			switch dt {
			case Float32:
				err = ReduceWith(nil, op, mustView[float32](t, want), mustView[float32](t, src))
			case Float64:
				err = ReduceWith(nil, op, mustView[float64](t, want), mustView[float64](t, src))
			case Int32:
				err = ReduceWith(nil, op, mustView[int32](t, want), mustView[int32](t, src))
			case Int64:
				err = ReduceWith(nil, op, mustView[int64](t, want), mustView[int64](t, src))
			}
			must(t, err)
			must(t, ReduceBytes(dt, op, dst, src))
			if string(dst) != string(want) {
				t.Fatalf("%v %v: ReduceBytes differs from Reduce on views", dt, op)
			}
		}
	}
	b := make([]byte, 16)
	for i := range 4 {
		copy(b[4*i:], Bytes([]float32{2}))
	}
	must(t, ScaleBytes(Float32, b, 0.5))
	if v := mustView[float32](t, b); v[3] != 1 {
		t.Fatalf("ScaleBytes: %v", v)
	}
}

// misaligned returns n bytes starting at an address that is 1 mod 8.
func misaligned(n int) []byte {
	b := make([]byte, n+8)
	off := (9 - int(uintptr(unsafe.Pointer(&b[0]))%8)) % 8
	return b[off : off+n]
}

func mustView[T Number | ~uint16](tb testing.TB, b []byte) []T {
	tb.Helper()
	v, err := View[T](b)
	if err != nil {
		tb.Fatal(err)
	}
	return v
}

func TestView(t *testing.T) {
	b := make([]byte, 64)
	if uintptr(unsafe.Pointer(&b[0]))%8 != 0 {
		t.Fatal("allocator returned a []byte of 64 not aligned to 8")
	}
	f, err := AsFloat32(b)
	if err != nil || len(f) != 16 {
		t.Fatalf("AsFloat32: %d, %v", len(f), err)
	}
	f[1] = 1
	if b[4:8][3] != 0x3f || b[4:8][2] != 0x80 { // little-endian 0x3f800000
		t.Fatalf("view does not share memory little-endian: % x", b[4:8])
	}
	if &Bytes(f)[0] != &b[0] || len(Bytes(f)) != 64 {
		t.Fatal("Bytes does not return the same memory")
	}
	if _, err := AsFloat64(b[4:60]); !errors.Is(err, ErrAlign) {
		t.Errorf("AsFloat64(b[4:60]) err = %v, want ErrAlign", err)
	}
	if _, err := AsInt32(b[2:6]); !errors.Is(err, ErrAlign) {
		t.Errorf("AsInt32(b[2:6]) err = %v, want ErrAlign", err)
	}
	if _, err := AsUint16(b[1:3]); !errors.Is(err, ErrAlign) {
		t.Errorf("AsUint16(b[1:3]) err = %v, want ErrAlign", err)
	}
	if _, err := AsInt64(b[:12]); !errors.Is(err, ErrLength) {
		t.Errorf("AsInt64(b[:12]) err = %v, want ErrLength", err)
	}
	if v, err := AsInt64(b[8:]); err != nil || len(v) != 7 {
		t.Errorf("AsInt64(b[8:]) = %d, %v", len(v), err)
	}
	if v, err := AsFloat32(nil); err != nil || len(v) != 0 {
		t.Errorf("AsFloat32(nil) = %v, %v", v, err)
	}
	if len(Bytes([]int64(nil))) != 0 {
		t.Error("Bytes(nil) not empty")
	}
}

// TestZeroAllocs checks the ring's steady-state promise: a large call on a
// warm pool, split across workers, allocates nothing.
func TestZeroAllocs(t *testing.T) {
	// Default() splits from ParallelThreshold on; the private pool splits
	// everything, which keeps the race detector's work small.
	big, bigSrc := make([]float32, 2*ParallelThreshold/4), make([]float32, 2*ParallelThreshold/4)
	const n = 1 << 16
	dst, src := make([]float32, n), make([]float32, n)
	h := make([]uint16, n)
	bd, bs := Bytes(dst), Bytes(src)
	p := NewPool(2)
	p.minBytes, p.minRange = 0, 0
	defer p.Close()
	calls := []struct {
		name string
		f    func()
	}{
		{"Reduce", func() { _ = Reduce(OpSum, big, bigSrc) }},
		{"ReduceBytes", func() { _ = ReduceBytes(Float32, OpSum, Bytes(big), Bytes(bigSrc)) }},
		{"ReduceWith", func() { _ = ReduceWith(p, OpMax, dst, src) }},
		{"Pool.ReduceBytes", func() { _ = p.ReduceBytes(Float32, OpSum, bd, bs) }},
		{"Pool.ReduceFP16", func() { _ = p.ReduceFP16(OpSum, dst, h) }},
		{"Pool.EncodeBF16", func() { _ = p.EncodeBF16(h, src) }},
		{"ScaleWith", func() { ScaleWith(p, dst, 0.5) }},
	}
	for _, c := range calls {
		c.f() // warm: starts Default(), fills the free list
		if a := testing.AllocsPerRun(20, c.f); a != 0 {
			t.Errorf("%s: %v allocations per call, want 0", c.name, a)
		}
	}
}

func TestPoolConcurrentAndClose(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreAnyFunction(DefaultWorker))
	p := NewPool(3)
	p.minBytes, p.minRange = 0, 0
	const n, callers = 100003, 4
	done := make(chan error, callers)
	for c := range callers {
		go func() {
			dst, src := make([]int32, n), make([]int32, n)
			for i := range src {
				src[i] = int32(i + c)
			}
			for range 10 {
				if err := ReduceWith(p, OpSum, dst, src); err != nil {
					done <- err
					return
				}
			}
			for i := range dst {
				if dst[i] != 10*int32(i+c) {
					done <- errors.New("wrong sum under concurrency")
					return
				}
			}
			done <- nil
		}()
	}
	for range callers {
		must(t, <-done)
	}
	p.Close()
	p.Close() // idempotent
	// A closed pool still computes, serially.
	dst := []float32{1, 2}
	must(t, ReduceWith(p, OpSum, dst, []float32{1, 1}))
	if dst[0] != 2 || dst[1] != 3 {
		t.Fatalf("closed pool: %v", dst)
	}
	Default().Close() // no-op
	if Default().closed {
		t.Fatal("Close stopped the default pool")
	}
	var nilPool *Pool
	nilPool.Close()
	if nilPool.Procs() != 1 {
		t.Fatal("nil pool reports more than one proc")
	}
}

// TestPoolReuse runs many small split calls from several goroutines, so that
// call state is recycled while workers woken for an earlier call may still
// be arriving late; every result is checked.
func TestPoolReuse(t *testing.T) {
	p := NewPool(4)
	p.minBytes, p.minRange = 0, 0
	defer p.Close()
	const n, rounds, callers = 256, 2000, 3
	errs := make(chan error, callers)
	for c := range callers {
		go func() {
			dst, src := make([]int64, n), make([]int64, n)
			for r := range rounds {
				for i := range src {
					dst[i], src[i] = int64(i), int64(r+c)
				}
				if err := ReduceWith(p, OpSum, dst, src); err != nil {
					errs <- err
					return
				}
				for i := range dst {
					if dst[i] != int64(i+r+c) {
						errs <- errors.New("wrong sum after call reuse")
						return
					}
				}
			}
			errs <- nil
		}()
	}
	for range callers {
		must(t, <-errs)
	}
}

// TestDefaultSplits checks a call on Default() above ParallelThreshold, with
// an odd length, element by element.
func TestDefaultSplits(t *testing.T) {
	n := 2*ParallelThreshold/4 + 3
	dst, src := make([]float32, n), make([]float32, n)
	for i := range dst {
		dst[i], src[i] = float32(i%1024), float32(i%7)
	}
	must(t, Reduce(OpSum, dst, src))
	for i := range dst {
		if dst[i] != float32(i%1024+i%7) {
			t.Fatalf("[%d] = %v, want %v", i, dst[i], float32(i%1024+i%7))
		}
	}
}
