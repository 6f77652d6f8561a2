package recovery

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
)

// This file is a deterministic simulator of a set of Ranks. The
// simulator owns the network: a queue of messages, each due at a tick,
// delivered one per step; a failure detector that gives an observer Lost
// once a peer has been silent for peerTimeout ticks; and faults injected
// before chosen message steps. It checks the invariants of
// docs/recovery.md as ranks install views, and liveness at the end.

const (
	peerTimeout = 3
	freezeTicks = 40 // long enough for the others to recover without the frozen rank
)

// endRounds is I5's bound, in rounds after the network last changed: the
// coordinator rotation may try each of the n ranks before one that can
// finish, and a round lost to a late rank costs another.
func endRounds(n int) int { return max(12, 2*n+4) }

type faultKind int

const (
	crash     faultKind = iota // a stops for good
	freeze                     // a stops for freezeTicks, then resumes with its old state
	cutBoth                    // a and b no longer hear each other
	cutOne                     // b no longer hears a
	partition                  // the ranks in group and the rest no longer hear each other
	numFaultKinds
)

type fault struct {
	kind  faultKind
	a, b  int
	group uint // bit i: rank i
}

func (f fault) String() string {
	switch f.kind {
	case crash:
		return fmt.Sprintf("crash %d", f.a)
	case freeze:
		return fmt.Sprintf("freeze %d", f.a)
	case cutBoth:
		return fmt.Sprintf("cut %d-%d", f.a, f.b)
	case cutOne:
		return fmt.Sprintf("cut %d->%d", f.a, f.b)
	}
	return fmt.Sprintf("partition %b", f.group)
}

// allFaults lists every fault of every kind on n ranks; partitions are
// named by the side holding rank 0.
func allFaults(n int) []fault {
	var fs []fault
	for a := range n {
		fs = append(fs, fault{kind: crash, a: a}, fault{kind: freeze, a: a})
	}
	for a := range n {
		for b := range n {
			if a < b {
				fs = append(fs, fault{kind: cutBoth, a: a, b: b})
			}
			if a != b {
				fs = append(fs, fault{kind: cutOne, a: a, b: b})
			}
		}
	}
	for g := uint(1); g < 1<<n-1; g += 2 {
		fs = append(fs, fault{kind: partition, group: g})
	}
	return fs
}

// scenario is one run: the initial view and commits, and when each fault
// strikes (before message step at, counting deliveries from the start).
type scenario struct {
	n       int
	joiner  bool // the last rank joined in the initial view
	leaver  bool // rank 1 asked to leave in the initial view
	faults  []fault
	at      []int
	seed    uint64 // 0: FIFO delivery after one tick; else random order and delays
	maxTick int    // 0: the default bound
}

func (sc scenario) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "n=%d", sc.n)
	if sc.joiner {
		b.WriteString(" joiner")
	}
	if sc.leaver {
		b.WriteString(" leaver")
	}
	for i, f := range sc.faults {
		fmt.Fprintf(&b, ", %v at step %d", f, sc.at[i])
	}
	if sc.seed != 0 {
		fmt.Fprintf(&b, ", seed %d", sc.seed)
	}
	return b.String()
}

type envelope struct {
	from, to int
	msg      Msg
	due      int
}

type installRec struct {
	view   View
	lost   []ID
	winner Winner
}

// violation is an invariant that failed, with what shows it.
type violation struct {
	inv  string // "I1" … "I6"
	what string
}

