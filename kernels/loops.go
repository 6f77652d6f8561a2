package kernels

// Serial element-wise loops, one per element type and operator. Callers
// have checked that dst and src have equal length; each loop reslices src
// to len(dst) so the compiler drops the bounds checks.
//
// Min and Max use Go's built-in min and max, which the compiler turns into
// branch-free MINSS/MAXSS sequences on amd64 and which define the NaN rule
// this package documents: a NaN in either operand gives NaN, and min(-0, +0)
// is -0, max(-0, +0) is +0. For integers Sum wraps around on overflow (two's
// complement), like every MPI and NCCL implementation does in practice.

// sumLoop is dst += src in plain Go, unrolled 8 times. The integer types
// use it; for floats gonum's assembly is faster (gonum.go), and the
// benchmarks keep sumLoop as the baseline it was measured against.
func sumLoop[T Number](dst, src []T) {
	src = src[:len(dst)]
	for len(dst) >= 8 {
		d, s := dst[:8:8], src[:8:8]
		d[0] += s[0]
		d[1] += s[1]
		d[2] += s[2]
		d[3] += s[3]
		d[4] += s[4]
		d[5] += s[5]
		d[6] += s[6]
		d[7] += s[7]
		dst, src = dst[8:], src[8:]
	}
	for i := range dst {
		dst[i] += src[i]
	}
}

func minLoop[T Number](dst, src []T) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = min(dst[i], src[i])
	}
}

func maxLoop[T Number](dst, src []T) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = max(dst[i], src[i])
	}
}

func reduceF32(op Op, dst, src []float32) {
	switch op {
	case OpSum:
		sumF32(dst, src)
	case OpMin:
		minLoop(dst, src)
	case OpMax:
		maxLoop(dst, src)
	}
}

func reduceF64(op Op, dst, src []float64) {
	switch op {
	case OpSum:
		sumF64(dst, src)
	case OpMin:
		minLoop(dst, src)
	case OpMax:
		maxLoop(dst, src)
	}
}

func reduceI32(op Op, dst, src []int32) {
	switch op {
	case OpSum:
		sumLoop(dst, src)
	case OpMin:
		minLoop(dst, src)
	case OpMax:
		maxLoop(dst, src)
	}
}

func reduceI64(op Op, dst, src []int64) {
	switch op {
	case OpSum:
		sumLoop(dst, src)
	case OpMin:
		minLoop(dst, src)
	case OpMax:
		maxLoop(dst, src)
	}
}

func scaleLoop[T ~float32 | ~float64](dst []T, a T) {
	for i := range dst {
		dst[i] *= a
	}
}
