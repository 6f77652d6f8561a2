package ring

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
)

// This file is a pure simulator of a set of plans, one per rank, used by the
// tests. It runs the execution model that Plan documents: per rank, a send
// walker and a receive walker, each taking its list in order; a send waits
// for Recvs[After] to have committed; a receive first arrives (takes the
// next message from its peer off that peer's FIFO queue, checking Step,
// Chunk and length) and then commits (waits for Sends[After], then reduces
// into or overwrites its span). Events are interleaved by a deterministic
// round robin or by a seeded random source.
//
// It can also track happens-before with vector clocks, over the only edges
// a real execution guarantees: program order within a walker, After edges,
// and send-before-arrival of each message. From that it finds data races (a
// send and a commit on one rank that touch the same element and are not
// ordered in every execution) and, at the end, which ranks each rank has
// heard from.

// simConfig chooses how the simulator interleaves events.
type simConfig struct {
	// rendezvous makes a send complete only together with the arrival at a
	// receiver already waiting for it (a transport with no buffering).
	// Otherwise sends are queued without limit.
	rendezvous bool
	// rng, if set, interleaves events at random; otherwise ranks and events
	// are visited in a fixed round robin.
	rng *rand.Rand
	// hb tracks happens-before: it checks for races and fills
	// simResult.heard.
	hb bool
}

// simResult reports what a simulation did.
type simResult struct {
	events int // sends, arrivals and commits executed
	// heard[r][q] is set if some event of rank q happens before rank r's
	// last event (only with simConfig.hb). heard[r][r] is true.
	heard [][]bool
}

type simMsg[T any] struct {
	x    Xfer // the sender's Xfer
	data []T
	vc   []int32
}

type simRank[T any] struct {
	plan    *Plan
	buf     []T
	si, ri  int  // sends done; receives committed
	arrived bool // Recvs[ri] has arrived, in msg
	msg     simMsg[T]

	// Happens-before state. Thread 2r is rank r's send walker, 2r+1 its
	// receive walker; a clock counts a walker's sends, or its commits.
	svc, rvc   []int32
	sendSnap   map[int][]int32 // clock after Sends[i], kept while a receive's After needs it
	recvSnap   map[int][]int32 // clock after commit of Recvs[j], likewise
	sendRefs   map[int]int     // receives still to commit that wait for Sends[i]
	recvRefs   map[int]int     // sends still to run that wait for Recvs[j]
	sendSeen   []int32         // per send: own commits that happen before it
	commitSeen []int32         // per receive: own sends that happen before its commit
}

type simulator[T any] struct {
	cfg    simConfig
	n      int
	ranks  []simRank[T]
	queues [][]simMsg[T] // queues[from*n+to]: messages in flight, FIFO
	heads  []int
	reduce func(dst, src []T, final bool)
	free   map[int][][]T // message buffers for reuse, by length
	res    simResult
}

// simulate runs plans[r] on bufs[r] for every rank r, in place, with reduce
// as the reduction (told whether the receive is Final). It returns an error on a malformed plan, a message that
// does not match the receive expecting it, a deadlock or (with cfg.hb) a
// race.
func simulate[T any](plans []Plan, bufs [][]T, reduce func(dst, src []T, final bool), cfg simConfig) (simResult, error) {
	n := len(plans)
	s := &simulator[T]{cfg: cfg, n: n, ranks: make([]simRank[T], n),
		queues: make([][]simMsg[T], n*n), heads: make([]int, n*n), reduce: reduce,
		free: map[int][][]T{}}
	for r := range plans {
		p := &plans[r]
		if err := checkPlanShape(p, n, r); err != nil {
			return s.res, err
		}
		if len(bufs[r]) != p.Length {
			return s.res, fmt.Errorf("rank %d: buffer of %d for length %d", r, len(bufs[r]), p.Length)
		}
		rk := &s.ranks[r]
		rk.plan, rk.buf = p, bufs[r]
		if cfg.hb {
			rk.svc, rk.rvc = make([]int32, 2*n), make([]int32, 2*n)
			rk.sendSnap, rk.recvSnap = map[int][]int32{}, map[int][]int32{}
			rk.sendRefs, rk.recvRefs = map[int]int{}, map[int]int{}
			rk.sendSeen = make([]int32, len(p.Sends))
			rk.commitSeen = make([]int32, len(p.Recvs))
			for _, x := range p.Sends {
				if x.After >= 0 {
					rk.recvRefs[x.After]++
				}
			}
			for _, x := range p.Recvs {
				if x.After >= 0 {
					rk.sendRefs[x.After]++
				}
			}
		}
	}
	type ev struct{ r, kind int }
	var ready []ev
	for {
		ready = ready[:0]
		for r := range s.ranks {
			for kind := range 3 {
				if s.ready(r, kind) {
					ready = append(ready, ev{r, kind})
				}
			}
		}
		if len(ready) == 0 {
			break
		}
		todo := len(ready)
		if cfg.rng != nil {
			cfg.rng.Shuffle(len(ready), func(i, j int) { ready[i], ready[j] = ready[j], ready[i] })
			todo = 1 + cfg.rng.IntN(len(ready))
		}
		for _, e := range ready[:todo] {
			if !s.ready(e.r, e.kind) { // an earlier event may have taken it
				continue
			}
			if err := s.do(e.r, e.kind); err != nil {
				return s.res, err
			}
			s.res.events++
		}
	}
	if err := s.stuck(); err != nil {
		return s.res, err
	}
	for i, q := range s.queues {
		if len(q) > s.heads[i] {
			return s.res, fmt.Errorf("%d messages from %d to %d never received", len(q)-s.heads[i], i/n, i%n)
		}
	}
	if cfg.hb {
		s.res.heard = make([][]bool, n)
		for r := range s.ranks {
			rk := &s.ranks[r]
			if err := checkRaces(rk.plan, rk.sendSeen, rk.commitSeen); err != nil {
				return s.res, fmt.Errorf("rank %d: %w", r, err)
			}
			h := make([]bool, n)
			for q := range n {
				h[q] = q == r || rk.svc[2*q] > 0 || rk.svc[2*q+1] > 0 || rk.rvc[2*q] > 0 || rk.rvc[2*q+1] > 0
			}
			s.res.heard[r] = h
		}
	}
	return s.res, nil
}

