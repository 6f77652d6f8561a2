package ring

import "math/bits"

// RecursiveDoubling returns rank's plan for a recursive-doubling allreduce of
// length elements over n ranks: the latency-optimized algorithm for small
// buffers. Every message carries the whole buffer, so ChunkElems is length.
//
// Let p be the largest power of two not above n and e = n-p. If e > 0, step
// 0 folds the extra ranks in: each even rank r < 2e sends its buffer to r+1,
// which reduces it, and sits out. The p remaining ranks, renumbered 0 to p-1
// (odd r < 2e becomes r/2, r >= 2e becomes r-e), then run log2(p) exchange
// steps: at step k (1-based), each exchanges its buffer with the rank whose
// new number differs in bit k-1, and reduces what it receives. Last, if e >
// 0, step log2(p)+1 sends the result from each odd r < 2e back to r-1.
//
// So a rank takes ⌊log2 n⌋ steps, two more when n is not a power of two.
// Each send waits for the previous step's receive, and each reducing receive
// waits for the same step's send, since both touch the whole buffer. Partners
// reduce the same two operands in either order, so for a commutative
// operator (IEEE addition is) every rank ends bit-identical.
func RecursiveDoubling(n, rank, length int) (Plan, error) {
	if err := checkArgs(n, rank, length); err != nil {
		return Plan{}, err
	}
	p := Plan{Algo: AlgoRecursiveDoubling, N: n, Rank: rank, Length: length, ChunkElems: length}
	if n == 1 {
		return orderOverwrites(p), nil
	}
	logp := bits.Len(uint(n)) - 1
	extra := n - 1<<logp
	all := Span{Len: length}
	if rank < 2*extra && rank%2 == 0 {
		// Folded: hand the buffer to rank+1, then take the result back.
		xs := make([]Xfer, 2)
		p.Sends = xs[0:1:1]
		p.Recvs = xs[1:2:2]
		p.Sends[0] = Xfer{Peer: rank + 1, Span: all, Step: 0, After: -1}
		p.Recvs[0] = Xfer{Peer: rank + 1, Span: all, Step: logp + 1, After: -1}
		return orderOverwrites(p), nil
	}
	ns, nr := logp, logp
	if rank < 2*extra {
		ns, nr = logp+1, logp+1
	}
	xs := make([]Xfer, ns+nr)
	p.Sends, p.Recvs = xs[:0:ns], xs[ns:ns]
	v := rank - extra // the rank's number among the p
	if rank < 2*extra {
		v = rank / 2
		p.Recvs = append(p.Recvs, Xfer{Peer: rank - 1, Span: all, Step: 0, Reduce: true, After: -1})
	}
	for k := 1; k <= logp; k++ {
		w := v ^ 1<<(k-1)
		peer := w + extra
		if w < extra {
			peer = 2*w + 1
		}
		p.Sends = append(p.Sends, Xfer{Peer: peer, Span: all, Step: k, After: len(p.Recvs) - 1})
		p.Recvs = append(p.Recvs, Xfer{Peer: peer, Span: all, Step: k, Reduce: true, Final: k == logp,
			After: len(p.Sends) - 1})
	}
	if rank < 2*extra {
		p.Sends = append(p.Sends, Xfer{Peer: rank - 1, Span: all, Step: logp + 1, After: len(p.Recvs) - 1})
	}
	return orderOverwrites(p), nil
}

// Barrier returns rank's plan for a dissemination barrier over n ranks: in
// round k, for k from 0 to ⌈log2 n⌉-1, rank r sends an empty message to
// (r+2^k) mod n and receives one from (r-2^k) mod n, and each send waits for
// the previous round's receive. After round k a rank has heard, directly or
// through others, from the 2^(k+1)-1 ranks before it, so after the last round
// it has heard from all: no rank finishes the barrier before every rank has
// started it. That takes ⌈log2 n⌉ message latencies, against 2(n-1) for a
// zero-length ring allreduce and ⌊log2 n⌋+2 for recursive doubling when n is
// not a power of two. Messages carry no data: every Span is empty.
func Barrier(n, rank int) (Plan, error) {
	if err := checkArgs(n, rank, 0); err != nil {
		return Plan{}, err
	}
	p := Plan{Algo: AlgoBarrier, N: n, Rank: rank}
	rounds := bits.Len(uint(n - 1)) // ⌈log2 n⌉
	if rounds == 0 {
		return orderOverwrites(p), nil
	}
	xs := make([]Xfer, 2*rounds)
	p.Sends, p.Recvs = xs[:rounds], xs[rounds:]
	for k := range rounds {
		d := 1 << k
		p.Sends[k] = Xfer{Peer: mod(rank+d, n), Step: k, After: k - 1}
		p.Recvs[k] = Xfer{Peer: mod(rank-d, n), Step: k, After: -1}
	}
	return orderOverwrites(p), nil
}
