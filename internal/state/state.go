// Package state holds the values a trainer registers with its worker
// (gyre.State): commit, restore, layout and digest. It is pure: no I/O,
// no goroutines, no clock.
package state

import (
	"encoding"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc64"
	"hash/fnv"
	"unsafe"
)

// Metadata is what gyre.Metadata is: user state that is not a tensor,
// committed, restored and broadcast through its binary encoding.
type Metadata interface {
	encoding.BinaryMarshaler
	encoding.BinaryUnmarshaler
}

// Set is the set of named values a trainer registers (gyre.State): float32
// and float64 tensors and metadata, read and written in place, with a
// committed copy of each. It is pure: no I/O, no goroutines, no clock.
type Set struct {
	entries []Entry
	names   map[string]bool
	err     error // the first registration error, reported by Join

	committed bool
	iter      int64 // the committed iteration: the next to run
}

// Entry is one registered value: the trainer's own slice or metadata, and
// the committed copy.
type Entry struct {
	Name string
	Kind Kind
	F32  []float32
	F64  []float64
	Meta Metadata
	// The committed copy: C32, C64 or CMeta (the encoded metadata).
	C32   []float32
	C64   []float64
	CMeta []byte
}

// Kind is what an entry holds.
type Kind int

// Entry kinds, in the layout digest.
const (
	F32 Kind = iota + 1
	F64
	Meta
)

// New returns an empty Set.
func New() *Set { return &Set{names: make(map[string]bool)} }

// Float32 registers the float32 tensor t under name and returns s.
func (s *Set) Float32(name string, t []float32) *Set {
	if s.add(name) {
		s.entries = append(s.entries, Entry{Name: name, Kind: F32, F32: t})
	}
	return s
}

// Float64 registers the float64 tensor t under name and returns s.
func (s *Set) Float64(name string, t []float64) *Set {
	if s.add(name) {
		s.entries = append(s.entries, Entry{Name: name, Kind: F64, F64: t})
	}
	return s
}

// Meta registers the metadata m under name and returns s.
func (s *Set) Meta(name string, m Metadata) *Set {
	if m == nil {
		s.fail(fmt.Errorf("state %q: nil metadata", name))
		return s
	}
	if s.add(name) {
		s.entries = append(s.entries, Entry{Name: name, Kind: Meta, Meta: m})
	}
	return s
}

func (s *Set) add(name string) bool {
	switch {
	case name == "":
		s.fail(errors.New("state entry with an empty name"))
		return false
	case s.names[name]:
		s.fail(fmt.Errorf("state %q registered twice", name))
		return false
	}
	s.names[name] = true
	return true
}

func (s *Set) fail(err error) {
	if s.err == nil {
		s.err = err
	}
}

// Err returns the first registration error, if any.
func (s *Set) Err() error { return s.err }

// Commit copies every value aside, with iter, the next iteration to run.
// It is all or nothing: the metadata, the only part that can fail to
// copy, is encoded before anything is replaced, so a failed commit leaves
// the previous one whole for Restore.
func (s *Set) Commit(iter int64) error {
	var metas [][]byte
	for i, e := range s.entries {
		if e.Kind != Meta {
			continue
		}
		b, err := e.Meta.MarshalBinary()
		if err != nil {
			return fmt.Errorf("gyre: commit %q: %w", e.Name, err)
		}
		if metas == nil {
			metas = make([][]byte, len(s.entries))
		}
		metas[i] = b
	}
	for i := range s.entries {
		e := &s.entries[i]
		switch e.Kind {
		case F32:
			e.C32 = append(e.C32[:0], e.F32...)
		case F64:
			e.C64 = append(e.C64[:0], e.F64...)
		case Meta:
			e.CMeta = append(e.CMeta[:0], metas[i]...)
		}
	}
	s.iter, s.committed = iter, true
	return nil
}

// Restore copies the committed values back and returns the committed
// iteration.
func (s *Set) Restore() (int64, error) {
	if !s.committed {
		return 0, errors.New("gyre: restore: nothing committed")
	}
	for i := range s.entries {
		e := &s.entries[i]
		switch e.Kind {
		case F32:
			copy(e.F32, e.C32)
		case F64:
			copy(e.F64, e.C64)
		case Meta:
			if err := e.Meta.UnmarshalBinary(e.CMeta); err != nil {
				return 0, fmt.Errorf("gyre: restore %q: %w", e.Name, err)
			}
		}
	}
	return s.iter, nil
}

// Layout returns a digest of the names, kinds and lengths of the entries,
// in order: workers whose digests differ registered different state.
func (s *Set) Layout() uint64 {
	h := fnv.New64a()
	var b [9]byte
	for _, e := range s.entries {
		h.Write([]byte(e.Name))
		kind, n := byte(Meta), 0
		switch e.Kind {
		case F32:
			kind, n = byte(F32), len(e.F32)
		case F64:
			kind, n = byte(F64), len(e.F64)
		}
		b[0] = kind
		binary.LittleEndian.PutUint64(b[1:], uint64(n))
		h.Write(b[:])
	}
	return h.Sum64()
}

// Digest returns a hash (CRC-64) of the current values of every registered
// tensor and metadata entry, to compare workers' states: equal states give
// equal digests. Tensors are hashed as their in-memory bytes, so workers
// must share a byte order, as they already must to exchange tensors.
func (s *Set) Digest() (uint64, error) {
	h := crc64.New(crcTable)
	for _, e := range s.entries {
		h.Write([]byte(e.Name))
		switch e.Kind {
		case F32:
			h.Write(bytesOf(e.F32))
		case F64:
			h.Write(bytesOf(e.F64))
		case Meta:
			m, err := e.Meta.MarshalBinary()
			if err != nil {
				return 0, fmt.Errorf("gyre: digest %q: %w", e.Name, err)
			}
			h.Write(m)
		}
	}
	return h.Sum64(), nil
}

var crcTable = crc64.MakeTable(crc64.ECMA)

// MarshalMeta encodes every metadata entry, each as its length and bytes.
func (s *Set) MarshalMeta() ([]byte, error) {
	var blob []byte
	for _, e := range s.entries {
		if e.Kind != Meta {
			continue
		}
		b, err := e.Meta.MarshalBinary()
		if err != nil {
			return nil, fmt.Errorf("gyre: encode %q: %w", e.Name, err)
		}
		blob = binary.AppendUvarint(blob, uint64(len(b)))
		blob = append(blob, b...)
	}
	return blob, nil
}

// UnmarshalMeta decodes what MarshalMeta encoded into the metadata
// entries.
func (s *Set) UnmarshalMeta(blob []byte) error {
	for _, e := range s.entries {
		if e.Kind != Meta {
			continue
		}
		n, k := binary.Uvarint(blob)
		if k <= 0 || uint64(len(blob)-k) < n {
			return fmt.Errorf("gyre: decode %q: %w", e.Name, errShortMeta)
		}
		if err := e.Meta.UnmarshalBinary(blob[k : k+int(n)]); err != nil {
			return fmt.Errorf("gyre: decode %q: %w", e.Name, err)
		}
		blob = blob[k+int(n):]
	}
	return nil
}

var errShortMeta = errors.New("metadata from rank 0 is truncated")

// Entries returns the registered entries, in registration order. The
// caller reads and writes their values in place, never the slice.
func (s *Set) Entries() []Entry { return s.entries }

// CommittedIter returns the iteration of the last Commit: the next to run.
func (s *Set) CommittedIter() int64 { return s.iter }

// bytesOf is s's memory as bytes, as the digest hashes it.
func bytesOf[T float32 | float64](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(s[0])))
}