type sim struct {
	sc      scenario
	n       int
	ids     []ID
	initial View
	ranks   []*Rank
	rng     *rand.Rand

	crashed     []bool
	frozenUntil []int  // the tick a frozen rank resumes at; 0 if not frozen
	cut         []bool // cut[i*n+j]: j does not hear i
	queue       []envelope
	tick, steps int
	nextFault   int
	lastChange  int // the last tick a fault struck, a rank resumed or a view was installed

	downSince []int  // [obs*n+peer]: tick since peer is silent to obs; -1 if not
	told      []bool // [obs*n+peer]: obs has had Lost for this silence
	installAt []int  // per rank, the tick of its last install
	heardAt   []int  // [obs*n+peer]: the tick obs last got a message from peer
	lastAcc   []View // per rank, the accepted view last recorded

	installs   map[uint64]installRec
	acceptedBy map[string][]int  // view key → ranks that accepted it
	seen       []map[string]bool // per rank, the views it installed or accepted
	// everMajority: a majority of the initial view was alive and
	// connected at some time since the first fault.
	everMajority bool
	faulted      bool
	bad          []violation
}

func viewKey(v View) string {
	return fmt.Sprintf("%d%v%v%v", v.Epoch, v.Members, v.Joiners, v.Leavers)
}

func newSim(sc scenario) *sim {
	n := sc.n
	sc.at = slices.Clone(sc.at)
	s := &sim{sc: sc, n: n, installs: map[uint64]installRec{}, acceptedBy: map[string][]int{}}
	if sc.seed != 0 {
		s.rng = rand.New(rand.NewPCG(sc.seed, uint64(n)))
	}
	for i := range n {
		s.ids = append(s.ids, ID(fmt.Sprintf("r%d", i)))
	}
	s.initial = View{Epoch: 1, Members: slices.Clone(s.ids)}
	if sc.joiner {
		s.initial.Joiners = []ID{s.ids[n-1]}
	}
	if sc.leaver && n > 2 {
		s.initial.Leavers = []ID{s.ids[1]}
	}
	for i := range n {
		// Odd ranks committed iteration 8 before the fault, even ones only
		// 7: the winner rule matters, and rank 0 is behind.
		c := Commit{Epoch: 1, Iter: 7, Digest: 70}
		if i%2 == 1 {
			c = Commit{Epoch: 1, Iter: 8, Digest: 80}
		}
		if sc.joiner && i == n-1 {
			c = Commit{}
		}
		s.ranks = append(s.ranks, NewRank(s.ids[i], s.initial, c, DefaultConfig))
		s.seen = append(s.seen, map[string]bool{viewKey(s.initial): true})
	}
	s.crashed = make([]bool, n)
	s.frozenUntil = make([]int, n)
	s.cut = make([]bool, n*n)
	s.downSince = make([]int, n*n)
	for i := range s.downSince {
		s.downSince[i] = -1
	}
	s.told = make([]bool, n*n)
	s.installAt = make([]int, n)
	s.heardAt = make([]int, n*n)
	s.lastAcc = make([]View, n)
	return s
}

func (s *sim) fail(inv, format string, args ...any) {
	s.bad = append(s.bad, violation{inv, fmt.Sprintf(format, args...)})
}

func (s *sim) idx(id ID) int { return slices.Index(s.ids, id) }

func (s *sim) up(i int) bool { return !s.crashed[i] && s.frozenUntil[i] == 0 }

// hears reports whether j hears i now.
func (s *sim) hears(j, i int) bool { return s.up(i) && s.up(j) && !s.cut[i*s.n+j] }

func (s *sim) apply(f fault) {
	n := s.n
	switch f.kind {
	case crash:
		s.crashed[f.a] = true
	case freeze:
		if !s.crashed[f.a] {
			s.frozenUntil[f.a] = s.tick + freezeTicks
		}
	case cutBoth:
		s.cut[f.a*n+f.b], s.cut[f.b*n+f.a] = true, true
	case cutOne:
		s.cut[f.a*n+f.b] = true
	case partition:
		for i := range n {
			for j := range n {
				if (f.group>>i)&1 != (f.group>>j)&1 {
					s.cut[i*n+j] = true
				}
			}
		}
	}
	s.faulted = true
	s.lastChange = s.tick
	s.noteMajority()
}

// connectedMajority reports whether some set of live ranks, each pair
// hearing each other both ways, holds a majority of v.
func (s *sim) connectedMajority(v View) bool {
	return s.connectedMajorityOf(v, func(int) bool { return true })
}

