// Package sampler maps iterations to sample indices: an endless stream of
// seeded per-epoch permutations, split by the workers' shares. It is
// pure: no I/O, no clock.
package sampler

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
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
	seed uint64
	size int64
	// cached permutations, by epoch; at most two are kept, since one batch
	// spans at most two epochs unless it is larger than the dataset.
	perms [2]perm
}

type perm struct {
	epoch int64
	idx   []int64
}

// New returns the sampler of a dataset of size samples (0: an
// unbounded stream) shuffled with seed.
func New(seed uint64, size int64) (*Sampler, error) {
	if size < 0 {
		return nil, fmt.Errorf("dataset size %d < 0", size)
	}
	s := &Sampler{seed: seed, size: size}
	for i := range s.perms {
		s.perms[i].epoch = -1
	}
	return s, nil
}

// Positions returns the stream positions worker rank takes in iteration
// iter, as the half-open range [start, start+count): the global batch of
// iteration iter is [iter·B, (iter+1)·B) with B the sum of shares.
func Positions(iter int64, shares []int, rank int) (start, count int64) {
	var global, before int64
	for r, s := range shares {
		if r < rank {
			before += int64(s)
		}
		global += int64(s)
	}
	return iter*global + before, int64(shares[rank])
}

// Indices appends to dst the sample indices at stream positions
// [start, start+count) and returns the extended slice.
func (s *Sampler) Indices(dst []int64, start, count int64) []int64 {
	if s.size == 0 {
		for p := start; p < start+count; p++ {
			dst = append(dst, p)
		}
		return dst
	}
	for p := start; p < start+count; {
		epoch, off := p/s.size, p%s.size
		idx := s.perm(epoch)
		n := min(s.size-off, start+count-p)
		dst = append(dst, idx[off:off+n]...)
		p += n
	}
	return dst
}

// perm returns epoch's permutation, building it if it is not cached.
func (s *Sampler) perm(epoch int64) []int64 {
	for i := range s.perms {
		if s.perms[i].epoch == epoch {
			return s.perms[i].idx
		}
	}
	// Replace the older epoch: batches move forward through the stream,
	// and a redone iteration goes back at most into the epoch before.
	old := 0
	if s.perms[1].epoch < s.perms[0].epoch {
		old = 1
	}
	p := &s.perms[old]
	if int64(cap(p.idx)) < s.size {
		p.idx = make([]int64, s.size)
	}
	p.idx = p.idx[:s.size]
	shuffle(p.idx, s.seed, uint64(epoch))
	p.epoch = epoch
	return p.idx
}

// shuffle fills idx with a uniformly random permutation of [0, len(idx))
// drawn from PCG(seed, epoch), by Fisher–Yates. Written out rather than
// taken from rand.Perm so the order depends only on PCG's output, which is
// specified, and not on how the library draws from it.
func shuffle(idx []int64, seed, epoch uint64) {
	for i := range idx {
		idx[i] = int64(i)
	}
	rng := rand.NewPCG(seed, epoch)
	for i := len(idx) - 1; i > 0; i-- {
		j := int(uniform(rng, uint64(i)+1))
		idx[i], idx[j] = idx[j], idx[i]
	}
}

// uniform returns a uniform value in [0, n) by rejection: Lemire's
// multiply-shift, with the threshold that removes its bias.
func uniform(rng *rand.PCG, n uint64) uint64 {
	for {
		hi, lo := bits.Mul64(rng.Uint64(), n)
		if lo >= n || lo >= -n%n {
			return hi
		}
	}
}

// EqualShares splits global samples over n workers as evenly as possible,
// the remainder going to the lowest ranks.
func EqualShares(global, n int) []int {
	shares := make([]int, n)
	for r := range shares {
		shares[r] = global / n
		if r < global%n {
			shares[r]++
		}
	}
	return shares
}
