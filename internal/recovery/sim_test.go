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
	// trainIters is how many iterations a whole view trains (and every
	// member commits) before the run lets it rest, so that runs end.
	trainIters = 2
	// lateTicks is the collective timeout: a member of a rank's view that
	// is alive and connected but does not run in it (it installed an older
	// view and missed every Install since) holds up its collectives, and
	// is then lost to it, as a late rank is.
	lateTicks = 2 * 30
)

// digest is the state digest after iteration it: training is
// deterministic, so equal iterations have equal digests.
func digest(it uint64) uint64 { return 10 * it }

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
	blip                       // the connection a-b breaks and is made again: what is in flight on it is lost, and both get the evidence
	abort                      // every live rank's collective fails with no evidence against anyone: each steps Suspect
	lateRank                   // a boundary's table shows a late past the collective timeout: the others get the evidence against it, and all suspect
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
	case blip:
		return fmt.Sprintf("blip %d-%d", f.a, f.b)
	case abort:
		return "abort"
	case lateRank:
		return fmt.Sprintf("late %d", f.a)
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

// blips lists every blip on n ranks, the abort, and every rank found
// late. Only random schedules draw them: a lost message is mended by the
// rounds, not by the order of faults.
func blips(n int) []fault {
	fs := []fault{{kind: abort}}
	for a := range n {
		fs = append(fs, fault{kind: lateRank, a: a})
	}
	for a := range n {
		for b := a + 1; b < n; b++ {
			fs = append(fs, fault{kind: blip, a: a, b: b})
		}
	}
	return fs
}

// scenario is one run: the initial view and commits, and when each fault
// strikes (before message step at, counting deliveries from the start).
//
// With boundary, the faults strike during a boundary's barrier: the
// initial view (epoch 1) decided the view of epoch 2 from its table,
// which drops the leaver (rank 1) or adds the joiner (the last rank, then
// pending: no member of epoch 1). Every member of epoch 1 holds the table
// (Decided); the ranks in advanced passed the barrier and run in epoch 2
// (Advanced), the others do not yet. The leaver leaves at once. With
// promote too, the joiner is a member of epoch 1 that holds the state and
// commit like the others, and the boundary moves to the same members at
// epoch 2 with no joiners, in which it votes.
type scenario struct {
	n        int
	joiner   bool // the last rank joined in the initial view (or, with boundary, joins at it)
	leaver   bool // rank 1 asked to leave in the initial view
	boundary bool
	promote  bool // with boundary and joiner: the boundary only makes the joiner a voter
	advanced uint // with boundary, bit i: rank i passed the barrier
	faults   []fault
	at       []int
	seed     uint64 // 0: FIFO delivery after one tick; else random order, delays and duplicates
	maxTick  int    // 0: the default bound
	resend   bool   // ranks send their round's message again every 5 ticks (Config.ResendTicks)
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
	if sc.promote {
		b.WriteString(" promote")
	}
	if sc.boundary {
		fmt.Fprintf(&b, " boundary advanced=%b", sc.advanced)
	}
	for i, f := range sc.faults {
		fmt.Fprintf(&b, ", %v at step %d", f, sc.at[i])
	}
	if sc.resend {
		b.WriteString(", resend")
	}
	if sc.seed != 0 {
		fmt.Fprintf(&b, ", seed %d", sc.seed)
	}
	return b.String()
}

// envelope is a message in flight, or, with train, a training
// iteration's commit on its way to rank to (its vote has reached to).
type envelope struct {
	from, to int
	msg      Msg
	due      int
	train    bool
	commit   Commit
}

type installRec struct {
	view   View
	lost   []ID
	winner Winner
	// barrier: only Advanced installed it so far, at the boundary; lost
	// is then unknown.
	barrier bool
}

// acceptKey is one accept: a round, a view and its winner.
type acceptKey struct {
	round  Round
	view   string
	winner Winner
}

// accState is the accept state of a rank, to tell its accepts apart.
type accState struct {
	view   View
	round  Round
	winner Winner
}

// maxRanks bounds a scenario's ranks: idx reads one digit, and advance
// and late keep per-rank arrays of this size.
const maxRanks = 8

// memberSet is a view's members as bits, and the Members slice they are of.
type memberSet struct {
	of  []ID
	set uint
}

