package ring

import (
	"fmt"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/kernels"
)

// Wire compression. A compressed collective runs the plan of the
// uncompressed float32 one (the same spans, in elements), but every message
// carries the span's values as bf16 or fp16 bit patterns, and its header
// says so in DType, with ChunkSize in wire bytes. Sends encode into a
// scratch the Comm reuses; every receive lands in the receive scratch and
// is then reduced into the span (accumulating in float32) or decoded over
// it.
//
// Bit-identical results need every rank to end with the same float32
// values although only rounded ones travel. Two rules give that:
//   - a Final receive rounds its span to the wire precision once reduced
//     (and scaled, for Avg), so the owner of a reduced chunk holds exactly
//     what the others decode from it;
//   - in recursive doubling, where partners reduce each other's buffers, a
//     send rounds its span in place before the partner's data is reduced
//     into it, so both partners reduce the same two operands. (The ring
//     needs no such rule: a partial sum is reduced by one rank only.)

// codec is a wire format's kernels.
type codec struct {
	encode func(dst []uint16, src []float32) error
	decode func(dst []float32, src []uint16) error
	reduce func(op kernels.Op, dst []float32, src []uint16) error
}

var (
	bf16Codec = codec{kernels.EncodeBF16, kernels.DecodeBF16, kernels.ReduceBF16}
	fp16Codec = codec{kernels.EncodeFP16, kernels.DecodeFP16, kernels.ReduceFP16}
)

// codecOf returns the codec of a compressed wire type, nil for
// wire.DTypeBytes (no compression), or ErrInvalid.
func codecOf(wireType wire.DType) (*codec, error) {
	switch wireType {
	case wire.DTypeBytes:
		return nil, nil
	case wire.DTypeBF16:
		return &bf16Codec, nil
	case wire.DTypeFP16:
		return &fp16Codec, nil
	}
	return nil, invalid("wire compression to %v", wireType)
}

// f32 views a span of the caller's float32 buffer, which checkData has
// found aligned.
func f32(b []byte) []float32 {
	v, err := kernels.AsFloat32(b)
	if err != nil {
		panic(fmt.Sprintf("ring: float32 view: %v", err))
	}
	return v
}

// encodeSend encodes x's span into the send scratch and returns it as the
// payload. In recursive doubling it also rounds the span in place (see
// above); the plan orders this write before the step's reducing receive
// and after the receive that last wrote the span.
func (o *op) encodeSend(x *Xfer) ([]byte, error) {
	span := f32(o.data[x.Off*o.es : x.End()*o.es])
	w := o.sendScratch[:x.Len]
	if err := o.codec.encode(w, span); err != nil {
		return nil, fmt.Errorf("ring: encode: %w", err)
	}
	if o.plan.Algo == AlgoRecursiveDoubling {
		if err := o.codec.decode(span, w); err != nil {
			return nil, fmt.Errorf("ring: decode: %w", err)
		}
	}
	return kernels.Bytes(w), nil
}

// recvCompressed takes x's message into the receive scratch and reduces
// or decodes it into x's span.
func (o *op) recvCompressed(x *Xfer) error {
	w := o.recvScratch[:x.Len]
	if err := o.recv(x, kernels.Bytes(w)); err != nil {
		return err
	}
	// Off the transport: wait for the send still reading the span (see
	// walkRecvs).
	if err := o.waitSends(x.After); err != nil {
		return err
	}
	span := f32(o.data[x.Off*o.es : x.End()*o.es])
	if !x.Reduce {
		return o.codec.decode(span, w)
	}
	if err := o.codec.reduce(o.kop, span, w); err != nil {
		return fmt.Errorf("ring: reduce: %w", err)
	}
	if !x.Final {
		return nil
	}
	if o.scale != 0 {
		kernels.Scale(span, float32(o.scale))
	}
	// Round to the wire precision through the scratch, whose message is
	// consumed: what this rank keeps is what it forwards.
	if err := o.codec.encode(w, span); err != nil {
		return fmt.Errorf("ring: encode: %w", err)
	}
	return o.codec.decode(span, w)
}