// connectedMajorityOf is connectedMajority over the ranks in.
func (s *sim) connectedMajorityOf(v View, in func(i int) bool) bool {
	for set := uint(1); set < 1<<s.n; set++ {
		var ids []ID
		ok := true
		for i := range s.n {
			if set>>i&1 == 0 {
				continue
			}
			for j := range i {
				if set>>j&1 == 1 && !(s.hears(i, j) && s.hears(j, i)) {
					ok = false
				}
			}
			if !s.up(i) || !in(i) {
				ok = false
			}
			ids = append(ids, s.ids[i])
		}
		if ok && trueMajority(v, ids) {
			return true
		}
	}
	return false
}

// noteMajority records whether a majority of the initial view is alive
// and connected now; it is called whenever the network changes.
func (s *sim) noteMajority() {
	if s.connectedMajority(s.initial) {
		s.everMajority = true
	}
}

// trueMajority is View.Majority that no mutation switches off: the
// checker's own.
func trueMajority(v View, ids []ID) bool {
	voters := v.Voters()
	n := 0
	for _, m := range voters {
		if slices.Contains(ids, m) {
			n++
		}
	}
	return len(voters) > 0 && 2*n > len(voters)
}

// run plays the scenario to its end and returns the violations found.
func (s *sim) run() []violation {
	limit := s.sc.maxTick
	for {
		if s.nextFault < len(s.sc.faults) && s.sc.at[s.nextFault] <= s.steps {
			s.apply(s.sc.faults[s.nextFault])
			s.nextFault++
			continue
		}
		// Deliver what is due, one message per step.
		if k := s.nextDue(); k >= 0 {
			e := s.queue[k]
			s.queue = slices.Delete(s.queue, k, k+1)
			s.steps++
			if s.up(e.to) && !s.cut[e.from*s.n+e.to] {
				k := e.to*s.n + e.from
				s.told[k], s.heardAt[k] = false, s.tick
				s.step(e.to, Recv{From: s.ids[e.from], Msg: e.msg})
			}
			continue
		}
		if s.nextFault < len(s.sc.faults) && s.quietBut() {
			// Nothing moves, and nothing will: the next fault strikes now.
			// (Not merely an empty queue: right after a fault nothing is
			// in flight until the failure detector fires, and a fault
			// meant for the recovery's middle must wait for it.)
			s.sc.at[s.nextFault] = s.steps
			continue
		}
		bound := s.lastChange + endRounds(s.n)*DefaultConfig.RoundTicks
		if limit > 0 {
			bound = limit
		}
		if s.tick >= bound || s.nextFault == len(s.sc.faults) && s.quiet() {
			break
		}
		s.tick++
		s.advance()
	}
	s.checkEnd()
	return s.bad
}

// nextDue is the index of the next message to deliver, or -1. FIFO
// delivers in send order; a seeded run picks among the due ones.
func (s *sim) nextDue() int {
	var due []int
	for k, e := range s.queue {
		if e.due <= s.tick && s.frozenUntil[e.to] == 0 {
			if s.rng == nil {
				return k
			}
			due = append(due, k)
		}
	}
	if len(due) == 0 {
		return -1
	}
	return due[s.rng.IntN(len(due))]
}

func (s *sim) anyRecovering() bool {
	for i, r := range s.ranks {
		if s.up(i) && r.Recovering() {
			return true
		}
	}
	return false
}

// quietBut is quiet, but a frozen rank may stay frozen: the state in
// which a fault still to come can only strike next.
func (s *sim) quietBut() bool {
	frozen := slices.Clone(s.frozenUntil)
	clear(s.frozenUntil)
	defer copy(s.frozenUntil, frozen)
	return s.quiet()
}