// violation is an invariant that failed, with what shows it.
type violation struct {
	inv  string // "I1" … "I7"
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
	gone        []bool // left at the boundary, or stopped on diverged states: no fault, but down
	frozenUntil []int  // the tick a frozen rank resumes at; 0 if not frozen
	cut         []bool // cut[i*n+j]: j does not hear i
	queue       []envelope
	tick, steps int
	nextFault   int
	lastChange  int // the last tick a fault struck, a rank resumed or a view was installed

	downSince []int   // [obs*n+peer]: tick since peer is silent to obs; -1 if not
	told      []bool  // [obs*n+peer]: obs has had Lost for this silence
	backSince []int   // [obs*n+peer]: tick since obs hears peer again after a Lost; -1 if not
	touched   []bool  // per rank: a fault struck it (crash, freeze, a cut or blip of its links)
	lateSince []int   // [obs*n+peer]: tick since peer is late to obs; -1 if not
	installAt []int   // per rank, the tick of its last install
	heardAt   []int   // [obs*n+peer]: the tick obs last got a message from peer
	lastRound []Round // per rank, the accepted round last seen

	due        []int         // nextDue's buffer
	order      [maxRanks]int // advance's buffer
	memberSets []memberSet   // per rank, members' cache

	installs map[uint64]installRec
	top      uint64              // the highest epoch in installs
	accepts  map[acceptKey][]int // the ranks that accepted, per round, view and winner
	seen     []map[string]bool   // per rank, the views it installed or accepted
	// hadMajority[e]: since the view of epoch e was first installed (the
	// initial one: since the faults of step 0), a majority of its voters
	// was at some time alive and connected to one live rank both ways. A
	// view of epoch e+1 needs that, for its reports and accepts.
	hadMajority map[uint64]bool
	netDirty    bool // the network changed since hadMajority was updated

	// Training: trained[e] iterations were started in epoch e; pending[e]
	// of their commits are in flight.
	trained, pending map[uint64]int
	everCommit       map[Commit]bool      // every commit any rank held
	digestAt         map[[2]uint64]uint64 // (epoch, iter) → digest, over every commit held
	maxEver          []Commit             // per rank, the highest commit it held
	epochMax         []map[uint64]Commit  // per rank, per epoch: the highest commit it made running in it

	faulted bool
	bad     []violation
}

func viewKey(v View) string {
	return fmt.Sprintf("%d%v%v%v", v.Epoch, v.Members, v.Joiners, v.Leavers)
}

func newSim(sc scenario) *sim {
	n := sc.n
	if n > maxRanks {
		panic(fmt.Sprintf("the sim models up to %d ranks, not %d", maxRanks, n))
	}
	sc.at = slices.Clone(sc.at)
	s := &sim{sc: sc, n: n, installs: map[uint64]installRec{}, accepts: map[acceptKey][]int{},
		hadMajority: map[uint64]bool{}, trained: map[uint64]int{}, pending: map[uint64]int{},
		everCommit: map[Commit]bool{}, digestAt: map[[2]uint64]uint64{}}
	if sc.seed != 0 {
		s.rng = rand.New(rand.NewPCG(sc.seed, uint64(n)))
	}
	for i := range n {
		s.ids = append(s.ids, ID(fmt.Sprintf("r%d", i)))
	}
	pendingJoiner := sc.boundary && sc.joiner && !sc.promote
	s.initial = View{Epoch: 1, Members: slices.Clone(s.ids)}
	if pendingJoiner {
		s.initial.Members = s.initial.Members[:n-1]
	} else if sc.joiner {
		s.initial.Joiners = []ID{s.ids[n-1]}
	}
	if sc.leaver && n > 2 {
		s.initial.Leavers = []ID{s.ids[1]}
	}
	s.crashed = make([]bool, n)
	s.gone = make([]bool, n)
	s.frozenUntil = make([]int, n)
	s.cut = make([]bool, n*n)
	s.downSince = make([]int, n*n)
	for i := range s.downSince {
		s.downSince[i] = -1
	}
	s.told = make([]bool, n*n)
	s.backSince = make([]int, n*n)
	for i := range s.backSince {
		s.backSince[i] = -1
	}
	s.touched = make([]bool, n)
	s.lateSince = make([]int, n*n)
	for i := range s.lateSince {
		s.lateSince[i] = -1
	}
	s.installAt = make([]int, n)
	s.heardAt = make([]int, n*n)
	s.lastRound = make([]Round, n)
	s.memberSets = make([]memberSet, n)
	s.maxEver = make([]Commit, n)
	s.epochMax = make([]map[uint64]Commit, n)
	for i := range n {
		// Odd ranks committed iteration 8 before the fault, even ones only
		// 7: the winner rule matters, and rank 0 is behind. At a boundary
		// every member committed the same iteration.
		c := Commit{Epoch: 1, Iter: 7, Digest: digest(7)}
		if i%2 == 1 || sc.boundary {
			c = Commit{Epoch: 1, Iter: 8, Digest: digest(8)}
		}
		v := s.initial
		if sc.joiner && i == n-1 && !sc.promote {
			c = Commit{}
			if pendingJoiner {
				v = View{} // pending: no view, no table
			}
		}
		cfg := DefaultConfig
		if sc.resend {
			cfg.ResendTicks = 5
		}
		s.ranks = append(s.ranks, NewRank(s.ids[i], v, c, cfg))
		s.seen = append(s.seen, map[string]bool{viewKey(v): true})
		s.epochMax[i] = map[uint64]Commit{}
		s.noteCommit(i, c)
		s.lastRound[i] = s.ranks[i].acceptedRound
	}
	if sc.boundary {
		s.startBoundary()
		// Every member held the table: round 0's accepts were made with
		// every rank alive and connected.
		s.noteMajority()
	}
	return s
}

