package ring

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
)

// ErrInvalid is wrapped by every error a plan constructor returns for
// arguments out of range.
var ErrInvalid = errors.New("ring: invalid argument")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// Algo identifies a collective and the algorithm that runs it. It travels in
// wire.Header.Algo, so that ranks which disagree on what they are running
// detect it from the first frame. The values are part of the wire protocol:
// new ones are appended, never renumbered.
type Algo uint8

// Algorithms. AlgoNone is the zero value and never appears on the wire.
const (
	AlgoNone              Algo = iota
	AlgoRing                   // allreduce: pipelined ring reduce-scatter then allgather
	AlgoRecursiveDoubling      // allreduce: recursive doubling, for small buffers
	AlgoRingReduceScatter      // reduce-scatter on the ring
	AlgoRingAllGather          // allgather on the ring
	AlgoRingBroadcast          // broadcast: pipelined chain from the root around the ring
	AlgoBarrier                // dissemination barrier
	AlgoHierarchical           // allreduce: reduce-scatter in each machine, allreduce across, allgather in each
	algoEnd
)

func (a Algo) String() string {
	names := [...]string{"none", "ring", "recursive-doubling", "ring-reduce-scatter",
		"ring-allgather", "ring-broadcast", "barrier", "hierarchical"}
	if int(a) < len(names) {
		return names[a]
	}
	return "algo(" + strconv.Itoa(int(a)) + ")"
}

// Valid reports whether a is a known algorithm other than AlgoNone.
func (a Algo) Valid() bool { return a > AlgoNone && a < algoEnd }

// Span is a contiguous range of buffer elements, [Off, Off+Len).
type Span struct {
	Off, Len int
}

// End returns the index one past the span's last element.
func (s Span) End() int { return s.Off + s.Len }

// Segments splits a buffer of length elements into n contiguous spans whose
// lengths differ by at most one: the first length%n spans hold one element
// more. Spans may be empty when length < n. It returns nil unless n >= 1 and
// length >= 0.
func Segments(length, n int) []Span {
	if n < 1 || length < 0 {
		return nil
	}
	s := make([]Span, n)
	for i := range s {
		s[i] = segment(length, n, i)
	}
	return s
}

// segment returns Segments(length, n)[i] without allocating.
func segment(length, n, i int) Span {
	q, r := length/n, length%n
	if i < r {
		return Span{Off: i * (q + 1), Len: q + 1}
	}
	return Span{Off: r*(q+1) + (i-r)*q, Len: q}
}

// numChunks returns how many chunks a span of l elements is cut into. A span
// is always at least one chunk, possibly empty: every step of a schedule then
// sends a message, so a zero-length collective still synchronizes the ranks
// as a nonzero one does and no rank can run ahead into the next collective.
func numChunks(l, chunk int) int {
	if l <= chunk {
		return 1
	}
	return (l-1)/chunk + 1
}

// chunkOf returns chunk c of span s cut into chunks of at most size elements.
// Every chunk but the last holds exactly size elements.
func chunkOf(s Span, size, c int) Span {
	if s.Len <= size {
		return s
	}
	off := c * size
	return Span{Off: s.Off + off, Len: min(size, s.Len-off)}
}

// Xfer is one message of a plan: a send to Peer or a receive from Peer.
type Xfer struct {
	// Peer is the rank this message goes to (a send) or comes from (a
	// receive).
	Peer int
	// Span is the range of the buffer the message carries: a send reads it,
	// a receive writes it. The peer's matching Xfer has the same Len.
	Span
	// Step is the schedule step, carried in wire.Header.Step.
	Step int
	// Chunk is the chunk index within the step, carried in wire.Header.Chunk.
	Chunk int
	// Reduce is set on a receive whose data is reduced into Span. A receive
	// without it overwrites Span. Always false on a send.
	Reduce bool
	// Final is set on the Reduce receive that completes the reduction of its
	// span on this rank: every rank's contribution is then in, so this is
	// where an executor finishes the operator (Avg divides by N), once per
	// element, before any send forwards the span. Ranks that get the result
	// by an overwriting receive must not finish it again. A plan for one
	// rank has no receives, so N = 1 has no Final either.
	Final bool
	// After is the index of the operation this one waits for, or -1. On a
	// send it indexes the plan's Recvs: the send may not read its span until
	// that receive has written the buffer. On a receive it indexes the plan's
	// Sends: the receive may not write its span until that send has
	// completed. A Reduce receive waits for the send still reading its span;
	// an overwriting receive waits for the last send of an earlier step that
	// read its span (see orderOverwrites).
	After int
}

