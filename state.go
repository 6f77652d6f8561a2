package gyre

import (
	"encoding"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc64"
	"hash/fnv"

	"github.com/gyre-ml/gyre/kernels"
)

// Metadata is user state that is not a tensor (an epoch counter, a
// learning-rate schedule's position, the optimizer's step count). It is
// committed and restored with the tensors, and broadcast from rank 0 at
// Join, through its binary encoding.
type Metadata interface {
	encoding.BinaryMarshaler
	encoding.BinaryUnmarshaler
}

// State is the set of named values a trainer registers with its Worker:
// float32 and float64 tensors (parameters, optimizer buffers) and metadata.
// The Worker reads and writes the registered slices in place, so the
// trainer keeps using its own memory. Every worker must register the same
// names, kinds and lengths in the same order; Join checks that.
//
// Commit copies the current values aside, with the sampler position;
// Restore copies them back. So an iteration abandoned midway (an error, a
// lost peer) is undone exactly, as Horovod's elastic state is.
type State struct {
	entries []stateEntry
	names   map[string]bool
	err     error // the first registration error, reported by Join

	committed bool
	iter      int64 // the committed iteration: the next to run
}

type stateEntry struct {
	name string
	kind int // kindF32, kindF64 or kindMeta
	f32  []float32
	f64  []float64
	meta Metadata
	// The committed copy.
	c32   []float32
	c64   []float64
	cmeta []byte
}

// NewState returns an empty State.
func NewState() *State { return &State{names: make(map[string]bool)} }

// Float32 registers the float32 tensor t under name and returns s.
func (s *State) Float32(name string, t []float32) *State {
	if s.add(name) {
		s.entries = append(s.entries, stateEntry{name: name, kind: kindF32, f32: t})
	}
	return s
}

// Float64 registers the float64 tensor t under name and returns s.
func (s *State) Float64(name string, t []float64) *State {
	if s.add(name) {
		s.entries = append(s.entries, stateEntry{name: name, kind: kindF64, f64: t})
	}
	return s
}

// Meta registers the metadata m under name and returns s.
func (s *State) Meta(name string, m Metadata) *State {
	if m == nil {
		s.fail(fmt.Errorf("%w: state %q: nil metadata", ErrConfig, name))
		return s
	}
	if s.add(name) {
		s.entries = append(s.entries, stateEntry{name: name, kind: kindMeta, meta: m})
	}
	return s
}

func (s *State) add(name string) bool {
	switch {
	case name == "":
		s.fail(fmt.Errorf("%w: state entry with an empty name", ErrConfig))
		return false
	case s.names[name]:
		s.fail(fmt.Errorf("%w: state %q registered twice", ErrConfig, name))
		return false
	}
	s.names[name] = true
	return true
}

func (s *State) fail(err error) {
	if s.err == nil {
		s.err = err
	}
}

// Err returns the first registration error, if any.
func (s *State) Err() error { return s.err }

// commit copies every value aside, with iter, the next iteration to run.
// It is all or nothing: the metadata, the only part that can fail to
// copy, is encoded before anything is replaced, so a failed commit leaves
// the previous one whole for Restore.
func (s *State) commit(iter int64) error {
	var metas [][]byte
	for i, e := range s.entries {
		if e.kind != kindMeta {
			continue
		}
		b, err := e.meta.MarshalBinary()
		if err != nil {
			return fmt.Errorf("gyre: commit %q: %w", e.name, err)
		}
		if metas == nil {
			metas = make([][]byte, len(s.entries))
		}
		metas[i] = b
	}
	for i := range s.entries {
		e := &s.entries[i]
		switch e.kind {
		case kindF32:
			e.c32 = append(e.c32[:0], e.f32...)
		case kindF64:
			e.c64 = append(e.c64[:0], e.f64...)
		case kindMeta:
			e.cmeta = append(e.cmeta[:0], metas[i]...)
		}
	}
	s.iter, s.committed = iter, true
	return nil
}

// restore copies the committed values back and returns the committed
// iteration.
func (s *State) restore() (int64, error) {
	if !s.committed {
		return 0, errors.New("gyre: restore: nothing committed")
	}
	for i := range s.entries {
		e := &s.entries[i]
		switch e.kind {
		case kindF32:
			copy(e.f32, e.c32)
		case kindF64:
			copy(e.f64, e.c64)
		case kindMeta:
			if err := e.meta.UnmarshalBinary(e.cmeta); err != nil {
				return 0, fmt.Errorf("gyre: restore %q: %w", e.name, err)
			}
		}
	}
	return s.iter, nil
}

// Entry kinds, in the layout digest.
const (
	kindF32 = iota + 1
	kindF64
	kindMeta
)

// layout returns a digest of the names, kinds and lengths of the entries,
// in order: workers whose digests differ registered different state.
func (s *State) layout() uint64 {
	h := fnv.New64a()
	var b [9]byte
	for _, e := range s.entries {
		h.Write([]byte(e.name))
		kind, n := byte(kindMeta), 0
		switch e.kind {
		case kindF32:
			kind, n = kindF32, len(e.f32)
		case kindF64:
			kind, n = kindF64, len(e.f64)
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
func (s *State) Digest() (uint64, error) {
	h := crc64.New(crcTable)
	for _, e := range s.entries {
		h.Write([]byte(e.name))
		switch e.kind {
		case kindF32:
			h.Write(kernels.Bytes(e.f32))
		case kindF64:
			h.Write(kernels.Bytes(e.f64))
		case kindMeta:
			m, err := e.meta.MarshalBinary()
			if err != nil {
				return 0, fmt.Errorf("gyre: digest %q: %w", e.name, err)
			}
			h.Write(m)
		}
	}
	return h.Sum64(), nil
}

var crcTable = crc64.MakeTable(crc64.ECMA)

// marshalMeta encodes every metadata entry, each as its length and bytes.
func (s *State) marshalMeta() ([]byte, error) {
	var blob []byte
	for _, e := range s.entries {
		if e.kind != kindMeta {
			continue
		}
		b, err := e.meta.MarshalBinary()
		if err != nil {
			return nil, fmt.Errorf("gyre: encode %q: %w", e.name, err)
		}
		blob = binary.AppendUvarint(blob, uint64(len(b)))
		blob = append(blob, b...)
	}
	return blob, nil
}

// unmarshalMeta decodes what marshalMeta encoded into the metadata
// entries.
func (s *State) unmarshalMeta(blob []byte) error {
	for _, e := range s.entries {
		if e.kind != kindMeta {
			continue
		}
		n, k := binary.Uvarint(blob)
		if k <= 0 || uint64(len(blob)-k) < n {
			return fmt.Errorf("gyre: decode %q: %w", e.name, errShortMeta)
		}
		if err := e.meta.UnmarshalBinary(blob[k : k+int(n)]); err != nil {
			return fmt.Errorf("gyre: decode %q: %w", e.name, err)
		}
		blob = blob[k+int(n):]
	}
	return nil
}

var errShortMeta = errors.New("metadata from rank 0 is truncated")