// startBoundary plays the boundary of a boundary scenario up to the
// faults: every member of epoch 1 decides the view of epoch 2 from the
// table, the advanced ones pass the barrier, and the leaver leaves.
func (s *sim) startBoundary() {
	next := View{Epoch: 2}
	for _, m := range s.ids {
		if s.initial.Has(m) && !slices.Contains(s.initial.Leavers, m) || !s.initial.Has(m) {
			next.Members = append(next.Members, m)
		}
	}
	if s.sc.joiner && !s.sc.promote {
		next.Joiners = []ID{s.ids[s.n-1]}
	}
	if !s.sc.promote && next.Same(View{Epoch: 2, Members: s.initial.Members}) {
		panic("a boundary scenario needs a joiner or a leaver")
	}
	holder := next.Voters()[0]
	for i, r := range s.ranks {
		if !s.initial.Has(s.ids[i]) {
			continue // the pending joiner holds no table
		}
		r.Decided(next)
		k := acceptKey{view: viewKey(next), winner: Winner{Holder: holder, Commit: r.Commit()}}
		s.accepts[k] = append(s.accepts[k], i)
		s.seen[i][viewKey(next)] = true
		s.lastRound[i] = s.ranks[i].acceptedRound
	}
	c := s.ranks[0].Commit()
	for i, r := range s.ranks {
		if s.sc.advanced>>i&1 == 0 || !next.Has(s.ids[i]) {
			continue
		}
		r.Advanced(next, c)
		s.noteCommit(i, c)
		s.seen[i][viewKey(next)] = true
		s.lastRound[i] = s.ranks[i].acceptedRound
		if _, ok := s.installs[2]; !ok {
			s.newInstall(2, installRec{view: next, winner: Winner{Holder: holder, Commit: c}, barrier: true})
		}
	}
	for i := range s.ranks {
		if s.initial.Has(s.ids[i]) && !next.Has(s.ids[i]) {
			s.gone[i] = true // the leaver: it holds the table, and goes
		}
	}
}

func (s *sim) accState(i int) accState {
	r := s.ranks[i]
	return accState{view: r.accepted, round: r.acceptedRound, winner: r.acceptedWinner}
}

// noteCommit records that rank i holds c, and checks that one iteration
// and epoch has one digest everywhere (I3) and that the rank never goes
// back (I4).
func (s *sim) noteCommit(i int, c Commit) {
	s.everCommit[c] = true
	k := [2]uint64{c.Epoch, c.Iter}
	if d, ok := s.digestAt[k]; ok && d != c.Digest {
		s.fail("I3", "commit of epoch %d iteration %d held with digests %d and %d (rank %d)", c.Epoch, c.Iter, d, c.Digest, i)
	} else if !ok {
		s.digestAt[k] = c.Digest
	}
	if c.Cmp(s.maxEver[i]) < 0 {
		s.fail("I4", "rank %d went back from %+v to %+v", i, s.maxEver[i], c)
	} else {
		s.maxEver[i] = c
	}
	e := s.ranks[i].installed.Epoch
	if m, ok := s.epochMax[i][e]; !ok || c.Cmp(m) > 0 {
		s.epochMax[i][e] = c
	}
}