const (
	evSend = iota
	evArrive
	evCommit
)

// ready reports whether event kind of rank r can happen now.
func (s *simulator[T]) ready(r, kind int) bool {
	rk := &s.ranks[r]
	p := rk.plan
	switch kind {
	case evSend:
		if rk.si == len(p.Sends) {
			return false
		}
		x := &p.Sends[rk.si]
		if x.After >= rk.ri {
			return false
		}
		if s.cfg.rendezvous {
			d := &s.ranks[x.Peer]
			return !d.arrived && d.ri < len(d.plan.Recvs) && d.plan.Recvs[d.ri].Peer == r
		}
		return true
	case evArrive:
		if rk.arrived || rk.ri == len(p.Recvs) {
			return false
		}
		q := p.Recvs[rk.ri].Peer*s.n + r
		return len(s.queues[q]) > s.heads[q]
	default:
		return rk.arrived && p.Recvs[rk.ri].After < rk.si
	}
}

// do runs event kind of rank r, which must be ready.
func (s *simulator[T]) do(r, kind int) error {
	rk := &s.ranks[r]
	p := rk.plan
	switch kind {
	case evSend:
		i := rk.si
		x := p.Sends[i]
		m := simMsg[T]{x: x, data: s.alloc(x.Len)}
		copy(m.data, rk.buf[x.Off:x.End()])
		if s.cfg.hb {
			if x.After >= 0 {
				merge(rk.svc, rk.recvSnap[x.After])
				if rk.recvRefs[x.After]--; rk.recvRefs[x.After] == 0 {
					delete(rk.recvSnap, x.After)
				}
			}
			rk.svc[2*r]++
			rk.sendSeen[i] = rk.svc[2*r+1]
			if rk.sendRefs[i] > 0 {
				rk.sendSnap[i] = slices.Clone(rk.svc)
			}
			m.vc = slices.Clone(rk.svc)
		}
		q := r*s.n + x.Peer
		s.queues[q] = append(s.queues[q], m)
		rk.si++
		if s.cfg.rendezvous {
			return s.do(x.Peer, evArrive)
		}
		return nil
	case evArrive:
		x := &p.Recvs[rk.ri]
		q := x.Peer*s.n + r
		m := s.queues[q][s.heads[q]]
		s.queues[q][s.heads[q]] = simMsg[T]{}
		s.heads[q]++
		if m.x.Step != x.Step || m.x.Chunk != x.Chunk || m.x.Len != x.Len {
			return fmt.Errorf("rank %d recv %d expects step %d chunk %d len %d from %d; got step %d chunk %d len %d",
				r, rk.ri, x.Step, x.Chunk, x.Len, x.Peer, m.x.Step, m.x.Chunk, m.x.Len)
		}
		if s.cfg.hb {
			merge(rk.rvc, m.vc)
		}
		rk.msg, rk.arrived = m, true
		return nil
	default:
		j := rk.ri
		x := &p.Recvs[j]
		dst := rk.buf[x.Off:x.End()]
		if x.Reduce {
			s.reduce(dst, rk.msg.data, x.Final)
		} else {
			copy(dst, rk.msg.data)
		}
		if s.cfg.hb {
			if x.After >= 0 {
				merge(rk.rvc, rk.sendSnap[x.After])
				if rk.sendRefs[x.After]--; rk.sendRefs[x.After] == 0 {
					delete(rk.sendSnap, x.After)
				}
			}
			rk.rvc[2*r+1]++
			rk.commitSeen[j] = rk.rvc[2*r]
			if rk.recvRefs[j] > 0 {
				rk.recvSnap[j] = slices.Clone(rk.rvc)
			}
		}
		s.free[len(rk.msg.data)] = append(s.free[len(rk.msg.data)], rk.msg.data)
		rk.msg, rk.arrived = simMsg[T]{}, false
		rk.ri++
		return nil
	}
}

