package kernels

import (
	"gonum.org/v1/gonum/blas/blas32"
	"gonum.org/v1/gonum/floats"
)

// The float Sums, the kernels the ring's bandwidth depends on, use gonum's
// assembly rather than Go loops. The Go compiler does not vectorise, so an
// unrolled Go loop (sumLoop in loops.go, kept in the benchmarks as
// baselines) runs one scalar add per element, while gonum's SSE loops do
// four float32s or two float64s per instruction. Measured with
// BenchmarkSum* on this 2-core Xeon, quiet, serial, dst GB/s (median of 3
// to 5 runs), beside copy(dst, src) on the same buffers:
//
//	            float32 Go  gonum    float64 Go  gonum    copy
//	64 KiB      14.6        24.3     21.1        40.4     48.3
//	1 MiB       13.4        23.5     19.2        30.4     32.6
//	64 MiB       5.4         7.7      8.4         9.8      7.1
//
// At 64 MiB both are near memory speed and gonum's float32 sum keeps up
// with copy; split over two cores by a Pool it reaches about 2x copy.

// sumF32 adds src into dst through gonum's Saxpy with alpha 1, which runs
// gonum's SSE assembly (f32.AxpyUnitary) for unit strides. 1·x is exact, so
// the result is bitwise dst[i]+src[i].
func sumF32(dst, src []float32) {
	n := len(dst)
	if n == 0 {
		return
	}
	blas32.Axpy(1, blas32.Vector{N: n, Data: src[:n], Inc: 1}, blas32.Vector{N: n, Data: dst, Inc: 1})
}

// sumF64 adds src into dst through floats.Add, which runs gonum's SSE2
// assembly (f64.AxpyUnitaryTo with alpha 1).
func sumF64(dst, src []float64) { floats.Add(dst, src[:len(dst)]) }