// quiet reports that nothing can change any more: every live rank runs
// in a view and is not recovering, nothing is in flight, nobody is
// frozen, and the failure detector has had time to fire.
func (s *sim) quiet() bool {
	if len(s.queue) > 0 || s.tick <= s.lastChange+peerTimeout+1 {
		return false
	}
	for i, r := range s.ranks {
		if s.frozenUntil[i] != 0 || !s.crashed[i] && r.Recovering() {
			return false
		}
		if !s.crashed[i] && s.tick <= s.installAt[i]+peerTimeout+1 {
			return false
		}
	}
	return true
}

// advance runs one tick: frozen ranks whose time is up resume, the
// failure detector fires, and every running rank gets a Tick.
func (s *sim) advance() {
	n := s.n
	for i := range n {
		if s.frozenUntil[i] != 0 && s.tick >= s.frozenUntil[i] {
			s.frozenUntil[i] = 0
			s.lastChange = s.tick
			s.noteMajority()
		}
	}
	for o := range n {
		for p := range n {
			k := o*n + p
			if o == p || s.hears(o, p) || s.crashed[o] {
				if o != p && s.hears(o, p) {
					s.downSince[k], s.told[k] = -1, false
				}
				continue
			}
			if s.downSince[k] < 0 {
				s.downSince[k] = s.tick
			}
			if !s.up(o) || s.told[k] || !s.ranks[o].installed.Has(s.ids[p]) {
				continue
			}
			if s.tick-max(s.downSince[k], s.installAt[o], s.heardAt[k]) >= peerTimeout {
				s.told[k] = true
				s.step(o, Lost{Peer: s.ids[p]})
			}
		}
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	if s.rng != nil {
		s.rng.Shuffle(n, func(i, j int) { order[i], order[j] = order[j], order[i] })
	}
	for _, i := range order {
		if s.up(i) {
			s.step(i, Tick{})
		}
	}
}

// step feeds one input to rank i, queues what it sends and checks what it
// installs.
func (s *sim) step(i int, in Input) {
	r := s.ranks[i]
	before := r.Commit()
	outs := r.Step(in)
	if !r.accepted.Same(s.lastAcc[i]) {
		s.lastAcc[i] = r.accepted.Clone()
		s.noteAccepted(i, r.accepted)
	}
	for _, o := range outs {
		switch o := o.(type) {
		case Send:
			delay := 1
			if s.rng != nil {
				delay += s.rng.IntN(3)
			}
			to := s.idx(o.To)
			if to < 0 {
				s.fail("I2", "rank %d sent %T to unknown %q", i, o.Msg, o.To)
				continue
			}
			s.queue = append(s.queue, envelope{from: i, to: to, msg: o.Msg, due: s.tick + delay})
		case Installed:
			s.checkInstall(i, o, before)
			before = o.Winner.Commit
			s.seen[i][viewKey(o.View)] = true
			s.installAt[i] = s.tick
			s.lastChange = s.tick
			for p := range s.n {
				s.told[i*s.n+p] = false
			}
		}
	}
	if v := r.installed; v.Epoch > s.initial.Epoch {
		if w := s.installs[v.Epoch].winner; r.Commit() != w.Commit {
			s.fail("I3", "rank %d runs in epoch %d with commit %+v, not the winner's %+v", i, v.Epoch, r.Commit(), w.Commit)
		}
	}
}

func (s *sim) noteAccepted(i int, v View) {
	k := viewKey(v)
	if !slices.Contains(s.acceptedBy[k], i) {
		s.acceptedBy[k] = append(s.acceptedBy[k], i)
	}
	s.seen[i][k] = true
}

// checkInstall checks I1–I4 and I6 when rank i installs.
func (s *sim) checkInstall(i int, o Installed, before Commit) {
	v, e := o.View, o.View.Epoch
	if !v.Has(s.ids[i]) {
		s.fail("I1", "rank %d installed epoch %d without being a member: %v", i, e, v.Members)
	}
	if rec, ok := s.installs[e]; ok {
		if !rec.view.Same(v) || !slices.Equal(rec.lost, o.Lost) {
			s.fail("I1", "epoch %d installed as %v (lost %v) and as %v (lost %v) by rank %d", e, rec.view.Members, rec.lost, v.Members, o.Lost, i)
		}
		if rec.winner != o.Winner {
			s.fail("I3", "epoch %d installed with winners %+v and %+v", e, rec.winner, o.Winner)
		}
	} else {
		s.installs[e] = installRec{view: v, lost: o.Lost, winner: o.Winner}
	}
	pred := s.initial
	if e-1 > s.initial.Epoch {
		rec, ok := s.installs[e-1]
		if !ok {
			s.fail("I2", "rank %d installed epoch %d, but nobody installed epoch %d", i, e, e-1)
			return
		}
		pred = rec.view
	} else if e-1 < s.initial.Epoch {
		s.fail("I2", "rank %d installed epoch %d", i, e)
		return
	}
	if !s.seen[i][viewKey(pred)] {
		s.fail("I2", "rank %d installed epoch %d, but never installed or accepted its predecessor %v", i, e, pred.Members)
	}
	var acc []ID
	for _, a := range s.acceptedBy[viewKey(v)] {
		acc = append(acc, s.ids[a])
	}
	if !trueMajority(pred, acc) {
		s.fail("I6", "rank %d installed epoch %d %v, accepted only by %v of %v", i, e, v.Members, acc, pred.Voters())
	}
	if want := LostFrom(pred, v); !slices.Equal(o.Lost, want) {
		s.fail("I1", "rank %d names %v lost in epoch %d, not %v", i, o.Lost, e, want)
	}
	w := o.Winner.Commit
	if before.Cmp(w) > 0 || before.Cmp(w) == 0 && before.Digest != w.Digest {
		s.fail("I4", "rank %d rolled back from %+v to %+v installing epoch %d", i, before, w, e)
	}
	for _, m := range v.Members {
		j := s.idx(m)
		if c := s.ranks[j].Commit(); s.ranks[j].Installed().Epoch < e && c.Cmp(w) > 0 {
			s.fail("I4", "epoch %d starts from %+v, but member %d committed %+v", e, w, j, c)
		}
	}
	if prev, ok := s.installs[e-1]; ok && prev.winner.Commit.Cmp(w) > 0 {
		s.fail("I4", "epoch %d starts from %+v, before epoch %d's %+v", e, w, e-1, prev.winner.Commit)
	}
}

// checkEnd checks liveness once the run is over: the highest view
// installed is whole (every member alive, connected and running in it)
// unless no majority of its voters is alive and connected (I5); and
// nothing was installed if no majority of the initial view was ever
// alive and connected after the first fault (I6).
func (s *sim) checkEnd() {
	h := s.initial
	for e, rec := range s.installs {
		if e > h.Epoch {
			h = rec.view
		}
	}
	whole := true
	for _, m := range h.Members {
		i := s.idx(m)
		if !s.up(i) || s.ranks[i].Installed().Epoch != h.Epoch {
			whole = false
		}
		for _, p := range h.Members {
			if j := s.idx(p); i != j && !s.hears(i, j) {
				whole = false
			}
		}
	}
	// Progress is owed only to a majority that knows h: ranks that
	// installed it. Ranks that merely accepted it cannot tell it was
	// chosen unless their accepts prove it (Chosen), and must not guess.
	knows := func(i int) bool { return s.ranks[i].Installed().Epoch == h.Epoch }
	if !whole && s.connectedMajorityOf(h, knows) {
		var state []string
		for i, r := range s.ranks {
			acc, rd := r.Accepted()
			state = append(state, fmt.Sprintf("%d:up=%v inst=%d acc=%d@%v rec=%v", i, s.up(i), r.Installed().Epoch, acc.Epoch, rd, r.Recovering()))
		}
		s.fail("I5", "at tick %d a majority of epoch %d %v is alive and connected, but the view is not whole; %s", s.tick, h.Epoch, h.Members, strings.Join(state, ", "))
	}
	if s.faulted && !s.everMajority && len(s.installs) > 0 {
		s.fail("I6", "no majority was alive and connected after the first fault, yet epoch %d was installed", h.Epoch)
	}
}
