package kernels

import (
	"math"
	"sync"
)

// Wire compression. A bf16 or fp16 value travels as its uint16 bit pattern;
// the reductions still accumulate in float32 (ReduceBF16, ReduceFP16), so
// only the bytes on the wire are halved, not the precision of the sum.
//
// Every conversion from float32 rounds to nearest, ties to even, the IEEE
// 754 default that hardware converters (F16C, AVX512-BF16, CUDA) use. A
// NaN stays a quiet NaN of the same sign, keeping the top payload bits that
// fit. Conversions to float32 are exact.

// ToBF16 rounds f to the nearest bfloat16 (1 sign bit, 8 exponent bits, 7
// fraction bits: float32's range with 8 bits of precision). Finite values
// beyond the largest bfloat16 round to ±Inf; float32 subnormals round to
// bfloat16 subnormals or zero, since bfloat16 has the same exponent range.
func ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x0040 // quiet NaN
	}
	// Adding 0x7fff plus the lowest kept bit rounds ties to even; the carry
	// may ripple into the exponent, which is the correct result (and turns
	// the largest values into Inf).
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// FromBF16 returns the float32 whose value is the bfloat16 h. It is exact.
func FromBF16(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// fp16 (IEEE 754 binary16) constants, as float32 bit patterns of |x|.
const (
	f32Inf     = 0x7f800000
	f16RoundUp = 0x477ff000 // 65520 = 65504 + half an ulp: from here on, ±Inf
	f16MinNorm = 0x38800000 // 2^-14, the smallest normal binary16
	f16HalfSub = 0x33000000 // 2^-25, half the smallest subnormal: ties to 0
)

// ToFP16 rounds f to the nearest IEEE 754 binary16 (1 sign bit, 5 exponent
// bits, 10 fraction bits). Values of magnitude 65520 or more (65504, the
// largest half, plus half an ulp) become ±Inf; values below 2^-14 become
// binary16 subnormals, and those of magnitude 2^-25 or less become ±0.
func ToFP16(f float32) uint16 {
	b := math.Float32bits(f)
	// a is |f| - 2^-14 as bit patterns, so the normal range is one
	// unsigned comparison.
	a := b&0x7fffffff - f16MinNorm
	if a < f16RoundUp-f16MinNorm {
		// Normal: rebias the exponent from 127 to 15 (f16MinNorm minus
		// 112<<23 is 1<<23) and round away the low 13 fraction bits, ties
		// to even. A carry into the exponent is the correct rounding.
		a += 1<<23 + 0x0fff + (a>>13)&1
		return uint16(b>>16)&0x8000 | uint16(a>>13)
	}
	return toFP16Slow(b)
}

// toFP16Slow converts the float32 bit pattern b when it is not in the
// binary16 normal range: NaN, overflow, subnormal or zero.
func toFP16Slow(b uint32) uint16 {
	sign := uint16(b>>16) & 0x8000
	a := b & 0x7fffffff
	switch {
	case a > f32Inf:
		return sign | 0x7e00 | uint16(a>>13)&0x01ff // quiet NaN
	case a >= f16RoundUp:
		return sign | 0x7c00
	case a > f16HalfSub:
		// Subnormal: the result counts units of 2^-24. With the implicit
		// bit the value is m·2^(e-150), so the count is m >> (126-e),
		// rounded to nearest even. It may round up to the smallest
		// normal, 0x0400, which is still the right bit pattern.
		e := a >> 23
		m := a&0x007fffff | 0x00800000
		s := 126 - e // 14..24
		r := m >> s
		rem := m & (1<<s - 1)
		half := uint32(1) << (s - 1)
		if rem > half || rem == half && r&1 == 1 {
			r++
		}
		return sign | uint16(r)
	}
	return sign
}

// FromFP16 returns the float32 whose value is the binary16 h. It is exact:
// every binary16, subnormals included, is a normal float32. It uses only
// integer operations and a subtraction of normal numbers, so subnormal
// inputs cost no microcode assist.
func FromFP16(h uint16) float32 {
	o := uint32(h&0x7fff) << 13
	exp := o & 0x0f800000
	o += (127 - 15) << 23
	switch exp {
	case 0x0f800000: // Inf or NaN: exponent all ones
		o += (128 - 16) << 23
	case 0: // zero or subnormal: renormalise by subtracting 2^-14
		o += 1 << 23
		o = math.Float32bits(math.Float32frombits(o) - math.Float32frombits((127-14)<<23))
	}
	return math.Float32frombits(o | uint32(h&0x8000)<<16)
}

// Serial slice loops. The caller checks lengths; dst and src have equal
// length here.

// encodeBF16 is ToBF16 over a slice, with src given as float32 bit
// patterns (loading them as integers saves a move out of the floating-point
// registers per element). Both the rounded and the NaN result are computed
// and one is selected (the compiler emits CMOV), instead of ToBF16's early
// return.
func encodeBF16(dst []uint16, src []uint32) {
	src = src[:len(dst)]
	for i := range dst {
		b := src[i]
		r := (b + 0x7fff + (b>>16)&1) >> 16
		if b&0x7fffffff > 0x7f800000 {
			r = b>>16 | 0x0040 // quiet NaN
		}
		dst[i] = uint16(r)
	}
}

func decodeBF16(dst []float32, src []uint16) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = FromBF16(src[i])
	}
}

