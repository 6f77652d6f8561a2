package wire

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"
)

func randomHeader(r *rand.Rand) Header {
	return Header{
		Kind:      Kind(1 + r.IntN(int(kindEnd)-1)),
		Flags:     uint8(r.Uint32()),
		DType:     DType(r.IntN(int(dtypeEnd))),
		Op:        Op(r.IntN(int(opEnd))),
		Algo:      uint8(r.Uint32()),
		Epoch:     r.Uint64(),
		Seq:       r.Uint64(),
		Step:      r.Uint32(),
		Chunk:     r.Uint32(),
		Total:     r.Uint64(),
		ChunkSize: r.Uint32(),
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	lim := Limits{MaxFrame: 1 << 20, MaxMessage: 1 << 40}
	var b [FrameHeaderSize]byte
	for i := 0; i < 1000; i++ {
		f := FrameHeader{Header: randomHeader(r)}
		f.Len = r.Uint64N(lim.MaxMessage + 1)
		f.Offset = r.Uint64N(f.Len + 1)
		f.Size = uint32(r.Uint64N(min(f.Len-f.Offset, uint64(lim.MaxFrame)) + 1))
		f.Encode(b[:])
		got, err := Decode(b[:], lim)
		if err != nil {
			t.Fatalf("Decode(%+v): %v", f, err)
		}
		if got != f {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, f)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	lim := Limits{MaxFrame: 1024, MaxMessage: 1 << 20}
	good := FrameHeader{Header: Header{Kind: KindData, DType: DTypeFloat32, Op: OpSum, Len: 4096}, Size: 1024}
	tests := []struct {
		name   string
		mutate func(b []byte)
		trunc  int
		want   error
	}{
		{"truncated", nil, FrameHeaderSize - 1, ErrMalformed},
		{"empty", nil, 0, ErrMalformed},
		{"bad magic", func(b []byte) { b[0] = 'X' }, 0, ErrMalformed},
		{"bad version", func(b []byte) { b[2] = Version + 1 }, 0, ErrMalformed},
		{"kind zero", func(b []byte) { b[3] = 0 }, 0, ErrMalformed},
		{"unknown kind", func(b []byte) { b[3] = uint8(kindEnd) }, 0, ErrMalformed},
		{"unknown dtype", func(b []byte) { b[5] = uint8(dtypeEnd) }, 0, ErrMalformed},
		{"unknown op", func(b []byte) { b[6] = uint8(opEnd) }, 0, ErrMalformed},
		{"frame too large", func(b []byte) { b[44], b[45] = 0x01, 0x04 }, 0, ErrTooLarge},
		{"4 GiB frame", func(b []byte) { copy(b[44:48], []byte{0xff, 0xff, 0xff, 0xff}) }, 0, ErrTooLarge},
		{"message too large", func(b []byte) { copy(b[48:56], []byte{0, 0, 0, 0, 1, 0, 0, 0}) }, 0, ErrTooLarge},
		{"frame past message end", func(b []byte) { b[56], b[57] = 0x01, 0x0c }, 0, ErrMalformed},
		{"offset past message end", func(b []byte) { copy(b[56:64], []byte{0, 0, 0, 0, 0, 0, 0, 1}) }, 0, ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := make([]byte, FrameHeaderSize)
			good.Encode(b)
			if tt.mutate != nil {
				tt.mutate(b)
			}
			if tt.trunc != 0 || tt.mutate == nil {
				b = b[:tt.trunc]
			}
			_, err := Decode(b, lim)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Decode = %v, want %v", err, tt.want)
			}
		})
	}
	var ve *VersionError
	b := make([]byte, FrameHeaderSize)
	good.Encode(b)
	b[2] = 9
	if _, err := Decode(b, lim); !errors.As(err, &ve) || ve.Got != 9 {
		t.Fatalf("bad version gave %v, want a VersionError naming 9", err)
	}
	var le *LimitError
	b[2] = Version
	copy(b[44:48], []byte{0xff, 0xff, 0xff, 0xff})
	if _, err := Decode(b, lim); !errors.As(err, &le) || le.What != "frame" || le.Limit != 1024 {
		t.Fatalf("oversize frame gave %v, want a LimitError for the frame", err)
	}
}

