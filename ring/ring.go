package ring

import "slices"

// The ring collectives share one schedule. The buffer is cut into N
// segments (Segments). At step t, rank r sends segment (r+shift-t) mod N to
// its right neighbour r+1 and receives segment (r+shift-t-1) mod N from its
// left neighbour r-1, which it reduces into place during the first
// reduceSteps steps and copies over its own afterwards. The segment received
// at step t is the one sent at step t+1, so each segment travels once around
// the ring, gathering every rank's contribution and then handing the result
// on.
//
// Each segment is cut into chunks of at most ChunkElems elements, and the
// send of (step t, chunk c) waits only for the receive of (step t-1, chunk
// c): a chunk is forwarded as soon as it has been reduced, so chunks of one
// segment stream through the ring one behind another instead of step by
// step.

// RingAllReduce returns rank's plan for a pipelined ring allreduce of length
// elements over n ranks, in chunks of at most chunkElems elements. Every
// rank ends with the reduction of all ranks' buffers.
//
// Steps 0 to n-2 are the reduce-scatter: at step s, rank r sends segment
// (r-s) mod n and reduces segment (r-s-1) mod n, so it ends owning the fully
// reduced segment (r+1) mod n. Steps n-1 to 2n-3 are the allgather, which
// passes the reduced segments on and overwrites. Each rank sends
// 2(n-1)/n·length elements, give or take the segments' rounding, which is
// the bandwidth lower bound for allreduce.
func RingAllReduce(n, rank, length, chunkElems int) (Plan, error) {
	return ringAllReduce(nil, n, rank, length, chunkElems)
}

func ringAllReduce(order []int, n, rank, length, chunkElems int) (Plan, error) {
	return ringPlan(AlgoRing, order, n, rank, length, chunkElems, 0, 2*(n-1), n-1)
}

// RingReduceScatter returns rank's plan for a pipelined ring reduce-scatter.
// Rank r ends with the reduction of all ranks' segment r, in place at
// Segments(length, n)[r] of its buffer; the rest of its buffer holds partial
// sums and is scratch. It runs n-1 steps: at step s, rank r sends segment
// (r-s-1) mod n and reduces segment (r-s-2) mod n.
func RingReduceScatter(n, rank, length, chunkElems int) (Plan, error) {
	return ringReduceScatter(nil, n, rank, length, chunkElems)
}

func ringReduceScatter(order []int, n, rank, length, chunkElems int) (Plan, error) {
	return ringPlan(AlgoRingReduceScatter, order, n, rank, length, chunkElems, -1, n-1, n-1)
}

// RingAllGather returns rank's plan for a pipelined ring allgather, in place:
// rank r contributes Segments(length, n)[r] of its buffer, and every rank
// ends with every rank's segment at its place. For contributions of k
// elements each, length is n·k and rank r's segment is [r·k, (r+1)·k). It
// runs n-1 steps: at step s, rank r sends segment (r-s) mod n and receives
// segment (r-s-1) mod n.
func RingAllGather(n, rank, length, chunkElems int) (Plan, error) {
	return ringAllGather(nil, n, rank, length, chunkElems)
}

func ringAllGather(order []int, n, rank, length, chunkElems int) (Plan, error) {
	return ringPlan(AlgoRingAllGather, order, n, rank, length, chunkElems, 0, n-1, 0)
}

