package gyre

import (
	"encoding"
	"fmt"

	"github.com/gyre-ml/gyre/internal/state"
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
	set *state.Set
}

// NewState returns an empty State.
func NewState() *State { return &State{set: state.New()} }

// Float32 registers the float32 tensor t under name and returns s.
func (s *State) Float32(name string, t []float32) *State {
	s.set.Float32(name, t)
	return s
}

// Float64 registers the float64 tensor t under name and returns s.
func (s *State) Float64(name string, t []float64) *State {
	s.set.Float64(name, t)
	return s
}

// Meta registers the metadata m under name and returns s.
func (s *State) Meta(name string, m Metadata) *State {
	s.set.Meta(name, m)
	return s
}

// Err returns the first registration error, if any.
func (s *State) Err() error {
	if err := s.set.Err(); err != nil {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}
	return nil
}

// Digest returns a hash (CRC-64) of the current values of every registered
// tensor and metadata entry, to compare workers' states: equal states give
// equal digests. Tensors are hashed as their in-memory bytes, so workers
// must share a byte order, as they already must to exchange tensors.
func (s *State) Digest() (uint64, error) { return s.set.Digest() }