// encodeFP16 is ToFP16 over a slice, with src given as float32 bit
// patterns. It is written for throughput on gradient-like data, where a
// few percent of values fall in fp16's subnormal range: a branch on them
// would mispredict, so both the normal and the subnormal result are computed
// and one is selected (the compiler emits CMOV). The subnormal result comes
// from a float32 addition of 0.5, whose ulp (2^-24) is the fp16 subnormal
// unit, so the FPU does the nearest-even rounding; an |x| that rounds up to
// 2^-14 gives 0x0400, the right pattern. Only overflow and NaN, which are
// rare, take a branch to toFP16Slow.
func encodeFP16(dst []uint16, src []uint32) {
	src = src[:len(dst)]
	for i := range dst {
		b := src[i]
		a := b & 0x7fffffff
		if a >= f16RoundUp {
			dst[i] = toFP16Slow(b)
			continue
		}
		r := (a - (127-15)<<23 + 0x0fff + (a>>13)&1) >> 13
		sub := math.Float32bits(math.Float32frombits(a)+0.5) - 0x3f000000
		if a < f16MinNorm {
			r = sub
		}
		dst[i] = uint16(b>>16)&0x8000 | uint16(r)
	}
}

// fp16Table maps every binary16 pattern to its float32 value. Decoding by
// table is about four times faster than FromFP16's arithmetic (a load
// against some twenty instructions), which matters because the ring decodes
// every compressed element it receives. The table is 256 KiB, built on
// first use from FromFP16; gradients touch only the few exponents they
// span, so the part in use stays in cache.
var fp16Table = sync.OnceValue(func() *[1 << 16]float32 {
	t := new([1 << 16]float32)
	for i := range t {
		t[i] = FromFP16(uint16(i))
	}
	return t
})

func decodeFP16(dst []float32, src []uint16) {
	t := fp16Table()
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = t[src[i]]
	}
}

func reduceBF16(op Op, dst []float32, src []uint16) {
	src = src[:len(dst)]
	switch op {
	case OpSum:
		for i := range dst {
			dst[i] += FromBF16(src[i])
		}
	case OpMin:
		for i := range dst {
			dst[i] = min(dst[i], FromBF16(src[i]))
		}
	case OpMax:
		for i := range dst {
			dst[i] = max(dst[i], FromBF16(src[i]))
		}
	}
}

func reduceFP16(op Op, dst []float32, src []uint16) {
	t := fp16Table()
	src = src[:len(dst)]
	switch op {
	case OpSum:
		for i := range dst {
			dst[i] += t[src[i]]
		}
	case OpMin:
		for i := range dst {
			dst[i] = min(dst[i], t[src[i]])
		}
	case OpMax:
		for i := range dst {
			dst[i] = max(dst[i], t[src[i]])
		}
	}
}
