// Package checkpoint writes and reads Gyre's checkpoint files: a job's
// committed state on disk, so that the job can start again from it, on
// any number of workers (docs/checkpoints.md). It knows files and
// directories, not workers: the runtime decides when to take one, who
// writes it and which one a job resumes from.
package checkpoint

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc64"
	"io"
	"time"
	"unsafe"
)

// Version is the file format this package writes. A reader refuses a
// newer one by name.
const Version = 1

// magic opens every checkpoint file.
var magic = [8]byte{'G', 'Y', 'R', 'E', 'C', 'K', 'P', 0}

const (
	prefixLen  = len(magic) + 4 + 4 // magic, version, header length
	trailerLen = 8                  // the CRC-64
	// maxHeader bounds the JSON header a reader accepts: a damaged length
	// must not make it allocate gigabytes.
	maxHeader = 64 << 20
)

var crcTable = crc64.MakeTable(crc64.ECMA)

// ErrCorrupt is matched by every error about a file that is not a whole,
// valid checkpoint: truncated, damaged, or not a checkpoint at all.
var ErrCorrupt = errors.New("checkpoint: corrupt")

// Kind is an entry's type.
type Kind uint8

// Entry kinds.
const (
	Float32 Kind = iota + 1
	Float64
	Bytes // a metadata entry's binary encoding
)

// Entry describes one registered value: its name, kind and length (in
// elements; in bytes for Bytes).
type Entry struct {
	Name string `json:"name"`
	Kind Kind   `json:"kind"`
	Len  int    `json:"len"`
}

// Setting is one batch setting the job's workers share, as name and value.
type Setting struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Header is what a checkpoint says of itself.
type Header struct {
	// Epoch is the epoch of the view that committed the state, and Iter
	// the committed iteration (the next to run).
	Epoch uint64 `json:"epoch"`
	Iter  int64  `json:"iter"`
	// Workers is the size of that view.
	Workers int `json:"workers"`
	// Settings are the job's batch settings, and Entries the registered
	// values in order.
	Settings []Setting `json:"settings"`
	Entries  []Entry   `json:"entries"`
	// Balance is the runtime's balance state, opaque here.
	Balance json.RawMessage `json:"balance,omitempty"`
	// Written is when the state was committed.
	Written time.Time `json:"written"`
}

// Newer reports whether h is newer than o: a higher (epoch, iteration).
func (h Header) Newer(o Header) bool {
	return h.Epoch > o.Epoch || h.Epoch == o.Epoch && h.Iter > o.Iter
}

// Value holds one entry's values: F32, F64 or Bytes, as its Kind says.
type Value struct {
	F32   []float32
	F64   []float64
	Bytes []byte
}

// Snapshot is a checkpoint in memory: its header and, in the header's
// entry order, its values. Sum is its file's checksum, which Decode and
// Encode set: two files of one (epoch, iteration) with different sums
// hold different states.
type Snapshot struct {
	Header
	Values []Value
	Sum    uint64
}

// check reports whether the values match the entries.
func (s *Snapshot) check() error {
	if len(s.Values) != len(s.Entries) {
		return fmt.Errorf("checkpoint: %d values for %d entries", len(s.Values), len(s.Entries))
	}
	for i, e := range s.Entries {
		v := s.Values[i]
		var n int
		switch e.Kind {
		case Float32:
			n = len(v.F32)
		case Float64:
			n = len(v.F64)
		case Bytes:
			n = len(v.Bytes)
		default:
			return fmt.Errorf("checkpoint: entry %q has unknown kind %d", e.Name, e.Kind)
		}
		if n != e.Len {
			return fmt.Errorf("checkpoint: entry %q holds %d values, its header says %d", e.Name, n, e.Len)
		}
	}
	return nil
}

