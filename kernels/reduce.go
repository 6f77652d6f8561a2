package kernels

import "unsafe"

// Number is the set of element types the reductions support.
type Number interface {
	~float32 | ~float64 | ~int32 | ~int64
}

// Float is the set of floating-point element types, which Scale supports.
type Float interface{ ~float32 | ~float64 }

// dtypeOf maps T onto its DType by size and by whether 1/2 truncates.
func dtypeOf[T Number]() DType {
	var z T
	one := T(1)
	isFloat := one/2 != 0
	switch {
	case unsafe.Sizeof(z) == 4 && isFloat:
		return Float32
	case unsafe.Sizeof(z) == 4:
		return Int32
	case isFloat:
		return Float64
	}
	return Int64
}

// Reduce sets dst[i] = op(dst[i], src[i]) for every i, splitting large
// buffers across cores through Default(). It returns ErrOp for an unknown
// op and ErrLength when len(dst) != len(src), leaving dst untouched.
//
// Float Min and Max propagate NaN: if either operand is NaN the result is
// NaN (MPI and NCCL leave this undefined). min(-0, +0) is -0 and
// max(-0, +0) is +0. Integer Sum wraps around on overflow.
func Reduce[T Number](op Op, dst, src []T) error { return ReduceWith(Default(), op, dst, src) }

// ReduceWith is Reduce on the pool p; a nil p runs on the calling goroutine
// only.
func ReduceWith[T Number](p *Pool, op Op, dst, src []T) error {
	if !op.valid() {
		return ErrOp
	}
	if len(dst) != len(src) {
		return ErrLength
	}
	p.exec(job{k: kReduce, dt: dtypeOf[T](), op: op, dst: ptr(dst), src: ptr(src), n: len(dst)})
	return nil
}

// Scale sets dst[i] *= a for every i, splitting large buffers across cores
// through Default(). Avg is Sum followed by Scale with 1/N.
func Scale[T Float](dst []T, a T) { ScaleWith(Default(), dst, a) }

// ScaleWith is Scale on the pool p; a nil p runs on the calling goroutine
// only.
func ScaleWith[T Float](p *Pool, dst []T, a T) {
	p.exec(job{k: kScale, dt: dtypeOf[T](), dst: ptr(dst), n: len(dst), a: float64(a)})
}

// aligned reports whether b starts at a multiple of n bytes.
func aligned(b []byte, n int) bool {
	return len(b) == 0 || uintptr(ptr(b))%uintptr(n) == 0
}

// ReduceBytes is Reduce for buffers held as bytes, the form the transports
// deliver, with the element type given by dt. It returns ErrDType, ErrOp,
// ErrLength (unequal lengths, or not a whole number of elements) or
// ErrAlign (see View) before touching dst.
func (p *Pool) ReduceBytes(dt DType, op Op, dst, src []byte) error {
	size := dt.Size()
	switch {
	case size == 0:
		return ErrDType
	case !op.valid():
		return ErrOp
	case len(dst) != len(src) || len(dst)%size != 0:
		return ErrLength
	case !aligned(dst, size) || !aligned(src, size):
		return ErrAlign
	}
	p.exec(job{k: kReduce, dt: dt, op: op, dst: ptr(dst), src: ptr(src), n: len(dst) / size})
	return nil
}

// ReduceBytes is (*Pool).ReduceBytes on Default().
func ReduceBytes(dt DType, op Op, dst, src []byte) error {
	return Default().ReduceBytes(dt, op, dst, src)
}

// ScaleBytes is Scale for a buffer held as bytes. For Float32, a is first
// rounded to float32. It returns ErrDType for the integer types.
func (p *Pool) ScaleBytes(dt DType, dst []byte, a float64) error {
	if dt != Float32 && dt != Float64 {
		return ErrDType
	}
	size := dt.Size()
	if len(dst)%size != 0 {
		return ErrLength
	}
	if !aligned(dst, size) {
		return ErrAlign
	}
	if dt == Float32 {
		a = float64(float32(a))
	}
	p.exec(job{k: kScale, dt: dt, dst: ptr(dst), n: len(dst) / size, a: a})
	return nil
}

