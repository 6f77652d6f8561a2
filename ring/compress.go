package ring

import (
	"fmt"
	"slices"

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
//
// The wire image. In the ring, every value that leaves a rank after its
// reduction completes is one that arrived in wire form or was just
// rounded through it: the Final receive's span, and every span an
// allgather step forwards. Encoding the decoded values again gives back
// the same bits, so a ring collective keeps the wire values of its buffer
// in an image, and a send that forwards what its receive left sends the
// image as it is: a third of the encodes of an allreduce at N = 2, 3 of
// 7 at N = 4. The image is the buffer's length in 16-bit values, kept by
// the Comm for its largest such collective. Sends that do not forward encode into the image too, so every
// span's image is where its send reads it, under the plan's ordering of
// sends and receives over that span.

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

// useWireImage is false only in the test that checks the wire image
// changes no bit of any result.
var useWireImage = true

// encodeSend returns send i's payload: its span's wire image as its
// receive left it, if it forwards one, else the span encoded into the
// image or the send scratch. In recursive doubling it also rounds the
// span in place (see above); the plan orders this write before the step's
// reducing receive and after the receive that last wrote the span.
func (o *op) encodeSend(i int) ([]byte, error) {
	x := &o.plan.Sends[i]
	w := o.sendScratch[:x.Len]
	if o.image != nil {
		w = o.image[x.Off:x.End()]
		if o.forwards[i] {
			return kernels.Bytes(w), nil
		}
	}
	span := f32(o.data[x.Off*o.es : x.End()*o.es])
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

// recvCompressed takes receive j's message into the receive scratch and
// reduces or decodes it into its span, keeping the wire values in the
// image if a send forwards them.
func (o *op) recvCompressed(j int) error {
	x := &o.plan.Recvs[j]
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
		if o.image != nil && o.keeps[j] {
			copy(o.image[x.Off:x.End()], w)
		}
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
	// Round to the wire precision through the image, or the scratch,
	// whose message is consumed: what this rank keeps is what it
	// forwards.
	if o.image != nil {
		w = o.image[x.Off:x.End()]
	}
	if err := o.codec.encode(w, span); err != nil {
		return fmt.Errorf("ring: encode: %w", err)
	}
	return o.codec.decode(span, w)
}

// forwardedImages finds, in a ring plan, the sends that forward exactly
// what their receive left in wire form (an overwriting receive's message,
// or a Final receive's rounded result) over the same span, and the
// receives whose wire values such a send forwards.
// Both are nil if no send forwards (a reduce-scatter, one rank), so that
// such plans need no image.
func forwardedImages(p Plan) (forwards, keeps []bool) {
	forwards, keeps = make([]bool, len(p.Sends)), make([]bool, len(p.Recvs))
	for i, x := range p.Sends {
		if x.After < 0 {
			continue
		}
		r := p.Recvs[x.After]
		if r.Span == x.Span && (!r.Reduce || r.Final) {
			forwards[i] = true
			if !r.Reduce {
				keeps[x.After] = true
			}
		}
	}
	if !slices.Contains(forwards, true) {
		return nil, nil
	}
	return forwards, keeps
}
