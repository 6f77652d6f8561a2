// Package kernels holds Gyre's compute kernels: the element-wise
// reductions that the ring collectives apply to every chunk they receive,
// the bf16 and fp16 conversions used for optional wire compression, and the
// device probe that membership advertises.
//
// Reductions. Reduce sets dst[i] = op(dst[i], src[i]) for float32, float64,
// int32 and int64 with OpSum, OpMin or OpMax; Avg is OpSum followed by
// Scale with 1/N. ReduceBytes does the same for buffers held as bytes with
// the type given at run time as a DType, which is how the ring calls it: the
// transports deliver []byte, and View (AsFloat32, AsUint16, …) reinterprets
// them in place, checking alignment. ReduceBF16 and ReduceFP16 accumulate a
// compressed wire buffer straight into a float32 buffer, so compression
// never needs an intermediate buffer.
//
// Speed. The ring's bandwidth must not be limited by its reduction, so the
// float32 and float64 Sum use gonum's assembly where measurements showed it
// faster than plain Go (see loops.go and gonum.go), and a Pool splits
// buffers of ParallelThreshold bytes or more across cores with persistent
// worker goroutines. A warm call allocates nothing, so a large allreduce
// makes no allocations in steady state. The package-level functions use
// Default(), a pool started on first use; NewPool makes one that Close
// stops, and a nil *Pool runs everything on the caller.
//
// Determinism. Every kernel is element-wise, so the result does not depend
// on how a call is split: parallel and serial calls give bitwise identical
// results, which the ring relies on to keep every rank's state equal.
//
// Devices. Probe reports the host CPU (cores, model, memory) and never
// fails. GPUs will be reported through NVML in cgo builds.
//
// The package imports no other Gyre package: the ring maps its wire dtypes
// and operators onto DType and Op.
package kernels
