package ring

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

// cell is the simulated element type. sum is an exact integer value;
// contrib has bit r set for each contribution of rank r it holds; fin counts
// the Final receives it has been through. A reduction of two cells that
// share a contribution, or of a cell already finished, is an error. So a
// simulation checks that every element receives each rank's contribution
// exactly once, and is finished once, after the last.
type cell struct {
	sum     int32
	fin     int32
	contrib uint64
}

// input returns rank r's buffer: values in [-1000, 1000] that depend on r
// and the index, and r's contribution bit. The values repeat with period
// 2001, so the buffer is built by copying, which keeps large simulations
// fast under the race detector.
func input(r, length int) []cell {
	const period = 2001
	b := make([]cell, length)
	for i := range min(length, period) {
		b[i] = cell{sum: int32((i+r*104729)%period - 1000), contrib: 1 << r}
	}
	for done := period; done < length; done *= 2 {
		copy(b[done:], b[:done])
	}
	return b
}

// reducer returns a sum over cells that records the first double count or
// reduction after the finish in *err.
func reducer(err *error) func(dst, src []cell, final bool) {
	return func(dst, src []cell, final bool) {
		for i := range dst {
			d, s := &dst[i], src[i]
			switch {
			case *err != nil:
			case d.contrib&s.contrib != 0:
				*err = fmt.Errorf("contributions %#x reduced twice", d.contrib&s.contrib)
			case d.fin != 0 || s.fin != 0:
				*err = fmt.Errorf("reduction into a finished element")
			}
			d.sum += s.sum
			d.contrib |= s.contrib
			if final {
				d.fin++
			}
		}
	}
}

// kind is a collective under test: how to build its plans and what each
// rank must end with.
type kind struct {
	name    string
	chunked bool // the plan depends on the chunk size
	build   func(n, rank, length, chunk int) (Plan, error)
	// want returns the cells rank r must hold at [from, to) of its buffer.
	want func(w *world, r int) (from, to int, cells []cell)
	// barrier is set if every rank must hear from every other before it
	// finishes; otherwise it must hear from root.
	barrier bool
	root    int
	// order is the ring order the plans follow (nil: rank order).
	order []int
}

// world holds the inputs of n ranks of length elements and, computed once
// on first use, their reduction and concatenation. Inputs are made again on
// demand rather than kept: large simulations under the race detector are
// bound by memory.
type world struct {
	n, length     int
	red, gathered []cell
}

func (w *world) input(r int) []cell { return input(r, w.length) }

// reduced returns the reduction of every rank's input.
func (w *world) reduced() []cell {
	if w.red == nil {
		w.red = w.input(0)
		for q := 1; q < w.n; q++ {
			for i, c := range w.input(q) {
				w.red[i].sum += c.sum
				w.red[i].contrib |= c.contrib
				w.red[i].fin = 1 // finished once (no receives at n = 1)
			}
		}
	}
	return w.red
}

// gather returns every rank's own segment of its input, each in its place.
func (w *world) gather() []cell {
	if w.gathered == nil {
		w.gathered = make([]cell, w.length)
		for q, s := range Segments(w.length, w.n) {
			copy(w.gathered[s.Off:s.End()], w.input(q)[s.Off:s.End()])
		}
	}
	return w.gathered
}

