package kernels

import (
	"math/rand/v2"
	"testing"
)

// Benchmarks, one top-level function per group and size so that a pattern
// such as -bench 'Sum.*64MiB|Copy.*64MiB' selects a size. Every group uses
// the same buffers for a size, and BenchmarkCopy* runs copy(dst, src) on
// them: the memory-bandwidth reference that the kernels are judged
// against in the same run. SetBytes counts the bytes of dst, so MB/s is
// comparable across groups; for EncodeBF16/EncodeFP16 dst is the uint16
// buffer, half the size of the float32 input.

const (
	size64KiB = 64 << 10
	size1MiB  = 1 << 20
	size64MiB = 64 << 20
)

type benchBufs struct {
	f32dst, f32src []float32
	f64dst, f64src []float64
	i32dst, i32src []int32
	fp16, bf16     []uint16 // encodings of f32src, the input of decode and reduce
	wire           []uint16 // scratch output of encode
}

var benchCache = map[int]*benchBufs{}

// buffers returns the buffers for dst of size bytes, made once per size.
func buffers(size int) *benchBufs {
	if b, ok := benchCache[size]; ok {
		return b
	}
	r := rand.New(rand.NewPCG(1, uint64(size)))
	n4, n8 := size/4, size/8
	b := &benchBufs{
		f32dst: make([]float32, n4), f32src: make([]float32, n4),
		f64dst: make([]float64, n8), f64src: make([]float64, n8),
		i32dst: make([]int32, n4), i32src: make([]int32, n4),
		fp16: make([]uint16, n4), bf16: make([]uint16, n4), wire: make([]uint16, n4),
	}
	for i := range b.f32src {
		b.f32dst[i] = float32(r.NormFloat64())
		b.f32src[i] = float32(r.NormFloat64()) * 1e-3
		b.i32dst[i], b.i32src[i] = int32(r.Uint32()), int32(r.Uint32())
		b.fp16[i], b.bf16[i] = ToFP16(b.f32src[i]), ToBF16(b.f32src[i])
	}
	for i := range b.f64src {
		b.f64dst[i], b.f64src[i] = r.NormFloat64(), r.NormFloat64()*1e-3
	}
	benchCache[size] = b
	return b
}

func loop(b *testing.B, dstBytes int, f func()) {
	b.SetBytes(int64(dstBytes))
	b.ReportAllocs()
	for b.Loop() {
		f()
	}
}

func benchCopy(b *testing.B, size int) {
	bb := buffers(size)
	loop(b, size, func() { copy(bb.f32dst, bb.f32src) })
}

func benchSum(b *testing.B, size int) {
	bb := buffers(size)
	d, s := bb.f32dst, bb.f32src
	b.Run("float32/serial", func(b *testing.B) { loop(b, size, func() { _ = ReduceWith(nil, OpSum, d, s) }) })
	b.Run("float32/parallel", func(b *testing.B) { loop(b, size, func() { _ = Reduce(OpSum, d, s) }) })
	// gonum (the kernel, see gonum.go) against the plain-Go baseline, serial.
	b.Run("float32/go", func(b *testing.B) { loop(b, size, func() { sumLoop(d, s) }) })
	b.Run("float32/gonum", func(b *testing.B) { loop(b, size, func() { sumF32(d, s) }) })
	d64, s64 := bb.f64dst, bb.f64src
	b.Run("float64/serial", func(b *testing.B) { loop(b, size, func() { _ = ReduceWith(nil, OpSum, d64, s64) }) })
	b.Run("float64/parallel", func(b *testing.B) { loop(b, size, func() { _ = Reduce(OpSum, d64, s64) }) })
	b.Run("float64/go", func(b *testing.B) { loop(b, size, func() { sumLoop(d64, s64) }) })
	b.Run("float64/gonum", func(b *testing.B) { loop(b, size, func() { sumF64(d64, s64) }) })
	di, si := bb.i32dst, bb.i32src
	b.Run("int32/serial", func(b *testing.B) { loop(b, size, func() { _ = ReduceWith(nil, OpSum, di, si) }) })
	b.Run("int32/parallel", func(b *testing.B) { loop(b, size, func() { _ = Reduce(OpSum, di, si) }) })
}

func benchMinMax(b *testing.B, size int) {
	bb := buffers(size)
	d, s := bb.f32dst, bb.f32src
	for _, op := range []Op{OpMin, OpMax} {
		b.Run(op.String()+"-float32/serial", func(b *testing.B) { loop(b, size, func() { _ = ReduceWith(nil, op, d, s) }) })
		b.Run(op.String()+"-float32/parallel", func(b *testing.B) { loop(b, size, func() { _ = Reduce(op, d, s) }) })
	}
}

func benchHalf(b *testing.B, size int) {
	bb := buffers(size)
	d, s, w := bb.f32dst, bb.f32src, bb.wire
	for _, pc := range []struct {
		name string
		p    *Pool
	}{{"serial", nil}, {"parallel", Default()}} {
		p := pc.p
		b.Run("encode-bf16/"+pc.name, func(b *testing.B) { loop(b, size/2, func() { _ = p.EncodeBF16(w, s) }) })
		b.Run("decode-bf16/"+pc.name, func(b *testing.B) { loop(b, size, func() { _ = p.DecodeBF16(d, bb.bf16) }) })
		b.Run("reduce-bf16/"+pc.name, func(b *testing.B) { loop(b, size, func() { _ = p.ReduceBF16(OpSum, d, bb.bf16) }) })
		b.Run("encode-fp16/"+pc.name, func(b *testing.B) { loop(b, size/2, func() { _ = p.EncodeFP16(w, s) }) })
		b.Run("decode-fp16/"+pc.name, func(b *testing.B) { loop(b, size, func() { _ = p.DecodeFP16(d, bb.fp16) }) })
		b.Run("reduce-fp16/"+pc.name, func(b *testing.B) { loop(b, size, func() { _ = p.ReduceFP16(OpSum, d, bb.fp16) }) })
	}
}

func BenchmarkCopy64KiB(b *testing.B)   { benchCopy(b, size64KiB) }
func BenchmarkCopy1MiB(b *testing.B)    { benchCopy(b, size1MiB) }
func BenchmarkCopy64MiB(b *testing.B)   { benchCopy(b, size64MiB) }
func BenchmarkSum64KiB(b *testing.B)    { benchSum(b, size64KiB) }
func BenchmarkSum1MiB(b *testing.B)     { benchSum(b, size1MiB) }
func BenchmarkSum64MiB(b *testing.B)    { benchSum(b, size64MiB) }
func BenchmarkMinMax64KiB(b *testing.B) { benchMinMax(b, size64KiB) }
func BenchmarkMinMax1MiB(b *testing.B)  { benchMinMax(b, size1MiB) }
func BenchmarkMinMax64MiB(b *testing.B) { benchMinMax(b, size64MiB) }
func BenchmarkHalf64KiB(b *testing.B)   { benchHalf(b, size64KiB) }
func BenchmarkHalf1MiB(b *testing.B)    { benchHalf(b, size1MiB) }
func BenchmarkHalf64MiB(b *testing.B)   { benchHalf(b, size64MiB) }
