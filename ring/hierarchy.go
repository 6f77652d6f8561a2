package ring

import (
	"errors"
	"slices"
)

// A hierarchical allreduce serves jobs with several ranks on each of
// several machines, where links inside a machine (shared memory) are much
// faster than links between machines. With L ranks on each of M machines:
//
//  1. a ring reduce-scatter inside each machine leaves local rank i with
//     segment i of Segments(length, L) reduced over its machine;
//  2. a ring allreduce of that segment among the M ranks with local index
//     i, one per machine, reduces it over the job;
//  3. a ring allgather inside each machine hands every rank every
//     segment.
//
// Each rank sends 2(L-1)/L·length elements inside its machine and
// 2(M-1)/M·length/L across machines: L times fewer across the slow links
// than the flat ring, whose every step crosses them.
//
// The three phases are the package's ring plans, composed: peers become
// the ranks of the group, spans are shifted into the buffer, steps and
// After indices follow one phase after the other, and the first sends of
// a phase wait for the receives of the earlier phases that wrote what
// they read. Only phase 2's
// Final receives finish the operator: phase 1's reductions are partial.

// Groups returns the ranks of each machine, given each rank's machine,
// machines in order of their lowest rank and ranks ascending within each,
// or nil unless every machine holds the same number of ranks, at least 2
// machines and at least 2 ranks each: the cases the hierarchy serves.
func Groups(machine []int) [][]int {
	groups := groupsOf(machine)
	if len(groups) < 2 || len(groups[0]) < 2 {
		return nil
	}
	for _, g := range groups {
		if len(g) != len(groups[0]) {
			return nil
		}
	}
	return groups
}

// writers finds, for a span, the last of a list of receives that wrote
// into it. Receives complete in order, so waiting for that one waits for
// every earlier write too.
type writers struct {
	cuts   []int // the receives' span ends, sorted
	lastOf []int // per piece [cuts[k], cuts[k+1]): the last receive that wrote it, or -1
}

// index indexes recvs.
func (w *writers) index(recvs []Xfer) {
	w.cuts = w.cuts[:0]
	for _, r := range recvs {
		if r.Len > 0 {
			w.cuts = append(w.cuts, r.Off, r.End())
		}
	}
	slices.Sort(w.cuts)
	w.cuts = slices.Compact(w.cuts)
	w.lastOf = make([]int, max(len(w.cuts)-1, 0))
	for k := range w.lastOf {
		w.lastOf[k] = -1
	}
	for j, r := range recvs {
		if r.Len > 0 {
			lo, _ := slices.BinarySearch(w.cuts, r.Off)
			hi, _ := slices.BinarySearch(w.cuts, r.End())
			for k := lo; k < hi; k++ {
				w.lastOf[k] = j // j ascends
			}
		}
	}
}

// last returns the index of the last receive that wrote into s, or -1.
func (w *writers) last(s Span) int {
	out := -1
	if s.Len == 0 || len(w.lastOf) == 0 {
		return out
	}
	lo, _ := slices.BinarySearch(w.cuts, s.Off)
	if lo > 0 && (lo == len(w.cuts) || w.cuts[lo] > s.Off) {
		lo-- // s starts inside the piece before
	}
	for k := lo; k < len(w.lastOf) && w.cuts[k] < s.End(); k++ {
		out = max(out, w.lastOf[k])
	}
	return out
}

// groupsOf returns the ranks of each machine, machines in order of their
// lowest rank.
func groupsOf(machine []int) [][]int {
	var groups [][]int
	index := map[int]int{}
	for r, m := range machine {
		g, ok := index[m]
		if !ok {
			g = len(groups)
			index[m] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], r)
	}
	return groups
}

