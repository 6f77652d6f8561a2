package wire

// StripeMin is the smallest message split over stripes. It is part of the
// protocol: sender and receiver must compute the same split from the
// message length alone. Below it, waking several stripe goroutines costs
// more than their parallelism gains.
const StripeMin = 256 << 10

// StripesUsed returns how many of k stripes carry a message of n bytes:
// all of them from StripeMin up, otherwise only stripe 0.
func StripesUsed(n uint64, k int) int {
	if k <= 1 || n < StripeMin {
		return 1
	}
	return k
}

// StripePart returns the byte range [lo, hi) of a message of n bytes that
// stripe s of k carries. The split is contiguous and near-equal, with the
// remainder spread one byte each over the first stripes.
func StripePart(n uint64, k, s int) (lo, hi uint64) {
	used := StripesUsed(n, k)
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
