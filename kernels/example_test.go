package kernels_test

import (
	"fmt"

	"github.com/gyre-ml/gyre/kernels"
)

// The ring receives a chunk as bytes and reduces it into its own buffer in
// place, with the element type known only at run time.
func ExampleReduceBytes() {
	mine := kernels.Bytes([]float32{1, 2, 3, 4})
	received := kernels.Bytes([]float32{10, 20, 30, 40})
	if err := kernels.ReduceBytes(kernels.Float32, kernels.OpSum, mine, received); err != nil {
		fmt.Println(err)
		return
	}
	// Avg over a world of 2: Sum, then Scale by 1/N once at the end.
	if err := kernels.ScaleBytes(kernels.Float32, mine, 0.5); err != nil {
		fmt.Println(err)
		return
	}
	v, _ := kernels.AsFloat32(mine)
	fmt.Println(v)
	// Output: [5.5 11 16.5 22]
}

// With bf16 wire compression the sender encodes its float32 chunk, and the
// receiver accumulates the uint16 wire values straight into float32.
func ExampleReduceBF16() {
	send := []float32{1.5, -2, 1e-3, 3.14159}
	wire := make([]uint16, len(send))
	_ = kernels.EncodeBF16(wire, send)

	acc := []float32{1, 1, 1, 1}
	_ = kernels.ReduceBF16(kernels.OpSum, acc, wire)
	fmt.Printf("%#04x\n%.5g\n", wire, acc)
	// Output:
	// [0x3fc0 0xc000 0x3a83 0x4049]
	// [2.5 -1 1.001 4.1406]
}

func ExampleToFP16() {
	for _, f := range []float32{1, 65504, 65520, 5.960464477539063e-08} {
		h := kernels.ToFP16(f)
		fmt.Printf("%g -> %#04x -> %g\n", f, h, kernels.FromFP16(h))
	}
	// Output:
	// 1 -> 0x3c00 -> 1
	// 65504 -> 0x7bff -> 65504
	// 65520 -> 0x7c00 -> +Inf
	// 5.9604645e-08 -> 0x0001 -> 5.9604645e-08
}