func (s *sim) fail(inv, format string, args ...any) {
	s.bad = append(s.bad, violation{inv, fmt.Sprintf(format, args...)})
}

// newInstall records the first install of epoch e.
func (s *sim) newInstall(e uint64, rec installRec) {
	s.installs[e] = rec
	s.top = max(s.top, e)
}

// idx is id's rank, or -1. IDs are "r0" to "r7" (newSim): reading the
// digit is much faster than a search or a map, and the sim asks often.
func (s *sim) idx(id ID) int {
	if len(id) == 2 && id[0] == 'r' {
		if i := int(id[1] - '0'); i >= 0 && i < s.n && s.ids[i] == id {
			return i
		}
	}
	return -1
}

// members is the set of ranks in rank i's installed view, as bits. It is
// asked every tick for every pair: the set is kept until the rank
// installs, which gives it a new Members slice (a clone).
func (s *sim) members(i int) uint {
	m, c := s.ranks[i].installed.Members, &s.memberSets[i]
	if len(m) == len(c.of) && (len(m) == 0 || &m[0] == &c.of[0]) {
		return c.set
	}
	c.of, c.set = m, 0
	for _, id := range m {
		if j := s.idx(id); j >= 0 {
			c.set |= 1 << j
		}
	}
	return c.set
}

func (s *sim) up(i int) bool { return !s.crashed[i] && !s.gone[i] && s.frozenUntil[i] == 0 }

// hears reports whether j hears i now.
func (s *sim) hears(j, i int) bool { return s.up(i) && s.up(j) && !s.cut[i*s.n+j] }

// touch marks the ranks f strikes: all of them for a partition (each
// loses links), none for an abort, a and b for a link's faults, and a
// for the others.
func (s *sim) touch(f fault) {
	switch f.kind {
	case partition:
		for i := range s.n {
			s.touched[i] = true
		}
	case cutBoth, cutOne, blip:
		s.touched[f.a], s.touched[f.b] = true, true
	case abort: // every rank suspects, no evidence against anyone
	default:
		s.touched[f.a] = true
	}
}

// drop loses the messages in flight from a to b: their connection broke.
func (s *sim) drop(a, b int) {
	s.queue = slices.DeleteFunc(s.queue, func(e envelope) bool { return !e.train && e.from == a && e.to == b })
}

func (s *sim) apply(f fault) {
	n := s.n
	s.touch(f)
	switch f.kind {
	case crash:
		s.crashed[f.a] = true
		// Its connections break: what it sent and nobody read is lost.
		s.queue = slices.DeleteFunc(s.queue, func(e envelope) bool { return !e.train && e.from == f.a })
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
	case blip:
		s.drop(f.a, f.b)
		s.drop(f.b, f.a)
		s.noteMajority()
		for _, p := range [][2]int{{f.a, f.b}, {f.b, f.a}} {
			if s.up(p[0]) {
				s.step(p[0], Lost{Peer: s.ids[p[1]]})
			}
		}
	case abort:
		s.noteMajority()
		for i := range n {
			if s.up(i) {
				s.step(i, Suspect{})
			}
		}
	case lateRank:
		// As the runtime's lateRanks: every member judged the same table,
		// so each of the others counts a gone, and every member, a too,
		// enters recovery. a stays up and connected; it is left out, and
		// learns so.
		s.noteMajority()
		for i := range n {
			if !s.up(i) {
				continue
			}
			if i != f.a {
				s.step(i, Lost{Peer: s.ids[f.a]})
			}
			s.step(i, Suspect{})
		}
	}
	s.faulted = true
	s.lastChange = s.tick
	s.netDirty = true
}

// connectedMajorityOf reports whether some set of live ranks in in, each
// pair hearing each other both ways, holds a majority of v.
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