// kinds returns the collectives to test at world size n.
func kinds(n int) []kind {
	ks := []kind{
		{name: "allreduce", chunked: true, build: RingAllReduce, barrier: true,
			want: func(w *world, r int) (int, int, []cell) {
				return 0, w.length, w.reduced()
			}},
		{name: "recursive-doubling", barrier: true,
			build: func(n, rank, length, _ int) (Plan, error) { return RecursiveDoubling(n, rank, length) },
			want: func(w *world, r int) (int, int, []cell) {
				return 0, w.length, w.reduced()
			}},
		{name: "reduce-scatter", chunked: true, build: RingReduceScatter, barrier: true,
			want: func(w *world, r int) (int, int, []cell) {
				s := segment(w.length, w.n, r)
				return s.Off, s.End(), w.reduced()[s.Off:s.End()]
			}},
		{name: "allgather", chunked: true, build: RingAllGather, barrier: true,
			want: func(w *world, r int) (int, int, []cell) {
				return 0, w.length, w.gather()
			}},
		{name: "barrier", barrier: true,
			build: func(n, rank, _, _ int) (Plan, error) { return Barrier(n, rank) }},
	}
	roots := []int{0, n - 1, n / 2}
	slices.Sort(roots)
	for _, root := range slices.Compact(roots) {
		ks = append(ks, kind{name: fmt.Sprintf("broadcast-root%d", root), chunked: true, root: root,
			build: func(n, rank, length, chunk int) (Plan, error) {
				return RingBroadcast(n, rank, root, length, chunk)
			},
			want: func(w *world, r int) (int, int, []cell) {
				return 0, w.length, w.input(root)
			}})
	}
	if n < 3 {
		return ks // every order of 1 or 2 ranks is the same ring
	}
	// The ring collectives again around a shuffled ring order: the
	// results must not change (ranks keep their segments and roots).
	order := shuffledOrder(n)
	ordered := map[string]func(n, rank, length, chunk int) (Plan, error){
		"allreduce": func(n, rank, length, chunk int) (Plan, error) {
			return ringAllReduce(order, n, rank, length, chunk)
		},
		"reduce-scatter": func(n, rank, length, chunk int) (Plan, error) {
			return ringReduceScatter(order, n, rank, length, chunk)
		},
		"allgather": func(n, rank, length, chunk int) (Plan, error) {
			return ringAllGather(order, n, rank, length, chunk)
		},
	}
	for _, k := range ks {
		build := ordered[k.name]
		if strings.HasPrefix(k.name, "broadcast") {
			root := k.root
			build = func(n, rank, length, chunk int) (Plan, error) {
				return ringBroadcast(order, n, rank, root, length, chunk)
			}
		}
		if build != nil {
			k.name, k.build, k.order = k.name+"-ordered", build, order
			ks = append(ks, k)
		}
	}
	return ks
}

// shuffledOrder returns a fixed ring order of n ranks that is neither rank
// order nor its reverse (for n > 3).
func shuffledOrder(n int) []int {
	order := RankOrder(n)
	rand.New(rand.NewPCG(uint64(n), 7)).Shuffle(n, func(i, j int) { order[i], order[j] = order[j], order[i] })
	return order
}

// plans builds every rank's plan.
func plans(tb testing.TB, k kind, n, length, chunk int) []Plan {
	tb.Helper()
	ps := make([]Plan, n)
	for r := range n {
		p, err := k.build(n, r, length, chunk)
		if err != nil {
			tb.Fatalf("%s(n=%d, rank=%d, length=%d, chunk=%d): %v", k.name, n, r, length, chunk, err)
		}
		ps[r] = p
	}
	return ps
}

// run simulates one collective and checks every rank's result against the
// reference, and (with cfg.hb) who heard from whom. It returns the plans.
func run(tb testing.TB, k kind, n, length, chunk int, cfg simConfig) []Plan {
	tb.Helper()
	ps := plans(tb, k, n, length, chunk)
	runPlans(tb, k, ps, length, chunk, cfg)
	return ps
}

// runPlans is run on plans already built for length and chunk.
func runPlans(tb testing.TB, k kind, ps []Plan, length, chunk int, cfg simConfig) {
	tb.Helper()
	n := len(ps)
	if k.want == nil {
		length = 0 // the plan ignores it
	}
	bufs := make([][]cell, n)
	for r := range n {
		bufs[r] = input(r, ps[r].Length)
	}
	var rerr error
	res, err := simulate(ps, bufs, reducer(&rerr), cfg)
	if err == nil {
		err = rerr
	}
	if err != nil {
		tb.Fatalf("%s n=%d length=%d chunk=%d: %v", k.name, n, length, chunk, err)
	}
	if k.want != nil {
		wd := &world{n: n, length: length}
		for r := range n {
			from, to, w := k.want(wd, r)
			if i := firstDiff(bufs[r][from:to], w); i >= 0 {
				tb.Fatalf("%s n=%d length=%d chunk=%d: rank %d element %d = %+v, want %+v",
					k.name, n, length, chunk, r, from+i, bufs[r][from+i], w[i])
			}
		}
	}
	if cfg.hb {
		for r, h := range res.heard {
			for q := range n {
				if !h[q] && (k.barrier || q == k.root) {
					tb.Fatalf("%s n=%d length=%d chunk=%d: rank %d finishes without hearing from rank %d",
						k.name, n, length, chunk, r, q)
				}
			}
		}
	}
}