// Plan is one rank's part of a collective, as plain data.
//
// A constructor is a pure function of its arguments, so an executor may
// cache plans per (collective, n, rank, length, chunk), and every rank can
// compute every other rank's plan.
//
// To run a plan, an executor walks Sends in order on one goroutine and Recvs
// in order on another:
//   - Sends[i] waits until Recvs[Sends[i].After] has completed, that is, its
//     data has been reduced or copied into the buffer (no wait if After is
//     -1). Then it sends Span of the buffer to Peer.
//   - Recvs[j] takes the next message from Peer off the transport. If Reduce
//     is set it receives into scratch, waits until Sends[Recvs[j].After] has
//     returned (no wait if After is -1), and reduces the scratch into Span.
//     Otherwise it waits for Sends[Recvs[j].After] first and then may
//     receive straight into Span.
//
// Both waits are "completed count > After", with one counter per walker.
// Those are all the dependencies: each send waits for no more than the
// receive it forwards (in the ring, the same chunk one step earlier), which
// is what pipelines the ring, and each receive that reduces into a span a
// concurrent send may still be reading waits for that send. Where a later
// receive overwrites a span an earlier send read, the data dependency
// through the other ranks already orders them across the cluster, but not
// inside one process: the send's goroutine and the receive's share no
// synchronisation, so the overwrite also waits for that send (a wait that
// costs nothing, as the send finished long before). The package tests check
// that every send and every receive touching the same elements are ordered
// by happens-before in every execution.
//
// The sends to one peer appear in Sends in exactly the order in which that
// peer's plan lists the matching receives, so one ordered channel per peer
// suffices. A receiver checks each header's Step and Chunk, and the message
// length, against the Xfer it expects.
//
// Plans do not deadlock whether a transport's Send buffers or blocks until
// the receiver takes the message, provided a Reduce receive is taken off the
// transport before its After wait, as above.
type Plan struct {
	Algo Algo
	// N is the number of ranks and Rank this rank, in [0, N).
	N, Rank int
	// Length is the buffer length in elements (wire.Header.Total).
	Length int
	// ChunkElems is the pipeline chunk size in elements: no message carries
	// more. wire.Header.ChunkSize carries it in bytes. A recursive-doubling
	// plan sends whole buffers, so it sets ChunkElems to Length; a barrier
	// carries no data and sets 0.
	ChunkElems int
	// Root is the broadcast root; 0 for other collectives.
	Root int
	// Sends and Recvs are this rank's messages in the order each walker
	// takes them.
	Sends, Recvs []Xfer
}

// ScratchElems returns the largest Len of a Reduce receive: the scratch
// space, in elements, an executor needs to receive one message before
// reducing it.
func (p *Plan) ScratchElems() int {
	m := 0
	for i := range p.Recvs {
		if p.Recvs[i].Reduce {
			m = max(m, p.Recvs[i].Len)
		}
	}
	return m
}

// SentElems returns the total number of elements this rank sends.
func (p *Plan) SentElems() int {
	t := 0
	for i := range p.Sends {
		t += p.Sends[i].Len
	}
	return t
}

// mod returns a mod n in [0, n).
func mod(a, n int) int {
	a %= n
	if a < 0 {
		a += n
	}
	return a
}

// checkArgs validates the arguments every constructor shares.
func checkArgs(n, rank, length int) error {
	switch {
	case n < 1:
		return invalid("world size %d < 1", n)
	case rank < 0 || rank >= n:
		return invalid("rank %d not in [0, %d)", rank, n)
	case length < 0:
		return invalid("length %d < 0", length)
	}
	return nil
}

// checkChunk validates a chunk size for a buffer whose largest chunked span
// has maxSpan elements: chunk indices must fit wire.Header.Chunk.
func checkChunk(chunkElems, maxSpan int) error {
	if chunkElems < 1 {
		return invalid("chunk size %d < 1", chunkElems)
	}
	if numChunks(maxSpan, chunkElems) > math.MaxUint32 {
		return invalid("%d elements in chunks of %d exceed %d chunks per step",
			maxSpan, chunkElems, uint64(math.MaxUint32))
	}
	return nil
}

// orderOverwrites gives every overwriting receive an After on the last send
// of an earlier step that read an overlapping span, so that the receive's
// write is ordered after the send's read inside the process, not only
// through the peers. Sends of a later step (forwarding what the receive
// brings) are not waited for. The wait cannot deadlock: such a send
// depends only on receives of earlier steps.
//
// It sweeps the steps in order over the buffer cut at every span's ends,
// keeping per piece the last send so far that read it: linear in the
// plan's size where every span covers a few pieces, as in every plan of
// this package, not the product of its sends and receives.
func orderOverwrites(p Plan) Plan {
	todo := 0
	for _, r := range p.Recvs {
		if !r.Reduce && r.After < 0 && r.Len > 0 {
			todo++
		}
	}
	if todo == 0 {
		return p
	}
	recvs := make([]int, 0, todo) // the receives to order, then by step
	cuts := make([]int, 0, 2*(todo+len(p.Sends)))
	for j, r := range p.Recvs {
		if !r.Reduce && r.After < 0 && r.Len > 0 {
			recvs = append(recvs, j)
			cuts = append(cuts, r.Off, r.End())
		}
	}
	var sends []int // the sends that read something, by step
	for i, s := range p.Sends {
		if s.Len > 0 {
			sends = append(sends, i)
			cuts = append(cuts, s.Off, s.End())
		}
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	slices.SortStableFunc(recvs, func(a, b int) int { return cmp.Compare(p.Recvs[a].Step, p.Recvs[b].Step) })
	slices.SortStableFunc(sends, func(a, b int) int { return cmp.Compare(p.Sends[a].Step, p.Sends[b].Step) })
	last := make([]int, len(cuts)-1) // per piece [cuts[k], cuts[k+1]): the last send so far that read it
	for k := range last {
		last[k] = -1
	}
	pieces := func(s Span) []int {
		lo, _ := slices.BinarySearch(cuts, s.Off)
		hi, _ := slices.BinarySearch(cuts, s.End())
		return last[lo:hi]
	}
	next := 0
	for _, j := range recvs {
		r := &p.Recvs[j]
		for ; next < len(sends) && p.Sends[sends[next]].Step < r.Step; next++ {
			i := sends[next]
			ps := pieces(p.Sends[i].Span)
			for k := range ps {
				ps[k] = max(ps[k], i)
			}
		}
		for _, i := range pieces(r.Span) {
			r.After = max(r.After, i)
		}
	}
	return p
}
