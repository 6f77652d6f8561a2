package kernels

import "unsafe"

// Byte views. The transports deliver and take []byte; the ring reinterprets
// those bytes as elements in place, without a copy, through these views.
//
// A view shares memory with its argument and uses the host's byte order.
// Gyre's wire format is little-endian and Gyre runs on little-endian hosts
// (amd64, arm64), so the bytes on the wire are the elements in memory.
//
// Alignment: reinterpreting needs the first byte at an address that is a
// multiple of the element's alignment (4 for float32 and int32; 8 for
// float64 and int64 on 64-bit hosts; 2 for uint16). Go's allocator aligns every []byte of 8 bytes or more to 8, and
// every slice of a []T to T's alignment, so buffers from make([]byte, n) and
// from Bytes qualify; a subslice at an odd offset such as b[3:] does not.
// A misaligned buffer is reported as ErrAlign rather than viewed, because
// unaligned access is slow or faulting on some architectures and is
// invalid under the Go memory model for unsafe conversions.

// View reinterprets b as a slice of T. It returns ErrLength when len(b) is
// not a multiple of T's size and ErrAlign when b does not start at an
// address aligned for T. An empty b gives an empty view.
func View[T Number | ~uint16](b []byte) ([]T, error) {
	var z T
	size, align := int(unsafe.Sizeof(z)), uintptr(unsafe.Alignof(z))
	if len(b)%size != 0 {
		return nil, ErrLength
	}
	if len(b) == 0 {
		return []T{}, nil
	}
	p := unsafe.Pointer(unsafe.SliceData(b))
	if uintptr(p)%align != 0 {
		return nil, ErrAlign
	}
	return unsafe.Slice((*T)(p), len(b)/size), nil
}

// Bytes returns the memory of s as bytes, for handing a typed buffer to a
// transport. It never fails: any slice of T is aligned for T.
func Bytes[T Number | ~uint16](s []T) []byte {
	if len(s) == 0 {
		return []byte{}
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
}

// AsFloat32 views b as float32 elements; see View.
func AsFloat32(b []byte) ([]float32, error) { return View[float32](b) }

// AsFloat64 views b as float64 elements; see View.
func AsFloat64(b []byte) ([]float64, error) { return View[float64](b) }

// AsInt32 views b as int32 elements; see View.
func AsInt32(b []byte) ([]int32, error) { return View[int32](b) }

// AsInt64 views b as int64 elements; see View.
func AsInt64(b []byte) ([]int64, error) { return View[int64](b) }

// AsUint16 views b as uint16 elements, the wire form of bf16 and fp16; see
// View.
func AsUint16(b []byte) ([]uint16, error) { return View[uint16](b) }
