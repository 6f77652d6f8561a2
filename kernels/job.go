package kernels

import "unsafe"

// A job is one kernel call over a range of elements, held as plain values
// (pointers and a length) so that it can be split into ranges and sent to a
// worker over a channel without allocating.
type job struct {
	k        kern
	dt       DType // kReduce, kScale
	op       Op    // kReduce, kReduceBF16, kReduceFP16
	dst, src unsafe.Pointer
	n        int     // elements
	a        float64 // kScale: the factor, exact for float32 and float64
}

type kern uint8

const (
	kReduce     kern = iota + 1 // dt, op: dst[i] = op(dst[i], src[i])
	kScale                      // dt: dst[i] *= a
	kReduceBF16                 // op: float32 dst, uint16 src
	kReduceFP16                 // op: float32 dst, uint16 src
	kEncodeBF16                 // uint16 dst, float32 src
	kDecodeBF16                 // float32 dst, uint16 src
	kEncodeFP16                 // uint16 dst, float32 src
	kDecodeFP16                 // float32 dst, uint16 src
)

// sizes returns the width in bytes of one dst and one src element.
func (j *job) sizes() (dst, src uintptr) {
	switch j.k {
	case kReduce, kScale:
		s := uintptr(j.dt.Size())
		return s, s
	case kReduceBF16, kReduceFP16, kDecodeBF16, kDecodeFP16:
		return 4, 2
	default: // kEncodeBF16, kEncodeFP16
		return 2, 4
	}
}

// part returns the job restricted to elements [lo, hi).
func (j *job) part(lo, hi int) job {
	ds, ss := j.sizes()
	p := *j
	p.dst = unsafe.Add(j.dst, uintptr(lo)*ds)
	if j.src != nil {
		p.src = unsafe.Add(j.src, uintptr(lo)*ss)
	}
	p.n = hi - lo
	return p
}

func slice[T any](p unsafe.Pointer, n int) []T { return unsafe.Slice((*T)(p), n) }

// run executes j serially on the calling goroutine.
func run(j *job) {
	n := j.n
	if n == 0 {
		return
	}
	switch j.k {
	case kReduce:
		switch j.dt {
		case Float32:
			reduceF32(j.op, slice[float32](j.dst, n), slice[float32](j.src, n))
		case Float64:
			reduceF64(j.op, slice[float64](j.dst, n), slice[float64](j.src, n))
		case Int32:
			reduceI32(j.op, slice[int32](j.dst, n), slice[int32](j.src, n))
		case Int64:
			reduceI64(j.op, slice[int64](j.dst, n), slice[int64](j.src, n))
		}
	case kScale:
		switch j.dt {
		case Float32:
			scaleLoop(slice[float32](j.dst, n), float32(j.a))
		case Float64:
			scaleLoop(slice[float64](j.dst, n), j.a)
		}
	case kReduceBF16:
		reduceBF16(j.op, slice[float32](j.dst, n), slice[uint16](j.src, n))
	case kReduceFP16:
		reduceFP16(j.op, slice[float32](j.dst, n), slice[uint16](j.src, n))
	case kEncodeBF16:
		encodeBF16(slice[uint16](j.dst, n), slice[uint32](j.src, n))
	case kDecodeBF16:
		decodeBF16(slice[float32](j.dst, n), slice[uint16](j.src, n))
	case kEncodeFP16:
		encodeFP16(slice[uint16](j.dst, n), slice[uint32](j.src, n))
	case kDecodeFP16:
		decodeFP16(slice[float32](j.dst, n), slice[uint16](j.src, n))
	}
}

func ptr[T any](s []T) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(s)) }