// Hierarchical returns rank's plan for a hierarchical allreduce of length
// elements over the machines groups (as Groups returns them: equal sizes,
// every rank of [0, n) exactly once), in chunks of at most chunkElems.
// Every rank ends with the reduction of all ranks' buffers.
func Hierarchical(groups [][]int, rank, length, chunkElems int) (Plan, error) {
	m := len(groups)
	if m < 1 || len(groups[0]) < 1 {
		return Plan{}, invalid("no machines")
	}
	l := len(groups[0])
	n := m * l
	g, i := -1, -1
	seen := make([]bool, n)
	for gi, grp := range groups {
		if len(grp) != l {
			return Plan{}, invalid("machine %d holds %d ranks, machine 0 %d", gi, len(grp), l)
		}
		for li, r := range grp {
			if r < 0 || r >= n || seen[r] {
				return Plan{}, invalid("machines %v do not hold each rank of [0, %d) once", groups, n)
			}
			seen[r] = true
			if r == rank {
				g, i = gi, li
			}
		}
	}
	if err := checkArgs(n, rank, length); err != nil {
		return Plan{}, err
	}
	if err := checkChunk(chunkElems, segment(length, l, 0).Len); err != nil {
		return Plan{}, err
	}
	local := groups[g]
	cross := make([]int, m)
	for j := range groups {
		cross[j] = groups[j][i]
	}
	shard := segment(length, l, i)
	p1, err := ringReduceScatter(nil, l, i, length, chunkElems)
	if err != nil {
		return Plan{}, err
	}
	p2, err := ringAllReduce(nil, m, g, shard.Len, chunkElems)
	if err != nil {
		return Plan{}, err
	}
	p3, err := ringAllGather(nil, l, i, length, chunkElems)
	if err != nil {
		return Plan{}, err
	}
	if m > 1 {
		for j := range p1.Recvs {
			p1.Recvs[j].Final = false // the machine's sum, not the job's
		}
	}
	p := Plan{Algo: AlgoHierarchical, N: n, Rank: rank, Length: length, ChunkElems: chunkElems}
	p.Sends = make([]Xfer, 0, len(p1.Sends)+len(p2.Sends)+len(p3.Sends))
	p.Recvs = make([]Xfer, 0, len(p1.Recvs)+len(p2.Recvs)+len(p3.Recvs))
	step := 0
	var writes writers // the receives of the phases so far, by the spans they write
	for _, ph := range []struct {
		plan  Plan
		peers []int
		shift int
		steps int
	}{
		{p1, local, 0, l - 1},
		{p2, cross, shard.Off, 2 * (m - 1)},
		{p3, local, 0, l - 1},
	} {
		sends, recvs := len(p.Sends), len(p.Recvs)
		writes.index(p.Recvs)
		for _, x := range ph.plan.Sends {
			x.Peer, x.Off, x.Step = ph.peers[x.Peer], x.Off+ph.shift, x.Step+step
			if x.After >= 0 {
				x.After += recvs
			} else {
				// A phase's first sends read what earlier phases wrote:
				// each waits for the last receive that wrote its span,
				// so that a chunk moves on as soon as it is ready.
				x.After = writes.last(x.Span)
			}
			p.Sends = append(p.Sends, x)
		}
		for _, x := range ph.plan.Recvs {
			x.Peer, x.Off, x.Step = ph.peers[x.Peer], x.Off+ph.shift, x.Step+step
			if x.After >= 0 {
				x.After += sends
			}
			p.Recvs = append(p.Recvs, x)
		}
		step += ph.steps
	}
	// An overwriting receive of phase 3 may write a span a send of phase 1
	// read: order it after that send, as within one ring plan.
	return orderOverwrites(p), nil
}

// Hierarchy is what a Comm needs to run the hierarchical allreduce: the
// machines (Groups) and the cost models of the rings inside them (Local)
// and across them (Cross), which predict when it beats the flat ring.
type Hierarchy struct {
	Groups       [][]int
	Local, Cross CostModel
}

// FitHierarchy returns the hierarchy of a view whose rank r is on
// machine[r], with cost models fitted to p as FitCostModel fits the flat
// ring's, or nil if Groups finds none. It depends on its arguments alone,
// so every rank that holds the same table fits the same.
func FitHierarchy(p Probes, machine []int) *Hierarchy {
	groups := Groups(machine)
	if groups == nil {
		return nil
	}
	l := len(groups[0])
	cross := make([][]int, l)
	for i := range l {
		for _, g := range groups {
			cross[i] = append(cross[i], g[i])
		}
	}
	return &Hierarchy{Groups: groups, Local: fitRings(p, groups), Cross: fitRings(p, cross)}
}

// AllReduce returns the predicted time in seconds of a hierarchical
// allreduce of bytes bytes: the reduce-scatter and the allgather inside
// a machine of L ranks, each (L-1) hops and (L-1)/L of the buffer, the
// first paced by the slower of the link and the reduction; and between
// them the ring allreduce of an L-th of the buffer across the M machines.
// The phases do not overlap.
func (h *Hierarchy) AllReduce(bytes int) float64 {
	l, m := len(h.Groups[0]), len(h.Groups)
	f := float64(l-1) / float64(l)
	lo := h.Local
	inside := 2*float64(l-1)*lo.Alpha + f*float64(bytes)*(max(1/lo.Beta, 1/lo.Gamma)+1/lo.Beta)
	return inside + h.Cross.Ring(m, (bytes+l-1)/l)
}

// validate checks h against a Comm of n members.
func (h *Hierarchy) validate(n int) error {
	if h == nil {
		return nil
	}
	if len(h.Groups) == 0 || len(h.Groups[0]) == 0 {
		return invalid("hierarchy without machines")
	}
	if err := errors.Join(h.Local.Validate(), h.Cross.Validate()); err != nil {
		return err
	}
	total := 0
	for _, g := range h.Groups {
		total += len(g)
	}
	if total != n {
		return invalid("hierarchy of %d ranks for %d members", total, n)
	}
	_, err := Hierarchical(h.Groups, h.Groups[0][0], 0, 1)
	return err
}
