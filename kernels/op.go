package kernels

import "fmt"

// Op is a reduction operator. The zero Op is invalid, so an unset operator
// is rejected with ErrOp rather than silently summed.
//
// Avg is not an Op: a collective averages by summing and then calling
// Scale with 1/N once, at the end.
type Op uint8

// Reduction operators.
const (
	OpSum Op = iota + 1 // dst[i] = dst[i] + src[i]
	OpMin               // dst[i] = min(dst[i], src[i]); NaN propagates
	OpMax               // dst[i] = max(dst[i], src[i]); NaN propagates
)

func (o Op) valid() bool { return o >= OpSum && o <= OpMax }

func (o Op) String() string {
	switch o {
	case OpSum:
		return "sum"
	case OpMin:
		return "min"
	case OpMax:
		return "max"
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// DType names an element type, for callers that hold their data as bytes
// (the ring receives []byte from the transport) and learn its type at run
// time. The zero DType is invalid.
type DType uint8

// Element types.
const (
	Float32 DType = iota + 1
	Float64
	Int32
	Int64
)

// Size returns the width of one element in bytes, or 0 for an invalid
// DType.
func (d DType) Size() int {
	switch d {
	case Float32, Int32:
		return 4
	case Float64, Int64:
		return 8
	}
	return 0
}

func (d DType) String() string {
	switch d {
	case Float32:
		return "float32"
	case Float64:
		return "float64"
	case Int32:
		return "int32"
	case Int64:
		return "int64"
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}
