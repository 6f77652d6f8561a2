package gyre

import (
	"fmt"

	"github.com/gyre-ml/gyre/internal/sampler"
)

// Sampler maps iterations to sample indices. The data is an endless stream
// of per-epoch permutations of [0, DatasetSize), each seeded by (seed,
// epoch); iteration k's global batch is positions [k·B, (k+1)·B) of that
// stream, and worker r takes the slice of it that starts at the sum of the
// shares of ranks before r. So every sample of an epoch is visited once
// before any is visited again, whatever the shares, and an iteration that is
// redone with other shares covers exactly the same samples.
//
// A Sampler with DatasetSize 0 has no permutation: a position is its own
// sample index, for generated data that never repeats.
//
// The current epoch's permutation is kept, 8 bytes per sample; the one
// after it is built when a batch crosses into it. Sampler is not safe for
// concurrent use.
type Sampler struct {
	s *sampler.Sampler
}

// NewSampler returns the sampler of a dataset of size samples (0: an
// unbounded stream) shuffled with seed.
func NewSampler(seed uint64, size int64) (*Sampler, error) {
	s, err := sampler.New(seed, size)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	return &Sampler{s}, nil
}

// Positions returns the stream positions worker rank takes in iteration
// iter, as the half-open range [start, start+count): the global batch of
// iteration iter is [iter·B, (iter+1)·B) with B the sum of shares.
func Positions(iter int64, shares []int, rank int) (start, count int64) {
	return sampler.Positions(iter, shares, rank)
}

// Indices appends to dst the sample indices at stream positions
// [start, start+count) and returns the extended slice.
func (s *Sampler) Indices(dst []int64, start, count int64) []int64 {
	return s.s.Indices(dst, start, count)
}

// EqualShares splits global samples over n workers as evenly as possible,
// the remainder going to the lowest ranks.
func EqualShares(global, n int) []int { return sampler.EqualShares(global, n) }
