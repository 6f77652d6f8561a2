package state

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

func TestCommitRestore(t *testing.T) {
	a := []float32{1, 2, 3}
	b := []float64{4, 5}
	m := new(time.Time) // a Metadata from the standard library
	*m = time.Unix(1, 0)
	s := New().Float32("a", a).Float64("b", b).Meta("m", m)
	if _, err := s.Restore(); err == nil {
		t.Fatal("restore before any commit succeeded")
	}
	d0, _ := s.Digest()
	if err := s.Commit(7); err != nil {
		t.Fatal(err)
	}
	a[0], b[1], *m = 9, 9, time.Unix(9, 0)
	if d, _ := s.Digest(); d == d0 {
		t.Fatal("digest did not change with the state")
	}
	iter, err := s.Restore()
	if err != nil || iter != 7 {
		t.Fatalf("restore = %d, %v", iter, err)
	}
	if !slices.Equal(a, []float32{1, 2, 3}) || !slices.Equal(b, []float64{4, 5}) || !m.Equal(time.Unix(1, 0)) {
		t.Fatalf("restored %v %v %+v", a, b, *m)
	}
	if d, _ := s.Digest(); d != d0 {
		t.Fatal("digest differs after restore")
	}
}

// failingMeta is metadata whose encoding fails while fail is set.
type failingMeta struct {
	v    byte
	fail bool
}

func (m *failingMeta) MarshalBinary() ([]byte, error) {
	if m.fail {
		return nil, errors.New("cannot encode")
	}
	return []byte{m.v}, nil
}

func (m *failingMeta) UnmarshalBinary(b []byte) error { m.v = b[0]; return nil }

// TestCommitIsAllOrNothing: a commit whose metadata fails to encode
// changes nothing, so Restore still returns the previous commit whole,
// not tensors of one iteration with metadata of another.
func TestCommitIsAllOrNothing(t *testing.T) {
	a := []float64{1}
	first, second := &failingMeta{v: 1}, &failingMeta{v: 1}
	s := New().Meta("first", first).Float64("a", a).Meta("second", second)
	if err := s.Commit(3); err != nil {
		t.Fatal(err)
	}
	a[0], first.v, second.v, second.fail = 2, 2, 2, true
	if err := s.Commit(4); err == nil {
		t.Fatal("commit succeeded although the metadata failed to encode")
	}
	second.fail = false
	iter, err := s.Restore()
	if err != nil || iter != 3 || a[0] != 1 || first.v != 1 || second.v != 1 {
		t.Fatalf("restore after a failed commit = iteration %d (%v), a %v, metadata %d %d; want commit 3 whole: 1, 1, 1",
			iter, err, a, first.v, second.v)
	}
}

func TestStateRegistrationErrors(t *testing.T) {
	for name, s := range map[string]*Set{
		"empty name": New().Float32("", nil),
		"twice":      New().Float32("a", nil).Float64("a", nil),
		"nil meta":   New().Meta("m", nil),
	} {
		if s.Err() == nil {
			t.Errorf("%s: Err = nil, want an error", name)
		}
	}
	if New().Float32("a", nil).Layout() == New().Float64("a", nil).Layout() {
		t.Error("layout ignores the kind")
	}
}

// BenchmarkStateDigest measures State.Digest, which Boundary runs at the
// iterations where it checks the state: its cost per byte sets how often
// a model of a given size can be checked within 1% of an iteration.
func BenchmarkStateDigest(b *testing.B) {
	for _, mib := range []int{1, 64} {
		b.Run(fmt.Sprintf("%dMiB", mib), func(b *testing.B) {
			s := New().Float32("w", make([]float32, mib<<18))
			b.SetBytes(int64(mib) << 20)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.Digest(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
