package sampler

import (
	"slices"
	"testing"
)

// batches returns what every rank takes in iterations [from, to).
func batches(s *Sampler, shares []int, from, to int64) [][]int64 {
	var out [][]int64
	for k := from; k < to; k++ {
		for r := range shares {
			start, count := Positions(k, shares, r)
			out = append(out, s.Indices(nil, start, count))
		}
	}
	return out
}

func TestSamplerVisitsEachSampleOncePerEpoch(t *testing.T) {
	const size = 1000
	shares := []int{37, 0, 20, 7} // B = 64: epochs end mid-batch
	s, err := New(42, size)
	if err != nil {
		t.Fatal(err)
	}
	var stream []int64
	for _, b := range batches(s, shares, 0, 47) { // 3008 positions: 3 epochs and a bit
		stream = append(stream, b...)
	}
	if len(stream) != 47*64 {
		t.Fatalf("%d samples, want %d", len(stream), 47*64)
	}
	for e := range 3 {
		epoch := slices.Clone(stream[e*size : (e+1)*size])
		slices.Sort(epoch)
		for i, v := range epoch {
			if v != int64(i) {
				t.Fatalf("epoch %d is not a permutation of [0, %d): sorted[%d] = %d", e, size, i, v)
			}
		}
	}
	if slices.Equal(stream[:size], stream[size:2*size]) {
		t.Fatal("epochs 0 and 1 have the same order")
	}
	if slices.Equal(stream[:100], seq(0, 100)) {
		t.Fatal("epoch 0 is not shuffled")
	}
}

func seq(from, to int64) []int64 {
	var s []int64
	for i := from; i < to; i++ {
		s = append(s, i)
	}
	return s
}

// TestSamplerSharesDoNotChangeTheBatch checks that changing the shares,
// or redoing an iteration with a fresh sampler, covers the same samples.
func TestSamplerSharesDoNotChangeTheBatch(t *testing.T) {
	a, _ := New(7, 500)
	b, _ := New(7, 500)
	for k := int64(0); k < 20; k++ {
		var x, y []int64
		for _, part := range batches(a, []int{10, 22}, k, k+1) {
			x = append(x, part...)
		}
		for _, part := range batches(b, []int{1, 0, 30, 1}, k, k+1) {
			y = append(y, part...)
		}
		if !slices.Equal(x, y) {
			t.Fatalf("iteration %d: the global batch depends on the shares", k)
		}
	}
	// Going back (a redone iteration) gives the same indices again.
	c, _ := New(7, 500)
	late := batches(a, []int{10, 22}, 3, 4)
	if !slices.Equal(slices.Concat(late...), slices.Concat(batches(c, []int{10, 22}, 3, 4)...)) {
		t.Fatal("iteration 3 differs between samplers with the same seed")
	}
	d, _ := New(8, 500)
	if slices.Equal(slices.Concat(late...), slices.Concat(batches(d, []int{10, 22}, 3, 4)...)) {
		t.Fatal("another seed gave the same batch")
	}
}

func TestSamplerUnbounded(t *testing.T) {
	s, _ := New(1, 0)
	start, count := Positions(3, []int{4, 6}, 1)
	if got := s.Indices(nil, start, count); !slices.Equal(got, seq(34, 40)) {
		t.Fatalf("unbounded stream: %v", got)
	}
	if _, err := New(1, -1); err == nil {
		t.Fatal("negative size accepted")
	}
}

func TestSamplerBatchLargerThanDataset(t *testing.T) {
	s, _ := New(3, 10)
	got := s.Indices(nil, 5, 27) // spans four epochs
	if len(got) != 27 {
		t.Fatalf("%d indices", len(got))
	}
	for _, v := range got {
		if v < 0 || v >= 10 {
			t.Fatalf("index %d out of range", v)
		}
	}
}

func TestEqualShares(t *testing.T) {
	if got := EqualShares(10, 4); !slices.Equal(got, []int{3, 3, 2, 2}) {
		t.Fatalf("EqualShares(10, 4) = %v", got)
	}
	if got := EqualShares(2, 3); !slices.Equal(got, []int{1, 1, 0}) {
		t.Fatalf("EqualShares(2, 3) = %v", got)
	}
}