// firstDiff returns the first index at which a and b differ, or -1.
func firstDiff(a, b []cell) int {
	if len(a) == len(b) && bytesOf(a) == bytesOf(b) {
		return -1 // the common case, compared at memory speed
	}
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// bytesOf returns the memory of c as a string, for fast comparison (cell
// has no padding).
func bytesOf(c []cell) string {
	if len(c) == 0 {
		return ""
	}
	return unsafe.String((*byte)(unsafe.Pointer(&c[0])), len(c)*int(unsafe.Sizeof(c[0])))
}

var worldSizes = []int{1, 2, 3, 4, 5, 7, 8, 16, 64}

// lengths returns the buffer lengths tested at world size n: 997 cuts
// segments of two lengths, 1000 segments of one where n divides it. Where
// it does not (n = 3, 7, 16, 64), 1000 also cuts segments of two lengths,
// with short last chunks for the same chunk sizes as 997: the same plans
// but for offsets, which are the costliest to simulate, so it is left
// out. (A broadcast of 1000 in whole chunks runs at n = 2, 4, 5 and 8.)
func lengths(n int) []int {
	ls := []int{0, 1, n - 1, n + 1, 997}
	if 1000%n == 0 {
		ls = append(ls, 1000)
	}
	slices.Sort(ls)
	return slices.Compact(ls)
}

var chunkSizes = []int{1, 2, 5, 64, 1 << 30}

// TestCollectives runs every collective for every world size, length and
// chunk size in the table and checks the results against naive references,
// each contribution counted exactly once, the absence of data races, that
// reductions and barriers synchronize, and the plans' structure. It runs
// each with buffered sends, and again with unbuffered sends for the chunk
// sizes of 5 and up.
//
// A chunk size at or above a collective's longest span makes the same
// messages as the next smaller one that is: those plans are compared with
// the ones simulated, not simulated again.
func TestCollectives(t *testing.T) {
	for _, n := range worldSizes {
		for _, k := range kinds(n) {
			t.Run(fmt.Sprintf("n=%d/%s", n, k.name), func(t *testing.T) {
				t.Parallel()
				for _, length := range lengths(n) {
					chunks := chunkSizes
					if !k.chunked {
						chunks = chunks[len(chunks)-1:]
					}
					var last []Plan // the plans last simulated
					lastRendezvous := false
					for _, chunk := range chunks {
						if n == 64 && length > n+1 && chunk < 5 {
							// A quarter of a million messages per
							// simulation: too slow under the race detector,
							// and chunk sizes 1 and 2 at n = 64 are
							// covered at the shorter lengths.
							continue
						}
						ps := plans(t, k, n, length, chunk)
						rendezvous := chunk >= 5
						if !sameMessages(ps, last) {
							runPlans(t, k, ps, length, chunk, simConfig{hb: true})
							checkStructure(t, k, ps)
							last, lastRendezvous = ps, false
						}
						if rendezvous && !lastRendezvous {
							// Unbuffered sends, with several chunks per
							// segment and with one.
							runPlans(t, k, ps, length, chunk, simConfig{rendezvous: true})
							lastRendezvous = true
						}
					}
					if k.want == nil {
						break // the length does not matter
					}
				}
			})
		}
	}
}

// sameMessages reports whether two sets of plans send and receive the
// same messages, whatever their chunk sizes.
func sameMessages(a, b []Plan) bool {
	return len(a) == len(b) && slices.EqualFunc(a, b, func(p, q Plan) bool {
		return slices.Equal(p.Sends, q.Sends) && slices.Equal(p.Recvs, q.Recvs)
	})
}

// TestLarge runs the collectives on a buffer of largeLength elements in
// chunks of largeChunk: every collective at n = 3, and the allreduces also
// at n = 2 and n = 5. Simulating moves every byte several times, which the
// race detector makes costly, so the set is small.
func TestLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("large buffers")
	}
	const length = largeLength
	for _, n := range []int{2, 3, 5} {
		for _, k := range kinds(n) {
			if k.want == nil || (n != 3 && k.name != "allreduce" && k.name != "recursive-doubling") {
				continue
			}
			t.Run(fmt.Sprintf("n=%d/%s", n, k.name), func(t *testing.T) {
				chunks := []int{largeChunk}
				if k.name == "allreduce" && n == 3 {
					chunks = append(chunks, 1<<30) // one message per segment
				}
				for _, chunk := range chunks {
					ps := run(t, k, n, length, chunk, simConfig{hb: true})
					checkStructure(t, k, ps)
				}
			})
		}
	}
}

