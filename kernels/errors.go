package kernels

import "errors"

var (
	// ErrLength means the buffers passed to one call hold different numbers
	// of elements, or a byte buffer's length is not a whole number of
	// elements.
	ErrLength = errors.New("kernels: length mismatch")
	// ErrOp means the reduction operator is not OpSum, OpMin or OpMax.
	ErrOp = errors.New("kernels: unknown reduction op")
	// ErrDType means the element type is not one of the DType constants.
	ErrDType = errors.New("kernels: unknown dtype")
	// ErrAlign means a byte buffer does not start at an address aligned for
	// the element type it is viewed as.
	ErrAlign = errors.New("kernels: misaligned buffer")
)