// ringPlan builds the shared ring schedule described at the top of this
// file around the ring order (nil: rank order). The schedule runs on ring
// positions; every position is mapped to the rank seated there, both for
// peers and for segments, so a segment still belongs to its rank (rank r
// contributes and owns segment r) whatever the order.
func ringPlan(algo Algo, order []int, n, rank, length, chunk, shift, steps, reduceSteps int) (Plan, error) {
	if err := checkArgs(n, rank, length); err != nil {
		return Plan{}, err
	}
	if err := checkChunk(chunk, segment(length, n, 0).Len); err != nil {
		return Plan{}, err
	}
	p := Plan{Algo: algo, N: n, Rank: rank, Length: length, ChunkElems: chunk}
	if n == 1 {
		return orderOverwrites(p), nil
	}
	seat := newSeating(order, n)
	pos := seat.pos(rank)
	sendSeg := func(t int) Span { return segment(length, n, seat.rank(pos+shift-t)) }
	recvSeg := func(t int) Span { return segment(length, n, seat.rank(pos+shift-t-1)) }
	// Count first, so that construction makes one allocation.
	ns, nr := 0, 0
	for t := range steps {
		ns += numChunks(sendSeg(t).Len, chunk)
		nr += numChunks(recvSeg(t).Len, chunk)
	}
	xs := make([]Xfer, ns+nr)
	p.Sends, p.Recvs = xs[:0:ns], xs[ns:ns]
	right, left := seat.rank(pos+1), seat.rank(pos-1)
	prev := 0 // index in Recvs of the previous step's first chunk
	for t := range steps {
		seg := sendSeg(t)
		for c := range numChunks(seg.Len, chunk) {
			after := -1
			if t > 0 {
				after = prev + c
			}
			p.Sends = append(p.Sends, Xfer{Peer: right, Span: chunkOf(seg, chunk, c),
				Step: t, Chunk: c, After: after})
		}
		prev = len(p.Recvs)
		seg = recvSeg(t)
		for c := range numChunks(seg.Len, chunk) {
			p.Recvs = append(p.Recvs, Xfer{Peer: left, Span: chunkOf(seg, chunk, c),
				Step: t, Chunk: c, Reduce: t < reduceSteps, Final: t == reduceSteps-1, After: -1})
		}
	}
	return orderOverwrites(p), nil
}

// seating maps ring positions to ranks and back for a ring order.
type seating struct {
	order []int // nil: position p holds rank p
	n     int
}

func newSeating(order []int, n int) seating { return seating{order: order, n: n} }

// rank returns the rank at position p, taken mod n.
func (s seating) rank(p int) int {
	p = mod(p, s.n)
	if s.order == nil {
		return p
	}
	return s.order[p]
}

// pos returns rank's position.
func (s seating) pos(rank int) int {
	if s.order == nil {
		return rank
	}
	return slices.Index(s.order, rank)
}

// RingBroadcast returns rank's plan for broadcasting root's buffer of length
// elements to every rank along a pipelined chain: root sends to root+1,
// which forwards each chunk to root+2 as soon as it has it, and so on around
// the ring; root-1 only receives. Each message's Step is its sender's
// distance from root. The time is about (length + (n-2)·chunkElems)
// element-times on one link, so for large buffers it approaches a single
// link's bandwidth. Ranks other than root end with root's buffer.
func RingBroadcast(n, rank, root, length, chunkElems int) (Plan, error) {
	return ringBroadcast(nil, n, rank, root, length, chunkElems)
}

// ringBroadcast is RingBroadcast around the ring order (nil: rank order):
// the chain starts at root and follows the order.
func ringBroadcast(order []int, n, rank, root, length, chunkElems int) (Plan, error) {
	if err := checkArgs(n, rank, length); err != nil {
		return Plan{}, err
	}
	if root < 0 || root >= n {
		return Plan{}, invalid("root %d not in [0, %d)", root, n)
	}
	if err := checkChunk(chunkElems, length); err != nil {
		return Plan{}, err
	}
	p := Plan{Algo: AlgoRingBroadcast, N: n, Rank: rank, Root: root, Length: length, ChunkElems: chunkElems}
	if n == 1 {
		return orderOverwrites(p), nil
	}
	seat := newSeating(order, n)
	self := seat.pos(rank)
	pos := mod(self-seat.pos(root), n)
	prev, next := seat.rank(self-1), seat.rank(self+1)
	m := numChunks(length, chunkElems)
	ns, nr := m, m
	if pos == 0 {
		nr = 0
	}
	if pos == n-1 {
		ns = 0
	}
	xs := make([]Xfer, ns+nr)
	p.Sends, p.Recvs = xs[:0:ns], xs[ns:ns]
	all := Span{Len: length}
	for c := range m {
		sp := chunkOf(all, chunkElems, c)
		if pos > 0 {
			p.Recvs = append(p.Recvs, Xfer{Peer: prev, Span: sp, Step: pos - 1, Chunk: c, After: -1})
		}
		if pos < n-1 {
			after := -1
			if pos > 0 {
				after = c
			}
			p.Sends = append(p.Sends, Xfer{Peer: next, Span: sp, Step: pos, Chunk: c, After: after})
		}
	}
	return orderOverwrites(p), nil
}
