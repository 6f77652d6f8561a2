package kernels

import (
	"gonum.org/v1/gonum/blas/blas32"
	"gonum.org/v1/gonum/floats"
)

// sumF32Gonum adds src into dst through gonum's Saxpy with alpha 1, which
// runs gonum's SSE assembly (f32.AxpyUnitary) for unit strides. x·1 is
// exact, so the result is bitwise dst[i]+src[i].
func sumF32Gonum(dst, src []float32) {
	n := len(dst)
	if n == 0 {
		return
	}
	blas32.Axpy(1, blas32.Vector{N: n, Data: src[:n], Inc: 1}, blas32.Vector{N: n, Data: dst, Inc: 1})
}

// sumF64Gonum adds src into dst through floats.Add, which runs gonum's SSE2
// assembly (f64.AxpyUnitaryTo with alpha 1).
func sumF64Gonum(dst, src []float64) { floats.Add(dst, src[:len(dst)]) }

var (
	sumF32Impl = sumF32Gonum
	sumF64Impl = sumF64Gonum
)