// Encode writes s to w in the checkpoint format, and sets s.Sum.
func Encode(w io.Writer, s *Snapshot) error {
	if err := s.check(); err != nil {
		return err
	}
	head, err := json.Marshal(s.Header)
	if err != nil {
		return fmt.Errorf("checkpoint: encode the header: %w", err)
	}
	crc := crc64.New(crcTable)
	bw := bufio.NewWriterSize(io.MultiWriter(w, crc), 1<<20)
	var prefix [prefixLen]byte
	copy(prefix[:], magic[:])
	binary.LittleEndian.PutUint32(prefix[8:], Version)
	binary.LittleEndian.PutUint32(prefix[12:], uint32(len(head)))
	bw.Write(prefix[:])
	bw.Write(head)
	for _, v := range s.Values {
		if err := writeValue(bw, v); err != nil {
			return err
		}
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	s.Sum = crc.Sum64()
	var sum [trailerLen]byte
	binary.LittleEndian.PutUint64(sum[:], s.Sum)
	_, err = w.Write(sum[:])
	return err
}

// writeValue writes v's elements in little-endian order.
func writeValue(w *bufio.Writer, v Value) error {
	var err error
	switch {
	case v.F32 != nil:
		err = writeWords(w, asBytes(v.F32), 4)
	case v.F64 != nil:
		err = writeWords(w, asBytes(v.F64), 8)
	default:
		_, err = w.Write(v.Bytes)
	}
	return err
}

// writeWords writes raw, the memory of a slice of words of size bytes
// each, as little-endian words: as it is on a little-endian machine, each
// word reversed on a big-endian one.
func writeWords(w *bufio.Writer, raw []byte, size int) error {
	if littleEndian {
		_, err := w.Write(raw)
		return err
	}
	var b [8]byte
	for i := 0; i < len(raw); i += size {
		copy(b[:size], raw[i:i+size])
		reverse(b[:size])
		if _, err := w.Write(b[:size]); err != nil {
			return err
		}
	}
	return nil
}

// reverse reverses a word's bytes.
func reverse(b []byte) {
	for i, j := 0, len(b)-1; i < j; i, j = i+1, j-1 {
		b[i], b[j] = b[j], b[i]
	}
}

// Decode reads a whole checkpoint of size bytes from r and checks it:
// the magic, the version, the lengths against size, and the checksum,
// before any value is trusted. name is used in errors.
func Decode(r io.Reader, size int64, name string) (*Snapshot, error) {
	return decode(r, size, name, true)
}

// Check is Decode without keeping the values: it returns the header and
// checksum of a valid checkpoint, reading it through once.
func Check(r io.Reader, size int64, name string) (*Snapshot, error) {
	return decode(r, size, name, false)
}

func decode(r io.Reader, size int64, name string, keep bool) (*Snapshot, error) {
	corrupt := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrCorrupt, name, fmt.Sprintf(format, args...))
	}
	crc := crc64.New(crcTable)
	// A buffer no larger than the file: reading a small one should not
	// allocate and clear a whole MiB.
	tr := io.TeeReader(bufio.NewReaderSize(r, int(min(max(size, 16), 1<<20))), crc)
	if size < int64(prefixLen+trailerLen) {
		return nil, corrupt("%d bytes, too short for a checkpoint", size)
	}
	var prefix [prefixLen]byte
	if _, err := io.ReadFull(tr, prefix[:]); err != nil {
		return nil, corrupt("reading its prefix: %v", err)
	}
	if [8]byte(prefix[:8]) != magic {
		return nil, corrupt("not a checkpoint (magic %q)", prefix[:8])
	}
	if v := binary.LittleEndian.Uint32(prefix[8:]); v != Version {
		return nil, fmt.Errorf("checkpoint: %s: format version %d; this build reads version %d", name, v, Version)
	}
	hlen := int64(binary.LittleEndian.Uint32(prefix[12:]))
	if hlen > maxHeader || int64(prefixLen)+hlen+trailerLen > size {
		return nil, corrupt("header of %d bytes in a file of %d", hlen, size)
	}
	head := make([]byte, hlen)
	if _, err := io.ReadFull(tr, head); err != nil {
		return nil, corrupt("reading its header: %v", err)
	}
	s := &Snapshot{}
	if err := json.Unmarshal(head, &s.Header); err != nil {
		return nil, corrupt("header: %v", err)
	}
	want := int64(prefixLen) + hlen + trailerLen
	for _, e := range s.Entries {
		n, ok := e.bytes()
		if !ok {
			return nil, corrupt("entry %q: kind %d, length %d", e.Name, e.Kind, e.Len)
		}
		want += n
		if want > size {
			return nil, corrupt("its entries need more than its %d bytes", size)
		}
	}
	if want != size {
		return nil, corrupt("%d bytes, its header accounts for %d", size, want)
	}
	if keep {
		s.Values = make([]Value, len(s.Entries))
	}
	for i, e := range s.Entries {
		var err error
		if keep {
			err = readValue(tr, e, &s.Values[i])
		} else {
			n, _ := e.bytes()
			_, err = io.CopyN(io.Discard, tr, n)
		}
		if err != nil {
			return nil, corrupt("entry %q: %v", e.Name, err)
		}
	}
	sum := crc.Sum64()
	var trailer [trailerLen]byte
	if _, err := io.ReadFull(tr, trailer[:]); err != nil {
		return nil, corrupt("reading its checksum: %v", err)
	}
	if got := binary.LittleEndian.Uint64(trailer[:]); got != sum {
		return nil, corrupt("checksum %016x, its content sums to %016x", got, sum)
	}
	s.Sum = sum
	return s, nil
}

// maxLen bounds an entry's length, so that its size in bytes cannot
// overflow.
const maxLen = 1 << 50

// bytes returns the size of e's values in the file.
func (e Entry) bytes() (int64, bool) {
	if e.Len < 0 || e.Len > maxLen {
		return 0, false
	}
	switch e.Kind {
	case Float32:
		return 4 * int64(e.Len), true
	case Float64:
		return 8 * int64(e.Len), true
	case Bytes:
		return int64(e.Len), true
	}
	return 0, false
}

// readValue reads e's values from r into v.
func readValue(r io.Reader, e Entry, v *Value) error {
	switch e.Kind {
	case Float32:
		v.F32 = make([]float32, e.Len)
		return readWords(r, asBytes(v.F32), 4)
	case Float64:
		v.F64 = make([]float64, e.Len)
		return readWords(r, asBytes(v.F64), 8)
	default:
		v.Bytes = make([]byte, e.Len)
		_, err := io.ReadFull(r, v.Bytes)
		return err
	}
}

// readWords fills raw, the memory of a slice of words of size each, from
// little-endian bytes.
func readWords(r io.Reader, raw []byte, size int) error {
	if _, err := io.ReadFull(r, raw); err != nil {
		return err
	}
	if !littleEndian {
		for i := 0; i < len(raw); i += size {
			reverse(raw[i : i+size])
		}
	}
	return nil
}

// asBytes views a slice of floats as its bytes, without copying.
func asBytes[T float32 | float64](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(s[0])))
}

// littleEndian says whether this machine stores words little-endian, as
// the file does.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1