// alloc returns a message buffer of n elements, reusing a free one if it
// can: allocating each message anew makes large simulations slow under the
// race detector.
func (s *simulator[T]) alloc(n int) []T {
	if f := s.free[n]; len(f) > 0 {
		s.free[n] = f[:len(f)-1]
		return f[len(f)-1]
	}
	return make([]T, n)
}

// stuck returns a deadlock report if some rank has not finished.
func (s *simulator[T]) stuck() error {
	var b strings.Builder
	for r := range s.ranks {
		rk := &s.ranks[r]
		p := rk.plan
		if rk.si < len(p.Sends) {
			x := p.Sends[rk.si]
			fmt.Fprintf(&b, "\n  rank %d send %d/%d (to %d step %d chunk %d) waits for recv %d, %d committed",
				r, rk.si, len(p.Sends), x.Peer, x.Step, x.Chunk, x.After, rk.ri)
		}
		if rk.ri < len(p.Recvs) {
			x := p.Recvs[rk.ri]
			fmt.Fprintf(&b, "\n  rank %d recv %d/%d (from %d step %d chunk %d) arrived=%v, waits for send %d, %d sent",
				r, rk.ri, len(p.Recvs), x.Peer, x.Step, x.Chunk, rk.arrived, x.After, rk.si)
		}
	}
	if b.Len() > 0 {
		return fmt.Errorf("deadlock:%s", b.String())
	}
	return nil
}

func merge(dst, src []int32) {
	for i, v := range src {
		dst[i] = max(dst[i], v)
	}
}

// checkPlanShape checks what the simulator relies on: the plan is rank r's
// of n, peers are other ranks, spans lie in the buffer and After indices are
// in range.
func checkPlanShape(p *Plan, n, r int) error {
	if p.N != n || p.Rank != r {
		return fmt.Errorf("plan %d is for rank %d of %d, want %d of %d", r, p.Rank, p.N, r, n)
	}
	check := func(kind string, i int, x Xfer, afterLimit int) error {
		switch {
		case x.Peer < 0 || x.Peer >= n || x.Peer == r:
			return fmt.Errorf("rank %d %s %d: peer %d", r, kind, i, x.Peer)
		case x.Off < 0 || x.Len < 0 || x.End() > p.Length:
			return fmt.Errorf("rank %d %s %d: span %+v outside [0, %d)", r, kind, i, x.Span, p.Length)
		case x.After < -1 || x.After >= afterLimit:
			return fmt.Errorf("rank %d %s %d: After %d not in [-1, %d)", r, kind, i, x.After, afterLimit)
		}
		return nil
	}
	for i, x := range p.Sends {
		if err := check("send", i, x, len(p.Recvs)); err != nil {
			return err
		}
	}
	for i, x := range p.Recvs {
		if err := check("recv", i, x, len(p.Sends)); err != nil {
			return err
		}
	}
	return nil
}

// checkRaces reports a send and a receive of plan p that touch a common
// element and are not ordered by happens-before. sendSeen[i] is how many
// receives of the rank happen before Sends[i] reads its span; commitSeen[j]
// how many sends happen before Recvs[j] writes. Sends[i] and Recvs[j] are
// ordered iff commitSeen[j] > i or sendSeen[i] > j.
func checkRaces(p *Plan, sendSeen, commitSeen []int32) error {
	// Cut the buffer at every span boundary, so that each span covers a run
	// of whole pieces, and list per piece the operations touching it.
	var cuts []int
	for _, xs := range [][]Xfer{p.Sends, p.Recvs} {
		for _, x := range xs {
			if x.Len > 0 {
				cuts = append(cuts, x.Off, x.End())
			}
		}
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	if len(cuts) < 2 {
		return nil
	}
	sends := make([][]int, len(cuts)-1)
	recvs := make([][]int, len(cuts)-1)
	add := func(lists [][]int, xs []Xfer) {
		for i, x := range xs {
			if x.Len == 0 {
				continue
			}
			k, _ := slices.BinarySearch(cuts, x.Off)
			for ; cuts[k] < x.End(); k++ {
				lists[k] = append(lists[k], i)
			}
		}
	}
	add(sends, p.Sends)
	add(recvs, p.Recvs)
	for k := range sends {
		for _, i := range sends[k] {
			for _, j := range recvs[k] {
				if int(commitSeen[j]) <= i && int(sendSeen[i]) <= j {
					return fmt.Errorf("race on [%d, %d): send %d %+v and recv %d %+v are unordered",
						cuts[k], cuts[k+1], i, p.Sends[i], j, p.Recvs[j])
				}
			}
		}
	}
	return nil
}