// The large tests' buffer, in elements, and chunks: for the simulator in
// elements, for the executor in bytes. A million and three elements in
// chunks of 16 Ki elements (simulator) or 256 KiB (executor) scaled down
// by 8: the same number of chunks per segment at n = 2, 3 and 5 and per
// broadcast, with a short last chunk each time, and the same remainder
// mod 2 to 6 (both are 43 mod 60), at an eighth of the cost under -race.
// TestLongMatrix runs the executor at the full million and three, without
// it.
const (
	largeLength     = 125_023
	largeChunk      = 1 << 11
	largeChunkBytes = 32 << 10
)

// checkStructure checks the plans of one collective without running them:
// per-peer order agreement, After pointing backwards, chunk sizes, the
// inline walk's order (checkInlineOrder), and for the ring the pipelining
// rule and the bytes each rank sends.
func checkStructure(tb testing.TB, k kind, ps []Plan) {
	tb.Helper()
	checkInlineOrder(tb, k, ps)
	n := len(ps)
	fail := func(format string, args ...any) {
		tb.Helper()
		tb.Fatalf("%s n=%d length=%d chunk=%d: %s", k.name, n, ps[0].Length, ps[0].ChunkElems,
			fmt.Sprintf(format, args...))
	}
	for r := range ps {
		p := &ps[r]
		if err := checkPlanShape(p, n, r); err != nil {
			fail("%v", err)
		}
		for i, x := range p.Sends {
			if x.Reduce {
				fail("rank %d send %d has Reduce set", r, i)
			}
			if x.After >= 0 && p.Recvs[x.After].Step >= x.Step {
				fail("rank %d send %d (step %d) waits for recv %d of step %d", r, i, x.Step, x.After, p.Recvs[x.After].Step)
			}
			if x.Len > p.ChunkElems {
				fail("rank %d send %d carries %d elements, chunk is %d", r, i, x.Len, p.ChunkElems)
			}
		}
		for j, x := range p.Recvs {
			if x.Final && !x.Reduce {
				fail("rank %d recv %d is Final but does not reduce", r, j)
			}
			// A reduce waits for a send of its own step or earlier; an
			// overwrite only for an earlier step's send of an overlapping
			// span (orderOverwrites), never for the send forwarding it.
			if s := x.After; s >= 0 && (p.Sends[s].Step > x.Step ||
				!x.Reduce && (p.Sends[s].Step == x.Step || p.Sends[s].Off >= x.End() || x.Off >= p.Sends[s].End())) {
				fail("rank %d recv %d (step %d, reduce %v) waits for send %d of step %d",
					r, j, x.Step, x.Reduce, x.After, p.Sends[x.After].Step)
			}
		}
	}
	// Rank a's sends to b, in order, are b's receives from a, in order.
	strip := func(x Xfer) Xfer { return Xfer{Span: x.Span, Step: x.Step, Chunk: x.Chunk} }
	for a := range n {
		toPeer := map[int][]Xfer{}
		for _, x := range ps[a].Sends {
			toPeer[x.Peer] = append(toPeer[x.Peer], strip(x))
		}
		for b := range n {
			s := toPeer[b]
			var r []Xfer
			for _, x := range ps[b].Recvs {
				if x.Peer == a {
					r = append(r, strip(x))
				}
			}
			if !slices.Equal(s, r) {
				i := 0
				for i < min(len(s), len(r)) && s[i] == r[i] {
					i++
				}
				fail("sends %d->%d differ from the receives at message %d (%d sent, %d received)",
					a, b, i, len(s), len(r))
			}
		}
	}
	switch ps[0].Algo {
	case AlgoRing, AlgoRingReduceScatter, AlgoRingAllGather:
		checkRing(tb, fail, ps, newSeating(k.order, n))
	case AlgoRingBroadcast:
		// Every rank but the last in the chain forwards the whole buffer
		// once.
		for r := range ps {
			want := ps[r].Length
			seat := newSeating(k.order, n)
			if n == 1 || mod(seat.pos(r)-seat.pos(ps[r].Root), n) == n-1 {
				want = 0
			}
			if got := ps[r].SentElems(); got != want {
				fail("rank %d sends %d elements, want %d", r, got, want)
			}
		}
	}
}