func pattern(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed+1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestMessageRoundTrip(t *testing.T) {
	const maxFrame = 1000
	sizes := []int{0, 1, maxFrame - 1, maxFrame, maxFrame + 1, 3*maxFrame + 7, coalesceMax + 1}
	var stream bytes.Buffer
	w := NewWriter(&stream, maxFrame)
	r := rand.New(rand.NewPCG(3, 4))
	var headers []Header
	for i, n := range sizes {
		h := randomHeader(r)
		h.Len = 12345 // WriteMessage must overwrite it
		if err := w.WriteMessage(h, pattern(n, uint64(i))); err != nil {
			t.Fatal(err)
		}
		h.Len = uint64(n)
		headers = append(headers, h)
	}
	// A writer with coalescing beyond the frame size exercises the in-place path.
	big := NewWriter(&stream, 64<<10)
	if err := big.WriteMessage(Header{Kind: KindBench}, pattern(50<<10, 99)); err != nil {
		t.Fatal(err)
	}
	rd := NewReader(&stream, Limits{MaxFrame: 64 << 10, MaxMessage: 1 << 20})
	buf := make([]byte, 64<<10)
	for i, n := range sizes {
		h, got, err := rd.ReadMessage(buf)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if h != headers[i] || got != n || !bytes.Equal(buf[:got], pattern(n, uint64(i))) {
			t.Fatalf("message %d: header %+v len %d, want %+v len %d", i, h, got, headers[i], n)
		}
	}
	if h, got, err := rd.ReadMessage(buf); err != nil || got != 50<<10 || h.Kind != KindBench || !bytes.Equal(buf[:got], pattern(50<<10, 99)) {
		t.Fatalf("large-frame message: %+v, %d, %v", h, got, err)
	}
	if _, _, err := rd.ReadMessage(buf); err != io.EOF {
		t.Fatalf("after the last message: %v, want io.EOF", err)
	}
}

func TestShortBufferKeepsStreamInStep(t *testing.T) {
	var stream bytes.Buffer
	w := NewWriter(&stream, 100)
	w.WriteMessage(Header{Kind: KindData}, pattern(450, 1))
	w.WriteMessage(Header{Kind: KindControl}, pattern(30, 2))
	rd := NewReader(&stream, Limits{MaxFrame: 100, MaxMessage: 1000})
	buf := make([]byte, 64)
	if _, _, err := rd.ReadMessage(buf); !errors.Is(err, ErrShortBuffer) {
		t.Fatalf("oversize message: %v, want ErrShortBuffer", err)
	}
	h, n, err := rd.ReadMessage(buf)
	if err != nil || h.Kind != KindControl || !bytes.Equal(buf[:n], pattern(30, 2)) {
		t.Fatalf("message after the discarded one: %+v, %d, %v", h, n, err)
	}
}

func TestReadMessageRejectsBrokenStreams(t *testing.T) {
	lim := Limits{MaxFrame: 100, MaxMessage: 1000}
	frame := func(f FrameHeader, payload int) []byte {
		b := make([]byte, FrameHeaderSize+payload)
		f.Encode(b)
		return b
	}
	h := Header{Kind: KindData, Len: 150}
	tests := []struct {
		name   string
		stream []byte
		want   error
	}{
		{"eof inside header", frame(FrameHeader{Header: h, Size: 100}, 100)[:10], io.ErrUnexpectedEOF},
		{"eof inside payload", frame(FrameHeader{Header: h, Size: 100}, 100)[:FrameHeaderSize+50], io.ErrUnexpectedEOF},
		{"eof between frames", frame(FrameHeader{Header: h, Size: 100}, 100), io.ErrUnexpectedEOF},
		{"first frame not at zero", frame(FrameHeader{Header: h, Size: 50, Offset: 100}, 50), ErrMalformed},
		{"gap between frames", append(frame(FrameHeader{Header: h, Size: 100}, 100),
			frame(FrameHeader{Header: h, Size: 40, Offset: 110}, 40)...), ErrMalformed},
		{"header changes mid message", append(frame(FrameHeader{Header: h, Size: 100}, 100),
			frame(FrameHeader{Header: Header{Kind: KindControl, Len: 150}, Size: 50, Offset: 100}, 50)...), ErrMalformed},
		{"empty frame in message", frame(FrameHeader{Header: h, Size: 0}, 0), ErrMalformed},
		{"garbage", pattern(200, 7), ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rd := NewReader(bytes.NewReader(tt.stream), lim)
			if _, _, err := rd.ReadMessage(make([]byte, 1000)); !errors.Is(err, tt.want) {
				t.Fatalf("ReadMessage = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestStripedParts(t *testing.T) {
	msg := pattern(1000, 5)
	h := Header{Kind: KindData, Len: uint64(len(msg))}
	var s0, s1 bytes.Buffer
	if err := NewWriter(&s0, 128).WriteFrames(h, msg[:600], 0); err != nil {
		t.Fatal(err)
	}
	if err := NewWriter(&s1, 128).WriteFrames(h, msg[600:], 600); err != nil {
		t.Fatal(err)
	}
	if err := NewWriter(&s1, 128).WriteFrames(h, msg, 1); err == nil {
		t.Fatal("a part running past the message end was accepted")
	}
	got := make([]byte, len(msg))
	lim := Limits{MaxFrame: 128, MaxMessage: 1 << 20}
	for _, s := range []*bytes.Buffer{&s0, &s1} {
		rd := NewReader(s, lim)
		for {
			f, err := rd.ReadFrameHeader()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := rd.ReadPayload(got[f.Offset : f.Offset+uint64(f.Size)]); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !bytes.Equal(got, msg) {
		t.Fatal("striped message reassembled wrongly")
	}
}

func TestReadMessageDoesNotAllocate(t *testing.T) {
	var stream bytes.Buffer
	NewWriter(&stream, 4096).WriteMessage(Header{Kind: KindData}, pattern(10000, 1))
	src := stream.Bytes()
	br := bytes.NewReader(src)
	rd := NewReader(br, DefaultLimits())
	buf := make([]byte, 10000)
	allocs := testing.AllocsPerRun(100, func() {
		br.Reset(src)
		if _, _, err := rd.ReadMessage(buf); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("ReadMessage allocated %.1f times per message", allocs)
	}
}

func TestHelloRoundTrip(t *testing.T) {
	want := Hello{From: "127.0.0.1:7947", Channel: 2, Stripe: 1, Stripes: 4}
	got, err := ReadHello(bytes.NewReader(AppendHello(nil, want)))
	if err != nil || got != want {
		t.Fatalf("ReadHello = %+v, %v; want %+v", got, err, want)
	}
}

func TestReadHelloRejects(t *testing.T) {
	valid := AppendHello(nil, Hello{From: "w0", Stripes: 1})
	mutate := func(i int, v byte) []byte {
		b := bytes.Clone(valid)
		b[i] = v
		return b
	}
	tests := map[string][]byte{
		"bad magic":        mutate(0, 'X'),
		"bad version":      mutate(3, Version+1),
		"zero stripes":     mutate(6, 0),
		"stripe past end":  mutate(5, 1),
		"empty id":         mutate(7, 0),
		"id longer than b": mutate(7, 200),
		"truncated":        valid[:5],
	}
	for name, b := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := ReadHello(bytes.NewReader(b)); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

func BenchmarkWriteReadMessage(b *testing.B) {
	for _, size := range []int{4 << 10, 1 << 20} {
		b.Run(sizeName(size), func(b *testing.B) {
			payload := pattern(size, 1)
			var stream bytes.Buffer
			w := NewWriter(&stream, DefaultMaxFrame)
			rd := NewReader(&stream, DefaultLimits())
			buf := make([]byte, size)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				w.WriteMessage(Header{Kind: KindData}, payload)
				if _, _, err := rd.ReadMessage(buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

func TestHeaderValidate(t *testing.T) {
	if err := (Header{Kind: KindData, DType: DTypeFP16, Op: OpAvg}).Validate(); err != nil {
		t.Fatalf("valid header refused: %v", err)
	}
	for _, h := range []Header{{}, {Kind: kindEnd}, {Kind: KindData, DType: dtypeEnd}, {Kind: KindData, Op: opEnd}} {
		if err := h.Validate(); !errors.Is(err, ErrMalformed) {
			t.Errorf("Validate(%+v) = %v, want ErrMalformed", h, err)
		}
	}
}
