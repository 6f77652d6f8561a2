package wire

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// fuzzLimits are small so the fuzzer reaches the limit checks quickly.
var fuzzLimits = Limits{MaxFrame: 512, MaxMessage: 4096}

func seedStreams() [][]byte {
	var seeds [][]byte
	var s bytes.Buffer
	w := NewWriter(&s, 256)
	w.WriteMessage(Header{Kind: KindData, DType: DTypeFloat32, Op: OpSum, Epoch: 1, Seq: 2}, pattern(700, 1))
	seeds = append(seeds, bytes.Clone(s.Bytes()))
	s.Reset()
	w.WriteMessage(Header{Kind: KindControl}, nil)
	seeds = append(seeds, bytes.Clone(s.Bytes()))
	f := FrameHeader{Header: Header{Kind: KindData, Len: 1<<32 - 1}, Size: 1<<32 - 1}
	b := make([]byte, FrameHeaderSize)
	f.Encode(b)
	seeds = append(seeds, b, []byte("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"), nil)
	return seeds
}

// FuzzDecode checks that Decode never panics and that whatever it accepts
// re-encodes to the same bytes.
func FuzzDecode(f *testing.F) {
	for _, s := range seedStreams() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := Decode(b, fuzzLimits)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if h.Size > fuzzLimits.MaxFrame || h.Len > fuzzLimits.MaxMessage || h.Offset+uint64(h.Size) > h.Len {
			t.Fatalf("accepted out-of-limit header %+v", h)
		}
		var re [FrameHeaderSize]byte
		h.Encode(re[:])
		if !bytes.Equal(re[:], b[:FrameHeaderSize]) {
			t.Fatalf("re-encoding differs:\n%x\n%x", re, b[:FrameHeaderSize])
		}
	})
}

// FuzzReadMessage feeds arbitrary streams to the message reader: it must
// return typed errors, stay within its buffer and never loop forever.
func FuzzReadMessage(f *testing.F) {
	for _, s := range seedStreams() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, stream []byte) {
		rd := NewReader(bytes.NewReader(stream), fuzzLimits)
		buf := make([]byte, 1024)
		for range 64 {
			_, n, err := rd.ReadMessage(buf)
			if err == nil {
				if n > len(buf) {
					t.Fatalf("read %d bytes into %d", n, len(buf))
				}
				continue
			}
			if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, ErrShortBuffer) {
				if errors.Is(err, ErrShortBuffer) {
					continue
				}
				return
			}
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
	})
}

// FuzzReadHello checks the stream preamble parser.
func FuzzReadHello(f *testing.F) {
	f.Add(AppendHello(nil, Hello{From: "w0", Stripes: 1}))
	f.Add([]byte("GYH\x01\x00\x00\x01\xffabc"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		h, err := ReadHello(r)
		if read := len(b) - r.Len(); read > helloFixed+MaxPeerID {
			t.Fatalf("read %d bytes", read)
		}
		if err == nil && (h.From == "" || h.Stripes == 0 || h.Stripe >= h.Stripes) {
			t.Fatalf("accepted invalid hello %+v", h)
		}
	})
}