// checkRing checks what is particular to the ring schedules.
func checkRing(tb testing.TB, fail func(string, ...any), ps []Plan, seat seating) {
	tb.Helper()
	n, length := len(ps), ps[0].Length
	total := 0
	for r := range ps {
		p := &ps[r]
		// The send of (step t, chunk c) waits for exactly the receive of
		// (step t-1, chunk c), of the same span: pipelining.
		for i, x := range p.Sends {
			if x.Peer != seat.rank(seat.pos(r)+1) {
				fail("rank %d send %d to %d", r, i, x.Peer)
			}
			if x.Step == 0 {
				if x.After != -1 {
					fail("rank %d send %d of step 0 waits for recv %d", r, i, x.After)
				}
				continue
			}
			y := p.Recvs[x.After]
			if y.Step != x.Step-1 || y.Chunk != x.Chunk || y.Span != x.Span {
				fail("rank %d send %+v waits for recv %+v", r, x, y)
			}
		}
		for j, x := range p.Recvs {
			if x.Peer != seat.rank(seat.pos(r)-1) {
				fail("rank %d recv %d %+v", r, j, x)
			}
			// Only an allgather overwrite waits, for the reduce-scatter send
			// that read the same chunk earlier.
			if x.After != -1 {
				if y := p.Sends[x.After]; x.Reduce || y.Span != x.Span || y.Step >= x.Step {
					fail("rank %d recv %+v waits for send %+v", r, x, y)
				}
			}
			if x.Chunk > 0 && x.Off != p.Recvs[j-1].End() {
				fail("rank %d recv %d does not continue recv %d", r, j, j-1)
			}
		}
		// Bandwidth: a rank of an allreduce sends 2(n-1)/n·length elements,
		// of a reduce-scatter or allgather (n-1)/n·length, up to rounding.
		passes := 1
		if p.Algo == AlgoRing {
			passes = 2
		}
		sent := p.SentElems()
		ideal := float64(passes*(n-1)) * float64(length) / float64(n)
		if math.Abs(float64(sent)-ideal) >= float64(passes) {
			fail("rank %d sends %d elements, want %.2f", r, sent, ideal)
		}
		total += sent
	}
	if n > 1 {
		passes := 1
		if ps[0].Algo == AlgoRing {
			passes = 2
		}
		if want := passes * (n - 1) * length; total != want {
			fail("ranks send %d elements in all, want %d", total, want)
		}
	}
}

// TestRandomInterleavings runs random collectives under random interleavings
// of events, with and without buffering in the transport.
func TestRandomInterleavings(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	iters := 300
	if testing.Short() {
		iters = 50
	}
	for range iters {
		n := 1 + rng.IntN(20)
		ks := kinds(n)
		k := ks[rng.IntN(len(ks))]
		length := rng.IntN(300)
		chunk := 1 + rng.IntN(length+2)
		cfg := simConfig{rendezvous: rng.IntN(2) == 0, hb: true,
			rng: rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))}
		run(t, k, n, length, chunk, cfg)
	}
}

func FuzzCollectives(f *testing.F) {
	f.Add(uint8(3), uint16(10), uint16(2), uint8(0), uint64(1))
	f.Add(uint8(5), uint16(1), uint16(1), uint8(1), uint64(2))
	f.Add(uint8(6), uint16(100), uint16(7), uint8(2), uint64(3))
	f.Add(uint8(12), uint16(37), uint16(3), uint8(3), uint64(4))
	f.Add(uint8(9), uint16(0), uint16(1), uint8(4), uint64(5))
	f.Add(uint8(7), uint16(500), uint16(64), uint8(13), uint64(6))
	f.Fuzz(func(t *testing.T, n8 uint8, length16, chunk16 uint16, which uint8, seed uint64) {
		n := 1 + int(n8)%33
		length := int(length16) % 2048
		chunk := 1 + int(chunk16)%(length+2)
		ks := kinds(n)
		k := ks[int(which)%len(ks)]
		cfg := simConfig{rendezvous: which&0x80 != 0, hb: true,
			rng: rand.New(rand.NewPCG(seed, uint64(which)))}
		checkStructure(t, k, run(t, k, n, length, chunk, cfg))
	})
}

