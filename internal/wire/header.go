package wire

import (
	"encoding/binary"
	"fmt"
)

// Version is the frame format version. A frame with another version is
// rejected, so mixed-version clusters fail loudly instead of misreading data.
const Version = 1

// FrameHeaderSize is the encoded size of a FrameHeader in bytes.
const FrameHeaderSize = 64

// magic starts every frame; it catches a stream that is out of step or that
// is not speaking Gyre at all.
var magic = [2]byte{'G', 'Y'}

// Kind says what a message is for.
type Kind uint8

// Message kinds.
const (
	KindData    Kind = iota + 1 // collective payload
	KindControl                 // boundary records and other small control messages
	KindProbe                   // latency and bandwidth probes
	KindBench                   // benchmark traffic
	kindEnd
)

// DType is the element type of a collective's buffer.
type DType uint8

// Element types. DTypeBytes is for untyped payloads.
const (
	DTypeBytes DType = iota
	DTypeFloat32
	DTypeFloat64
	DTypeInt32
	DTypeInt64
	DTypeBF16
	DTypeFP16
	dtypeEnd
)

// Size returns the width of one element in bytes (1 for DTypeBytes).
func (d DType) Size() int {
	switch d {
	case DTypeFloat32, DTypeInt32:
		return 4
	case DTypeFloat64, DTypeInt64:
		return 8
	case DTypeBF16, DTypeFP16:
		return 2
	default:
		return 1
	}
}

func (d DType) String() string {
	names := [...]string{"bytes", "float32", "float64", "int32", "int64", "bf16", "fp16"}
	if int(d) < len(names) {
		return names[d]
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// Op is a reduction operator.
type Op uint8

// Reduction operators. OpNone marks messages that carry no reduction.
const (
	OpNone Op = iota
	OpSum
	OpMin
	OpMax
	OpAvg
	opEnd
)

func (o Op) String() string {
	names := [...]string{"none", "sum", "min", "max", "avg"}
	if int(o) < len(names) {
		return names[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Header describes one message. The collective fields (Epoch through
// ChunkSize) are opaque to transports; the ring fills and checks them.
type Header struct {
	Kind      Kind
	Flags     uint8 // reserved for the collectives; transports pass it through
	DType     DType
	Op        Op
	Algo      uint8  // collective algorithm id
	Epoch     uint64 // membership epoch the message belongs to
	Seq       uint64 // collective sequence number within the epoch
	Step      uint32 // schedule step
	Chunk     uint32 // chunk index within the step
	Total     uint64 // elements in the whole collective buffer
	ChunkSize uint32 // pipeline chunk size in bytes
	Len       uint64 // payload bytes of this message; set by the transport on Send
}

// Validate reports whether h can be sent: a receiver's Decode rejects
// out-of-range enums, so a sender checks them first and a caller's bug is
// reported to the caller rather than as a broken peer.
func (h Header) Validate() error {
	switch {
	case h.Kind == 0 || h.Kind >= kindEnd:
		return malformed("unknown kind %d", h.Kind)
	case h.DType >= dtypeEnd:
		return malformed("unknown dtype %d", h.DType)
	case h.Op >= opEnd:
		return malformed("unknown op %d", h.Op)
	}
	return nil
}

// FrameHeader is a Header plus the position of one frame's payload within
// its message.
type FrameHeader struct {
	Header
	Offset uint64 // byte offset of this frame's payload within the message
	Size   uint32 // payload bytes that follow this header
}

// Limits bound what a decoder accepts from a peer.
type Limits struct {
	// MaxFrame is the largest frame payload accepted, in bytes.
	MaxFrame uint32
	// MaxMessage is the largest message accepted, in bytes.
	MaxMessage uint64
}

// DefaultMaxFrame is the default frame payload limit: large enough that the
// 64-byte header costs under 0.01%, small enough to bound per-frame buffering.
const DefaultMaxFrame = 1 << 20

// DefaultMaxMessage is the default message limit (4 GiB - 1).
const DefaultMaxMessage = 1<<32 - 1

// DefaultLimits returns the default limits.
func DefaultLimits() Limits {
	return Limits{MaxFrame: DefaultMaxFrame, MaxMessage: DefaultMaxMessage}
}

// Validate reports whether the limits are usable.
func (l Limits) Validate() error {
	if l.MaxFrame == 0 {
		return fmt.Errorf("wire: MaxFrame must be positive")
	}
	if l.MaxMessage == 0 {
		return fmt.Errorf("wire: MaxMessage must be positive")
	}
	return nil
}

// Encode writes f into b, which must hold at least FrameHeaderSize bytes.
func (f *FrameHeader) Encode(b []byte) {
	_ = b[FrameHeaderSize-1]
	b[0], b[1] = magic[0], magic[1]
	b[2] = Version
	b[3] = uint8(f.Kind)
	b[4] = f.Flags
	b[5] = uint8(f.DType)
	b[6] = uint8(f.Op)
	b[7] = f.Algo
	le := binary.LittleEndian
	le.PutUint64(b[8:], f.Epoch)
	le.PutUint64(b[16:], f.Seq)
	le.PutUint32(b[24:], f.Step)
	le.PutUint32(b[28:], f.Chunk)
	le.PutUint64(b[32:], f.Total)
	le.PutUint32(b[40:], f.ChunkSize)
	le.PutUint32(b[44:], f.Size)
	le.PutUint64(b[48:], f.Len)
	le.PutUint64(b[56:], f.Offset)
}

// Decode parses a frame header from b and checks it against lim. It never
// allocates, and it rejects any header whose lengths exceed the limits or
// whose fields are out of range.
func Decode(b []byte, lim Limits) (FrameHeader, error) {
	var f FrameHeader
	if len(b) < FrameHeaderSize {
		return f, malformed("truncated header: %d of %d bytes", len(b), FrameHeaderSize)
	}
	if b[0] != magic[0] || b[1] != magic[1] {
		return f, malformed("bad magic %#x %#x", b[0], b[1])
	}
	if b[2] != Version {
		return f, &VersionError{Got: b[2]}
	}
	le := binary.LittleEndian
	f.Kind = Kind(b[3])
	f.Flags = b[4]
	f.DType = DType(b[5])
	f.Op = Op(b[6])
	f.Algo = b[7]
	f.Epoch = le.Uint64(b[8:])
	f.Seq = le.Uint64(b[16:])
	f.Step = le.Uint32(b[24:])
	f.Chunk = le.Uint32(b[28:])
	f.Total = le.Uint64(b[32:])
	f.ChunkSize = le.Uint32(b[40:])
	f.Size = le.Uint32(b[44:])
	f.Len = le.Uint64(b[48:])
	f.Offset = le.Uint64(b[56:])
	if err := f.Header.Validate(); err != nil {
		return f, err
	}
	switch {
	case f.Size > lim.MaxFrame:
		return f, tooLarge("frame", uint64(f.Size), uint64(lim.MaxFrame))
	case f.Len > lim.MaxMessage:
		return f, tooLarge("message", f.Len, lim.MaxMessage)
	case f.Offset > f.Len || uint64(f.Size) > f.Len-f.Offset:
		return f, malformed("frame [%d,+%d) outside message of %d bytes", f.Offset, f.Size, f.Len)
	}
	return f, nil
}
