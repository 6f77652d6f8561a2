package streams

// stripesUsed returns how many of k stripes carry a message of n bytes:
// all of them from stripeMin up, otherwise only stripe 0.
func stripesUsed(n uint64, k int) int {
	if k <= 1 || n < stripeMin {
		return 1
	}
	return k
}

// part returns the byte range [lo, hi) of a message of n bytes that stripe
// s of k carries. The split is contiguous and near-equal, with the
// remainder spread one byte each over the first stripes; sender and
// receiver compute it alike, so no offsets need to be agreed beyond the
// ones every frame carries.
func part(n uint64, k, s int) (lo, hi uint64) {
	used := stripesUsed(n, k)
	if used == 1 {
		if s == 0 {
			return 0, n
		}
		return 0, 0
	}
	q, r := n/uint64(used), n%uint64(used)
	us := uint64(s)
	lo = us*q + min(us, r)
	hi = lo + q
	if us < r {
		hi++
	}
	return lo, hi
}