// starMajority reports whether some live rank and the live voters of v
// that hear it and that it hears, both ways, hold a majority of v: what
// a coordinator needs, at least, to gather reports and accepts.
func (s *sim) starMajority(v View) bool {
	for c := range s.n {
		if !s.up(c) {
			continue
		}
		ids := []ID{s.ids[c]}
		for j := range s.n {
			if j != c && s.hears(c, j) && s.hears(j, c) {
				ids = append(ids, s.ids[j])
			}
		}
		if trueMajority(v, ids) {
			return true
		}
	}
	return false
}

// noteMajority updates hadMajority for every view installed, with the
// network as it is now. It runs before anything moves after the network
// changed (so two faults of one step count as one change), and when a
// view is first installed.
func (s *sim) noteMajority() {
	s.netDirty = false
	if !s.hadMajority[s.initial.Epoch] && s.starMajority(s.initial) {
		s.hadMajority[s.initial.Epoch] = true
	}
	for e, rec := range s.installs {
		if !s.hadMajority[e] && s.starMajority(rec.view) {
			s.hadMajority[e] = true
		}
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
		if s.netDirty {
			s.noteMajority()
		}
		// Deliver what is due, one message per step.
		if k := s.nextDue(); k >= 0 {
			e := s.queue[k]
			s.queue = slices.Delete(s.queue, k, k+1)
			s.steps++
			if e.train {
				s.pending[e.commit.Epoch]--
				if r := s.ranks[e.to]; s.up(e.to) && r.installed.Epoch == e.commit.Epoch {
					r.Committed(e.commit)
					if c := r.Commit(); c == e.commit {
						s.noteCommit(e.to, c)
					}
				}
				continue
			}
			if s.up(e.to) && !s.cut[e.from*s.n+e.to] {
				k := e.to*s.n + e.from
				s.told[k], s.heardAt[k] = false, s.tick
				if r := s.ranks[e.to]; !r.Recovering() {
					// As the runtime does between rounds (answerStale): a
					// stale call or a late Accept gets the Install, and
					// is not stepped.
					if in, ok := r.Stale(e.msg); ok {
						s.queue = append(s.queue, envelope{from: e.to, to: e.from, msg: in, due: s.tick + 1})
						continue
					}
				}
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
	s.due = s.due[:0]
	for k, e := range s.queue {
		if e.due <= s.tick && s.frozenUntil[e.to] == 0 {
			if s.rng == nil {
				return k
			}
			s.due = append(s.due, k)
		}
	}
	if len(s.due) == 0 {
		return -1
	}
	return s.due[s.rng.IntN(len(s.due))]
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
// frozen, training is over, and the failure detector has had time to
// fire.
func (s *sim) quiet() bool {
	if len(s.queue) > 0 || s.tick <= s.lastChange+peerTimeout+1 {
		return false
	}
	for i, r := range s.ranks {
		if s.frozenUntil[i] != 0 || s.up(i) && r.Recovering() {
			return false
		}
		if s.up(i) && s.tick <= s.installAt[i]+peerTimeout+1 {
			return false
		}
	}
	for o, ro := range s.ranks {
		for p, rp := range s.ranks {
			if o != p && rp.installed.Epoch < ro.installed.Epoch && s.up(o) && s.up(p) && !ro.Recovering() && s.members(o)>>p&1 == 1 {
				return false // p is late: o will have evidence against it
			}
		}
	}
	_, ok := s.trainable()
	return !ok
}

// trainable returns the view that may start a training iteration now:
// the highest one installed, if it has iterations left, none in flight,
// and every member alive, connected both ways to every other, running
// in it with one commit, and not recovering.
func (s *sim) trainable() (View, bool) {
	h := s.installs[s.top].view
	if h.Epoch == 0 || s.trained[h.Epoch] >= trainIters || s.pending[h.Epoch] > 0 {
		return View{}, false
	}
	var c Commit
	for k, m := range h.Members {
		i := s.idx(m)
		r := s.ranks[i]
		if !s.up(i) || r.installed.Epoch != h.Epoch || r.Recovering() || k > 0 && r.Commit() != c {
			return View{}, false
		}
		c = r.Commit()
		for _, p := range h.Members[:k] {
			if j := s.idx(p); !s.hears(i, j) || !s.hears(j, i) {
				return View{}, false
			}
		}
	}
	return h, true
}

// train starts an iteration in the view that may train: its commit
// reaches each member as a step of its own, so a fault can strike with
// some members committed and others not, as when a rank crashes in the
// middle of a vote.
func (s *sim) train() {
	h, ok := s.trainable()
	if !ok {
		return
	}
	it := s.ranks[s.idx(h.Members[0])].Commit().Iter + 1
	c := Commit{Epoch: h.Epoch, Iter: it, Digest: digest(it)}
	s.trained[h.Epoch]++
	for _, m := range h.Members {
		delay := 1
		if s.rng != nil {
			delay += s.rng.IntN(3)
		}
		s.queue = append(s.queue, envelope{from: -1, to: s.idx(m), train: true, commit: c, due: s.tick + delay})
		s.pending[h.Epoch]++
	}
}

// advance runs one tick: frozen ranks whose time is up resume, the
// failure detector fires, every running rank gets a Tick, and a view
// that may train starts an iteration.
func (s *sim) advance() {
	n := s.n
	for i := range n {
		if s.frozenUntil[i] != 0 && s.tick >= s.frozenUntil[i] {
			s.frozenUntil[i] = 0
			s.lastChange = s.tick
			s.netDirty = true
		}
	}
	if s.netDirty {
		s.noteMajority()
	}
	// The loops below run every tick for every pair, so they read a
	// snapshot: stepping rank o changes only o's own liveness (a rank that
	// finds diverged states stops) and view, and they refresh it.
	var live [maxRanks]bool
	for i := range n {
		live[i] = s.up(i)
	}
	for o := range n {
		for p := range n {
			k := o*n + p
			if o == p {
				continue
			}
			if live[o] && live[p] && !s.cut[p*n+o] { // o hears p
				s.downSince[k] = -1
				if s.told[k] {
					// The evidence that p is back comes late, later to
					// some observers than to others, as heartbeats do over
					// links that timed out during a stop.
					if s.backSince[k] < 0 {
						s.backSince[k] = s.tick
					}
					if s.tick-s.backSince[k] >= heardLag(o, p) {
						s.told[k], s.backSince[k] = false, -1
						s.step(o, Heard{Peer: s.ids[p]})
						live[o] = s.up(o)
					}
				}
				continue
			}
			s.backSince[k] = -1
			if s.crashed[o] {
				continue
			}
			if s.downSince[k] < 0 {
				s.downSince[k] = s.tick
			}
			if !live[o] || s.told[k] || s.members(o)>>p&1 == 0 {
				continue
			}
			if s.tick-max(s.downSince[k], s.installAt[o], s.heardAt[k]) >= peerTimeout {
				s.told[k] = true
				s.step(o, Lost{Peer: s.ids[p]})
				live[o] = s.up(o)
			}
		}
	}
	s.late(&live)
	order := s.order[:n]
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
	s.train()
}

// runsIn reports whether rank u installed v or a later view, or accepted
// v: its report counts in a round whose reference is v.
func (s *sim) runsIn(u int, v View) bool {
	r := s.ranks[u]
	acc, _ := r.Accepted()
	return r.Installed().Epoch >= v.Epoch || acc.Same(v)
}

// heardLag is how many ticks after o hears p again o gets Heard: fixed per
// pair so that runs replay, unequal among observers, up to a few peer
// timeouts.
func heardLag(o, p int) int { return (7*o*o + 3*p) % (4 * peerTimeout) }

// late gives a rank that runs in a view, and is not recovering, the
// evidence against a member of it that is up but late: it still runs in
// an older view after lateTicks (the collective timeout). live is
// advance's snapshot of up, which it keeps current.
func (s *sim) late(live *[maxRanks]bool) {
	n := s.n
	var epoch [maxRanks]uint64 // the installed epochs, refreshed as live is
	for i, r := range s.ranks {
		epoch[i] = r.installed.Epoch
	}
	for o := range n {
		ro := s.ranks[o]
		for p := range n {
			k := o*n + p
			// The epochs first: they are almost always equal.
			if o == p || epoch[p] >= epoch[o] || !live[o] || !live[p] || ro.Recovering() || s.members(o)>>p&1 == 0 {
				s.lateSince[k] = -1
				continue
			}
			if s.lateSince[k] < 0 {
				s.lateSince[k] = max(s.tick, s.installAt[o])
			}
			if s.tick-s.lateSince[k] >= lateTicks {
				s.lateSince[k] = s.tick
				s.step(o, Lost{Peer: s.ids[p]})
				live[o], epoch[o] = s.up(o), ro.installed.Epoch
			}
		}
	}
}

// step feeds one input to rank i, queues what it sends and checks what it
// installs.
func (s *sim) step(i int, in Input) {
	if s.netDirty {
		s.noteMajority() // a view installed by the previous step counts from now
	}
	r := s.ranks[i]
	before := r.Commit()
	outs := r.Step(in)
	// An accept moves the accepted round (an install keeps it): record
	// who accepted what, in which round, before checking the installs.
	if r.acceptedRound != s.lastRound[i] {
		a := s.accState(i)
		k := acceptKey{round: a.round, view: viewKey(a.view), winner: a.winner}
		if !slices.Contains(s.accepts[k], i) {
			s.accepts[k] = append(s.accepts[k], i)
		}
		s.seen[i][viewKey(a.view)] = true
		s.lastRound[i] = a.round
	}
	for _, o := range outs {
		switch o := o.(type) {
		case Send:
			to := s.idx(o.To)
			if to < 0 {
				s.fail("I2", "rank %d sent %T to unknown %q", i, o.Msg, o.To)
				continue
			}
			copies := 1
			if s.rng != nil && s.rng.IntN(16) == 0 {
				copies = 2 // sent again before the first copy was answered
			}
			for c := range copies {
				delay := 1
				if s.rng != nil {
					delay += s.rng.IntN(3) + 2*c
				}
				s.queue = append(s.queue, envelope{from: i, to: to, msg: o.Msg, due: s.tick + delay})
			}
		case Installed:
			s.checkInstall(i, o, before)
			before = o.Winner.Commit
			s.seen[i][viewKey(o.View)] = true
			s.installAt[i] = s.tick
			s.lastChange = s.tick
			for p := range s.n {
				s.told[i*s.n+p] = false
			}
		case Waiting:
			if len(o.Diverged) > 0 {
				// The model trains deterministically: states never diverge.
				s.fail("I3", "rank %d found diverged states held by %v in round %v", i, o.Diverged, o.Round)
				s.gone[i] = true
			}
		}
	}
	if len(outs) > 0 {
		if in, ok := outs[len(outs)-1].(Installed); ok {
			if r.Commit() != in.Winner.Commit {
				s.fail("I3", "rank %d installed epoch %d with commit %+v, not the winner's %+v", i, in.View.Epoch, r.Commit(), in.Winner.Commit)
			}
			s.noteCommit(i, r.Commit())
		}
	}
}

// checkInstall checks I1–I4 and I6 when rank i installs.
func (s *sim) checkInstall(i int, o Installed, before Commit) {
	v, e := o.View, o.View.Epoch
	if !v.Has(s.ids[i]) {
		s.fail("I1", "rank %d installed epoch %d without being a member: %v", i, e, v.Members)
	}
	if rec, ok := s.installs[e]; ok {
		if !rec.view.Same(v) || !rec.barrier && !slices.Equal(rec.lost, o.Lost) {
			s.fail("I1", "epoch %d installed as %v (lost %v) and as %v (lost %v) by rank %d", e, rec.view.Members, rec.lost, v.Members, o.Lost, i)
		}
		if rec.winner != o.Winner {
			s.fail("I3", "epoch %d installed with winners %+v and %+v", e, rec.winner, o.Winner)
		}
		if rec.barrier {
			rec.lost, rec.barrier = o.Lost, false
			s.installs[e] = rec
		}
	} else {
		s.newInstall(e, installRec{view: v, lost: o.Lost, winner: o.Winner})
		s.netDirty = true // its majority is counted from now
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
	if !s.seen[i][viewKey(pred)] && !slices.Contains(v.Joiners, s.ids[i]) {
		s.fail("I2", "rank %d installed epoch %d, but never installed or accepted its predecessor %v", i, e, pred.Members)
	}
	// I6: the view was chosen: in one round, its acceptors with that
	// round's coordinator hold a majority of the predecessor's voters.
	// Installing is no accept: an installer counts only if it accepted.
	chosen := false
	var best []ID
	for k, ranks := range s.accepts {
		if k.view != viewKey(v) || k.winner != o.Winner {
			continue
		}
		acc := []ID{k.round.Coord}
		for _, a := range ranks {
			acc = append(acc, s.ids[a])
		}
		if trueMajority(pred, acc) {
			chosen = true
			break
		}
		if len(acc) > len(best) {
			best = acc
		}
	}
	if !chosen {
		s.fail("I6", "rank %d installed epoch %d %v (winner %+v), but no round's acceptors hold a majority of %v: at best %v", i, e, v.Members, o.Winner, pred.Voters(), best)
	}
	if !s.hadMajority[e-1] {
		s.fail("I6", "rank %d installed epoch %d, but no majority of epoch %d's voters %v was alive and connected since that view was installed", i, e, e-1, pred.Voters())
	}
	if want := LostFrom(pred, v); !slices.Equal(o.Lost, want) {
		s.fail("I1", "rank %d names %v lost in epoch %d, not %v", i, o.Lost, e, want)
	}
	// I7, minimal exclusion: a rank no fault struck, up, a voter of the
	// predecessor that is not leaving, and that installed or accepted
	// the predecessor (a rank still behind it at a boundary does not
	// vote from it), is in the view: everyone hears it, so only a peer's
	// evidence lagging could drop it. Checked where messages arrive in
	// order after one tick, and are sent again (resend): with random
	// delays, a coordinator may decide at CollectTicks before the report
	// of a rank with no evidence of its own arrived, and keeps only
	// reporters; without resends, a rank that ignored a call while its
	// evidence of the caller lagged is never called again.
	for u, id := range s.ids {
		if s.rng == nil && s.sc.resend && !s.touched[u] && s.up(u) && s.runsIn(u, pred) && slices.Contains(pred.Voters(), id) &&
			!slices.Contains(pred.Leavers, id) && !v.Has(id) {
			s.fail("I7", "rank %d installed epoch %d %v without rank %d, which no fault struck", i, e, v.Members, u)
		}
	}
	w := o.Winner.Commit
	if before.Cmp(w) > 0 || before.Cmp(w) == 0 && before.Digest != w.Digest {
		s.fail("I4", "rank %d rolled back from %+v to %+v installing epoch %d", i, before, w, e)
	}
	if !s.everCommit[w] || w.Epoch >= e {
		s.fail("I4", "epoch %d starts from %+v, which no rank committed before it", e, w)
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

// checkEnd checks, once the run is over, liveness (I5) and the final
// chain (I4). I5: the highest view installed is whole (every member
// alive, connected, running in it and no longer recovering) unless no
// majority of its voters that installed it is alive and connected. I4:
// along the chain of installed views, each starts from a commit at least
// its predecessor's, and at least every commit its members made in the
// predecessor; and no rank ends behind a commit it once held.
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
		if !s.up(i) || s.ranks[i].Installed().Epoch != h.Epoch || s.ranks[i].Recovering() {
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
		s.fail("I5", "at tick %d a majority of epoch %d %v is alive and connected, but the view is not whole and settled; %s", s.tick, h.Epoch, h.Members, strings.Join(state, ", "))
	}
	prev := installRec{view: s.initial}
	for e := s.initial.Epoch + 1; e <= h.Epoch; e++ {
		rec, ok := s.installs[e]
		if !ok {
			break // reported as I2 already
		}
		w := rec.winner.Commit
		if e-1 > s.initial.Epoch && w.Cmp(prev.winner.Commit) < 0 {
			s.fail("I4", "epoch %d starts from %+v, behind epoch %d's start %+v", e, w, e-1, prev.winner.Commit)
		}
		for _, m := range rec.view.Members {
			j := s.idx(m)
			if c, ok := s.epochMax[j][e-1]; ok && c.Cmp(w) > 0 {
				s.fail("I4", "epoch %d starts from %+v, but its member %d committed %+v in epoch %d", e, w, j, c, e-1)
			}
		}
		prev = rec
	}
	for i, r := range s.ranks {
		if r.Commit().Cmp(s.maxEver[i]) < 0 {
			s.fail("I4", "rank %d ends at %+v, behind its commit %+v", i, r.Commit(), s.maxEver[i])
		}
	}
}
