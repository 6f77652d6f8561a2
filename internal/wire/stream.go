package wire

import (
	"errors"
	"fmt"
	"io"
)

// coalesceMax is the largest frame payload copied behind its header into a
// single write. Small messages then cost one write (one TLS record, one QUIC
// STREAM frame); larger ones are written in place to avoid the copy.
const coalesceMax = 32 << 10

// Writer writes messages as frames to a byte stream. It is not safe for
// concurrent use; a transport holds one per stream and serialises senders.
type Writer struct {
	w        io.Writer
	maxFrame int
	buf      []byte
}

// NewWriter returns a Writer that splits payloads into frames of at most
// maxFrame bytes.
func NewWriter(w io.Writer, maxFrame uint32) *Writer {
	return &Writer{w: w, maxFrame: int(maxFrame), buf: make([]byte, FrameHeaderSize+coalesceMax)}
}

// WriteMessage writes one message. It sets h.Len to len(p).
func (w *Writer) WriteMessage(h Header, p []byte) error {
	h.Len = uint64(len(p))
	return w.WriteFrames(h, p, 0)
}

// WriteFrames writes part, the bytes of a message of h.Len bytes that start
// at offset off, as frames. A message striped over several streams is sent
// as one WriteFrames per stream. An empty message is one empty frame.
func (w *Writer) WriteFrames(h Header, part []byte, off uint64) error {
	if off+uint64(len(part)) > h.Len {
		return fmt.Errorf("wire: part [%d,+%d) outside message of %d bytes", off, len(part), h.Len)
	}
	f := FrameHeader{Header: h, Offset: off}
	for first := true; first || len(part) > 0; first = false {
		n := min(len(part), w.maxFrame)
		f.Size = uint32(n)
		f.Encode(w.buf)
		var err error
		if n <= coalesceMax {
			copy(w.buf[FrameHeaderSize:], part[:n])
			_, err = w.w.Write(w.buf[:FrameHeaderSize+n])
		} else if _, err = w.w.Write(w.buf[:FrameHeaderSize]); err == nil {
			_, err = w.w.Write(part[:n])
		}
		if err != nil {
			return err
		}
		part = part[n:]
		f.Offset += uint64(n)
	}
	return nil
}

// Reader reads frames from a byte stream into caller-owned buffers. It is
// not safe for concurrent use.
type Reader struct {
	r   io.Reader
	lim Limits
	hdr [FrameHeaderSize]byte
}

// NewReader returns a Reader that enforces lim on every frame.
func NewReader(r io.Reader, lim Limits) *Reader {
	return &Reader{r: r, lim: lim}
}

// ReadFrameHeader reads and validates the next frame header. It returns
// io.EOF if the stream ends cleanly before the header.
func (r *Reader) ReadFrameHeader() (FrameHeader, error) {
	if _, err := io.ReadFull(r.r, r.hdr[:]); err != nil {
		return FrameHeader{}, err
	}
	f, err := Decode(r.hdr[:], r.lim)
	if err == nil && f.Size == 0 && f.Len != 0 {
		err = malformed("empty frame in a message of %d bytes", f.Len)
	}
	return f, err
}

// ReadPayload reads exactly len(dst) payload bytes.
func (r *Reader) ReadPayload(dst []byte) error {
	_, err := io.ReadFull(r.r, dst)
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// ReadMessage reads one whole message sent by WriteMessage on this stream
// into buf and returns its header and length. A message longer than buf is
// read and discarded, and ReadMessage returns an error wrapping
// ErrShortBuffer with the stream still in step.
func (r *Reader) ReadMessage(buf []byte) (Header, int, error) {
	f, err := r.ReadFrameHeader()
	if err != nil {
		return Header{}, 0, err
	}
	h := f.Header
	if f.Offset != 0 {
		return h, 0, malformed("message starts at offset %d", f.Offset)
	}
	fits := h.Len <= uint64(len(buf))
	var got uint64
	for {
		if fits {
			err = r.ReadPayload(buf[got : got+uint64(f.Size)])
		} else {
			err = r.discard(int64(f.Size))
		}
		if err != nil {
			return h, 0, err
		}
		got += uint64(f.Size)
		if got == h.Len {
			break
		}
		if f, err = r.ReadFrameHeader(); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return h, 0, err
		}
		if f.Header != h || f.Offset != got {
			return h, 0, malformed("frame at offset %d does not continue message at %d", f.Offset, got)
		}
	}
	if !fits {
		return h, 0, fmt.Errorf("%w: %d bytes into %d", ErrShortBuffer, h.Len, len(buf))
	}
	return h, int(got), nil
}

func (r *Reader) discard(n int64) error {
	_, err := io.CopyN(io.Discard, r.r, n)
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return err
}