// ScaleBytes is (*Pool).ScaleBytes on Default().
func ScaleBytes(dt DType, dst []byte, a float64) error { return Default().ScaleBytes(dt, dst, a) }

// ReduceBF16 sets dst[i] = op(dst[i], FromBF16(src[i])) for every i: it
// accumulates a bf16 wire buffer into float32 without an intermediate
// buffer. Errors and NaN rules are those of Reduce.
func (p *Pool) ReduceBF16(op Op, dst []float32, src []uint16) error {
	return p.half(kReduceBF16, op, dst, src)
}

// ReduceFP16 sets dst[i] = op(dst[i], FromFP16(src[i])) for every i; see
// ReduceBF16.
func (p *Pool) ReduceFP16(op Op, dst []float32, src []uint16) error {
	return p.half(kReduceFP16, op, dst, src)
}

// DecodeBF16 sets dst[i] = FromBF16(src[i]). It returns ErrLength when the
// lengths differ.
func (p *Pool) DecodeBF16(dst []float32, src []uint16) error {
	return p.decode(kDecodeBF16, dst, src)
}

// DecodeFP16 sets dst[i] = FromFP16(src[i]). It returns ErrLength when the
// lengths differ.
func (p *Pool) DecodeFP16(dst []float32, src []uint16) error {
	return p.decode(kDecodeFP16, dst, src)
}

func (p *Pool) half(k kern, op Op, dst []float32, src []uint16) error {
	if !op.valid() {
		return ErrOp
	}
	if len(dst) != len(src) {
		return ErrLength
	}
	p.exec(job{k: k, op: op, dst: ptr(dst), src: ptr(src), n: len(dst)})
	return nil
}

func (p *Pool) decode(k kern, dst []float32, src []uint16) error {
	if len(dst) != len(src) {
		return ErrLength
	}
	p.exec(job{k: k, dst: ptr(dst), src: ptr(src), n: len(dst)})
	return nil
}

// EncodeBF16 sets dst[i] = ToBF16(src[i]). It returns ErrLength when the
// lengths differ.
func (p *Pool) EncodeBF16(dst []uint16, src []float32) error {
	return p.encode(kEncodeBF16, dst, src)
}

// EncodeFP16 sets dst[i] = ToFP16(src[i]). It returns ErrLength when the
// lengths differ.
func (p *Pool) EncodeFP16(dst []uint16, src []float32) error {
	return p.encode(kEncodeFP16, dst, src)
}

func (p *Pool) encode(k kern, dst []uint16, src []float32) error {
	if len(dst) != len(src) {
		return ErrLength
	}
	p.exec(job{k: k, dst: ptr(dst), src: ptr(src), n: len(dst)})
	return nil
}

// ReduceBF16 is (*Pool).ReduceBF16 on Default().
func ReduceBF16(op Op, dst []float32, src []uint16) error { return Default().ReduceBF16(op, dst, src) }

// ReduceFP16 is (*Pool).ReduceFP16 on Default().
func ReduceFP16(op Op, dst []float32, src []uint16) error { return Default().ReduceFP16(op, dst, src) }

// EncodeBF16 is (*Pool).EncodeBF16 on Default().
func EncodeBF16(dst []uint16, src []float32) error { return Default().EncodeBF16(dst, src) }

// DecodeBF16 is (*Pool).DecodeBF16 on Default().
func DecodeBF16(dst []float32, src []uint16) error { return Default().DecodeBF16(dst, src) }

// EncodeFP16 is (*Pool).EncodeFP16 on Default().
func EncodeFP16(dst []uint16, src []float32) error { return Default().EncodeFP16(dst, src) }

// DecodeFP16 is (*Pool).DecodeFP16 on Default().
func DecodeFP16(dst []float32, src []uint16) error { return Default().DecodeFP16(dst, src) }