// TestSimulatorCatches checks that the simulator reports the faults it is
// there to find, on plans broken on purpose.
func TestSimulatorCatches(t *testing.T) {
	build := func(k kind, n, length, chunk int, breakIt func([]Plan)) error {
		ps := plans(t, k, n, length, chunk)
		breakIt(ps)
		bufs := make([][]cell, n)
		for r := range bufs {
			bufs[r] = input(r, ps[r].Length)
		}
		var rerr error
		_, err := simulate(ps, bufs, reducer(&rerr), simConfig{hb: true})
		if err == nil {
			err = rerr
		}
		return err
	}
	ks := kinds(4)
	allreduce, doubling := ks[0], ks[1]
	tests := []struct {
		name    string
		k       kind
		breakIt func([]Plan)
		want    string
	}{
		{"deadlock", allreduce, func(ps []Plan) {
			for r := range ps {
				ps[r].Sends[0].After = 0 // everyone waits to receive first
			}
		}, "deadlock"},
		{"race", doubling, func(ps []Plan) { ps[2].Recvs[1].After = -1 }, "race"},
		{"order", allreduce, func(ps []Plan) {
			s := ps[1].Sends
			s[0], s[1] = s[1], s[0]
			s[0].After, s[1].After = -1, -1
		}, "expects step"},
		{"double count", allreduce, func(ps []Plan) {
			for j := range ps[2].Recvs {
				ps[2].Recvs[j].Reduce = true
			}
		}, "reduced twice"},
		{"finished early", allreduce, func(ps []Plan) { ps[1].Recvs[0].Final = true }, "finished"},
		{"unreceived", allreduce, func(ps []Plan) {
			ps[3].Recvs = ps[3].Recvs[:len(ps[3].Recvs)-1]
		}, "never received"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := build(tt.k, 4, 10, 2, tt.breakIt)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestInvalidArguments(t *testing.T) {
	tests := []struct {
		name string
		f    func() (Plan, error)
	}{
		{"n=0", func() (Plan, error) { return RingAllReduce(0, 0, 10, 1) }},
		{"rank<0", func() (Plan, error) { return RingAllReduce(4, -1, 10, 1) }},
		{"rank=n", func() (Plan, error) { return RingReduceScatter(4, 4, 10, 1) }},
		{"length<0", func() (Plan, error) { return RingAllGather(4, 0, -1, 1) }},
		{"chunk=0", func() (Plan, error) { return RingAllReduce(4, 0, 10, 0) }},
		{"too many chunks", func() (Plan, error) { return RingBroadcast(2, 0, 0, 1<<40, 1) }},
		{"root<0", func() (Plan, error) { return RingBroadcast(4, 0, -1, 10, 1) }},
		{"root=n", func() (Plan, error) { return RingBroadcast(4, 0, 4, 10, 1) }},
		{"doubling rank", func() (Plan, error) { return RecursiveDoubling(3, 3, 10) }},
		{"barrier n", func() (Plan, error) { return Barrier(0, 0) }},
	}
	for _, tt := range tests {
		if _, err := tt.f(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: got %v, want ErrInvalid", tt.name, err)
		}
	}
}

// TestPlanFacts pins down a few documented facts about the plans.
func TestPlanFacts(t *testing.T) {
	// Recursive doubling: ⌊log2 n⌋ steps, two more if n is not a power of
	// two.
	for _, tt := range []struct{ n, steps int }{{1, 0}, {2, 1}, {3, 3}, {4, 2}, {5, 4}, {8, 3}, {64, 6}, {65, 8}} {
		steps := map[int]bool{}
		for r := range tt.n {
			p, err := RecursiveDoubling(tt.n, r, 5)
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range append(p.Sends, p.Recvs...) {
				steps[x.Step] = true
			}
		}
		if len(steps) != tt.steps {
			t.Errorf("RecursiveDoubling(%d): %d steps, want %d", tt.n, len(steps), tt.steps)
		}
	}
	// Barrier: ⌈log2 n⌉ rounds.
	for _, tt := range []struct{ n, rounds int }{{1, 0}, {2, 1}, {3, 2}, {4, 2}, {5, 3}, {64, 6}, {65, 7}} {
		p, err := Barrier(tt.n, 0)
		if err != nil || len(p.Sends) != tt.rounds || len(p.Recvs) != tt.rounds {
			t.Errorf("Barrier(%d): %d sends, %d receives, %v; want %d rounds", tt.n, len(p.Sends), len(p.Recvs), err, tt.rounds)
		}
	}
	// ScratchElems is the largest reducing chunk.
	p, _ := RingAllReduce(4, 0, 10, 2)
	if got := p.ScratchElems(); got != 2 {
		t.Errorf("ScratchElems = %d, want 2", got)
	}
	p, _ = RingAllGather(4, 0, 10, 2)
	if got := p.ScratchElems(); got != 0 {
		t.Errorf("allgather ScratchElems = %d, want 0", got)
	}
	// An empty segment still sends one empty message per step.
	p, _ = RingAllReduce(4, 0, 0, 8)
	if len(p.Sends) != 6 || len(p.Recvs) != 6 {
		t.Errorf("zero-length allreduce: %d sends, %d receives, want 6 and 6", len(p.Sends), len(p.Recvs))
	}
}
