package recovery

import "slices"

// Config sets the rank's timeouts, in ticks.
type Config struct {
	// CollectTicks is how long a coordinator waits for the reports of
	// members it has no loss evidence for before it decides with those it
	// has.
	CollectTicks int
	// RoundTicks is how long a rank stays in one round before it starts
	// the next one with the next coordinator. It must cover a round's four
	// message delays, or rounds preempt each other for ever.
	RoundTicks int
	// ResendTicks, if not 0, is how often a rank in a round that has not
	// reached a proposal sends its round's message again: a participant
	// its Report to the coordinator, a coordinator its call to the members
	// that have not reported. A link that broke and came back (a healed
	// partition) loses what was in flight, and a rank cut off until then
	// would otherwise wait for the round's end to be heard.
	ResendTicks int
}

// DefaultConfig suits a network that delivers within 3 ticks. It sends
// nothing again: the exhaustive explorations keep their message steps few;
// random schedules turn resends on (scenario.resend).
var DefaultConfig = Config{CollectTicks: 7, RoundTicks: 30}

// Input is one of Recv, Lost, Heard, Tick and Suspect.
type Input interface{ input() }

// Recv is a message received from a peer.
type Recv struct {
	From ID
	Msg  Msg
}

// Lost is evidence that Peer is gone: heartbeat silence past the peer
// timeout, or a broken connection. Gossip is never evidence.
type Lost struct{ Peer ID }

// Tick is one unit of time.
type Tick struct{}

// Heard withdraws the evidence against Peer: its heartbeats are back (a
// link came back, a partition healed). Until a message of Peer's arrives,
// only this tells the rank that Peer hears it again.
type Heard struct{ Peer ID }

// Suspect says the runtime lost a peer that it has no evidence against:
// a collective, or the boundary's table, failed with a lost peer while
// every member's heartbeats still arrive (a stream broke, not the
// connection). A rank in no round starts one, so that the members, which
// saw the same failure, agree on a view even though nobody is gone; with
// everyone there, the view holds every member, at the next epoch.
type Suspect struct{}

func (Recv) input()    {}
func (Lost) input()    {}
func (Tick) input()    {}
func (Heard) input()   {}
func (Suspect) input() {}

// Output is one of Send, Installed and Waiting.
type Output interface{ output() }

// Send asks the runtime to send Msg to To.
type Send struct {
	To  ID
	Msg Msg
}

// Installed says the rank now runs in View: it drops the Lost ranks and
// takes Winner's state (keeping its own until the copy matches the
// digest).
type Installed struct {
	View   View
	Lost   []ID
	Winner Winner
}

// Waiting says a round ended without a view: no majority answered, or
// the coordinator never proposed. The rank tries the next round.
//
// If Diverged is not empty the wait is over for good: the coordinator
// found that these members hold one commit (one iteration and epoch) with
// different digests, so their states diverged and no copy can be trusted.
// The rank stops (Step does nothing more), and the runtime ends the job
// with ErrDiverged, as docs/recovery.md says. Without this the rank would
// try the same proposal round after round until QuorumTimeout, and fail
// with a misleading "no majority".
type Waiting struct {
	Round    Round
	Diverged []ID
}

func (Send) output()      {}
func (Installed) output() {}
func (Waiting) output()   {}

// Rank is one member's recovery state.
type Rank struct {
	cfg  Config
	self ID

	installed       View
	installedWinner Winner
	accepted        View // equals installed, or is of the next epoch
	acceptedRound   Round
	acceptedWinner  Winner
	// maxRound is the highest round the rank reported or accepted in: it
	// accepts no proposal of a lower round (Paxos's promise), and its next
	// round is numbered above it. It is not raised by every message seen,
	// as docs/recovery.md had it: then a rank that hears nobody, or that
	// others hear but that hears nobody (a one-way cut), and calls round
	// after round sets the numbers of everyone's rounds, and two ranks
	// that each start the round above the other's call each other for
	// ever (the simulator found both).
	maxRound Round
	commit   Commit
	lost     []ID // peers with loss evidence since the last install
	lostGen  int  // counts the changes of lost
	diverged bool // it reported diverged states: it does nothing more

	recovering bool
	round      Round // the round it takes part in
	waited     int   // ticks in round
	co         *coordination
	out        []Output
}

// coordination is the coordinator's state for its round.
type coordination struct {
	round   Round
	reports []Report
	ticks   int
	p       *Propose
	ref     View
	accepts []ID
	done    bool
	// decided is what the last decision saw (the reports, their reach
	// and the loss evidence); a tick decides again only if that changed.
	decided struct {
		final, settled             bool
		reports, reachGen, lostGen int
	}
	// reachGen counts the reports whose Reach a later copy changed; news
	// is ticks at the last change to what the round knows (a report, a
	// Reach, the coordinator's own evidence).
	reachGen, news int
}

// NewRank starts a rank that runs in view v with commit c.
func NewRank(self ID, v View, c Commit, cfg Config) *Rank {
	return &Rank{cfg: cfg, self: self, installed: v.Clone(), accepted: v.Clone(), commit: c}
}

// Self is the rank's ID.
func (r *Rank) Self() ID { return r.self }

// Installed is the view the rank runs in.
func (r *Rank) Installed() View { return r.installed.Clone() }

// Accepted is the view the rank accepted last, and in which round.
func (r *Rank) Accepted() (View, Round) { return r.accepted.Clone(), r.acceptedRound }

// Commit is the state the rank holds.
func (r *Rank) Commit() Commit { return r.commit }

// Recovering reports whether the rank takes part in a round.
func (r *Rank) Recovering() bool { return r.recovering }

// Step applies one input and returns what to send and what was installed.
func (r *Rank) Step(in Input) []Output {
	r.out = nil
	if r.diverged {
		return nil
	}
	switch in := in.(type) {
	case Lost:
		r.onLost(in.Peer)
	case Tick:
		r.onTick()
	case Suspect:
		if !r.recovering {
			r.startRound()
		}
	case Heard:
		if slices.Contains(r.lost, in.Peer) {
			r.lost = slices.DeleteFunc(r.lost, func(p ID) bool { return p == in.Peer })
			r.lostGen++
			r.decide(false) // now it waits for the peer's report
		}
	case Recv:
		// A message is a sign of life: the evidence it contradicts goes.
		// If the peer is still gone, the runtime gives new evidence.
		if slices.Contains(r.lost, in.From) {
			r.lost = slices.DeleteFunc(r.lost, func(p ID) bool { return p == in.From })
			r.lostGen++
		}
		switch m := in.Msg.(type) {
		case Report:
			r.onReport(in.From, m)
		case Propose:
			r.onPropose(m)
		case Accept:
			r.onAccept(in.From, m)
		case Install:
			r.onInstall(m)
		}
	}
	return r.out
}

func (r *Rank) send(to ID, m Msg) { r.out = append(r.out, Send{To: to, Msg: m}) }

// known reports whether m is a member of a view the rank runs in or
// accepted: only those may start or join its rounds.
func (r *Rank) known(m ID) bool { return r.installed.Has(m) || r.accepted.Has(m) }

func (r *Rank) onLost(p ID) {
	if p == r.self || !r.known(p) || slices.Contains(r.lost, p) {
		return
	}
	r.lost = append(r.lost, p)
	r.lostGen++
	if !r.recovering || p == r.round.Coord {
		r.startRound()
		return
	}
	// A coordinator waits for the reports of the members it hears: the
	// last it waited for may be this one. Without this it waited for
	// CollectTicks (CollectiveTimeout in the runtime, minutes) with a
	// majority's reports in hand.
	r.decide(false)
}

// startRound starts round MaxRound+1 with the coordinator that Coordinator
// picks from the installed view. Every rank that can vote holds the same
// installed view (the reference), so all that agree on the round number
// agree on its coordinator; a view only accepted is held by some ranks
// and not others, and picking from it split the ranks between two
// coordinators of one round number, for ever.
func (r *Rank) startRound() {
	n := r.maxRound.N + 1
	c, ok := Coordinator(r.installed, r.lost, n)
	if !ok {
		c = r.self
	}
	r.join(Round{N: n, Coord: c})
}

// join enters round rd: a participant reports to its coordinator, the
// coordinator calls every member it knows for reports.
func (r *Rank) join(rd Round) {
	r.maxRound, r.round, r.recovering, r.waited, r.co = rd, rd, true, 0, nil
	rep := r.report(rd)
	if rd.Coord != r.self {
		r.send(rd.Coord, rep)
		return
	}
	r.co = &coordination{round: rd, reports: []Report{rep}}
	for _, m := range r.installed.Members {
		if m != r.self {
			r.send(m, rep)
		}
	}
	for _, m := range r.accepted.Members {
		if m != r.self && !r.installed.Has(m) {
			r.send(m, rep)
		}
	}
	r.decide(false)
}

func (r *Rank) report(rd Round) Report {
	var reach []ID
	for _, v := range []View{r.installed, r.accepted} {
		for _, m := range v.Members {
			if m != r.self && !slices.Contains(r.lost, m) && !slices.Contains(reach, m) {
				reach = append(reach, m)
			}
		}
	}
	return Report{Round: rd, From: r.self, Reach: reach, Installed: r.installed.Clone(),
		Accepted: r.accepted.Clone(), AcceptedRound: r.acceptedRound, AcceptedWinner: r.acceptedWinner,
		Commit: r.commit}
}

func (r *Rank) onTick() {
	if !r.recovering {
		return
	}
	r.waited++
	if co := r.co; co != nil && co.p == nil {
		co.ticks++
		switch {
		case co.ticks >= r.cfg.CollectTicks:
			r.decide(true)
		case co.ticks-co.news == r.settleTicks():
			r.decide(false) // the evidence just settled (fresh)
		}
	}
	if k := r.cfg.ResendTicks; k > 0 && r.recovering && r.waited%k == 0 {
		r.resend()
	}
	if r.recovering && r.waited >= r.cfg.RoundTicks {
		r.out = append(r.out, Waiting{Round: r.round})
		r.startRound()
	}
}

// mayLeaveRound reports whether a rank in a round may answer call, the
// call of a higher round from from: the two hear each other (it has no
// evidence against from, and from's call says it reaches this rank). Two
// halves of a healed partition, each stuck in a round of its own (one
// perhaps with a proposal that can never gather a majority), meet this
// way in the higher of the two. Leaving is safe: what the rank accepted
// goes in its report, and the Paxos rule makes the new round's
// coordinator propose it again. A rank behind a one-way cut, which others
// hear but which does not hear them, pulls nobody into rounds it could
// never finish.
func (r *Rank) mayLeaveRound(from ID, call Report) bool {
	return !slices.Contains(r.lost, from) && slices.Contains(call.Reach, r.self)
}

// resend sends the round's message again: the Report, refreshed, to the
// coordinator, or once it accepted, its Accept (the coordinator may have
// installed, and its Install to this rank been lost: an installed rank
// answers a late Accept with the Install, Stale); or the coordinator's
// call to the members that have not reported, until it proposes.
// Duplicates are harmless: a coordinator counts one report and one
// accept per member, and a call of the round a rank is in changes
// nothing.
func (r *Rank) resend() {
	rep := r.report(r.round)
	co := r.co
	switch {
	case co == nil && r.acceptedRound != r.round:
		r.send(r.round.Coord, rep)
	case co == nil:
		r.send(r.round.Coord, Accept{Round: r.round, Epoch: r.accepted.Epoch})
	case co != nil && co.p == nil:
		for _, v := range []View{r.installed, r.accepted} {
			for _, m := range v.Members {
				if m != r.self && !slices.ContainsFunc(co.reports, func(o Report) bool { return o.From == m }) {
					r.send(m, rep)
				}
			}
		}
	}
}

func (r *Rank) onReport(from ID, m Report) {
	if !r.known(from) {
		return // an excluded rank: it rejoins as a new member
	}
	if m.Installed.Epoch < r.installed.Epoch && r.installed.Has(from) {
		// A member that missed our Install: it needs the view, not a round.
		r.send(from, Install{Round: m.Round, View: r.installed.Clone(), Winner: r.installedWinner})
		if !r.recovering {
			return
		}
		// But this rank is in a round, and must not lose a healthy member
		// from it. Once the Install arrives, the member holds our view and
		// its winner's commit, and has accepted nothing of the next epoch:
		// that is what it reports, in the round it reported in (its
		// promise). In another round, the coordinator calls it again; it
		// answers once it has installed, if that round is above its
		// promise.
		m = Report{Round: m.Round, From: from, Reach: m.Reach, Installed: r.installed.Clone(),
			Accepted: r.installed.Clone(), AcceptedWinner: r.installedWinner, Commit: r.installedWinner.Commit}
		if co := r.co; co != nil && co.p == nil && co.round != m.Round {
			r.send(from, co.reports[0])
		}
	}
	switch c := m.Round.Cmp(r.maxRound); {
	case c > 0 && m.Round.Coord == r.self:
		r.join(m.Round)
		r.co.reports = append(r.co.reports, m)
		r.decide(false)
	case c > 0 && m.Round.Coord == from && (!r.recovering || r.mayLeaveRound(from, m)):
		// A call for reports. A rank already in a round stays with it
		// while that round may finish: a rank that hears nobody calls for
		// ever, and must not pull the others out of rounds that can.
		r.join(m.Round)
	case c == 0 && r.co != nil && r.co.round == m.Round && r.co.p == nil:
		co := r.co
		i := slices.IndexFunc(co.reports, func(o Report) bool { return o.From == from })
		switch {
		case i < 0:
			co.reports = append(co.reports, m)
		case !slices.Equal(co.reports[i].Reach, m.Reach):
			// A resent report: its rank's evidence changed (it hears a
			// member again, or lost one). Only Reach can change within a
			// round; the rest is its promise.
			co.reports[i].Reach = slices.Clone(m.Reach)
			co.reachGen++
		default:
			return
		}
		co.news = co.ticks
		r.decide(false)
	}
}

// settleTicks is how long a round's evidence must not change before it
// counts as settled: two resends (a member that hears a peer again tells
// within one), or CollectTicks without resends.
func (r *Rank) settleTicks() int {
	if r.cfg.ResendTicks > 0 {
		return 2 * r.cfg.ResendTicks
	}
	return r.cfg.CollectTicks
}

// decide proposes once every member of the reference view that the
// coordinator hears has reported, or, if final, with what it has.
func (r *Rank) decide(final bool) {
	co := r.co
	if co == nil || co.p != nil {
		return
	}
	if r.lostGen != co.decided.lostGen {
		co.news = co.ticks
	}
	// Only once the round's evidence has settled may the greedy rule
	// drop a member all hear (fresh).
	settled := co.ticks-co.news >= r.settleTicks()
	if final && co.decided.final && co.decided.settled == settled && co.decided.reports == len(co.reports) &&
		co.decided.reachGen == co.reachGen && co.decided.lostGen == r.lostGen {
		return // nothing changed since the last final decision
	}
	co.decided.final, co.decided.settled, co.decided.reports = final, settled, len(co.reports)
	co.decided.reachGen, co.decided.lostGen = co.reachGen, r.lostGen
	// Its own report is refreshed: loss evidence may have come since.
	co.reports[0] = r.report(co.round)
	if !final {
		ref, _ := Reference(co.reports)
		for _, m := range ref.Members {
			if !slices.Contains(r.lost, m) && !slices.ContainsFunc(co.reports, func(o Report) bool { return o.From == m }) {
				return
			}
		}
	}
	if in, ok := Chosen(co.reports); ok && in.View.Has(r.self) {
		// The reports prove a view chosen: tell its members, as its
		// coordinator would have.
		co.done = true
		for _, m := range in.View.Members {
			if m != r.self {
				r.send(m, Install{Round: in.Round, View: in.View.Clone(), Winner: in.Winner})
			}
		}
		r.onInstall(in)
		return
	}
	p, to, ok := Plan(r.self, co.reports, settled)
	if !ok {
		if ds := Diverged(r.self, co.reports); len(ds) > 0 {
			// Terminal: waiting cannot mend diverged states.
			r.out = append(r.out, Waiting{Round: co.round, Diverged: ds})
			r.diverged, r.recovering, r.co = true, false, nil
		}
		return // a minority waits; the round times out
	}
	p.Round = co.round
	co.p = &p
	co.ref, _ = Reference(co.reports)
	for _, m := range to {
		if m != r.self {
			r.send(m, p)
		}
	}
	r.onPropose(p)
}

func (r *Rank) onPropose(m Propose) {
	if m.Round.Cmp(r.maxRound) < 0 {
		return
	}
	learn, ok := CanAccept(r.self, r.installed, r.accepted, m.Ref, m.View)
	if !ok {
		return
	}
	if learn {
		co := r.co // learning must not end the round it coordinates
		r.install(r.accepted, r.acceptedWinner)
		if m.Round.Coord == r.self {
			r.co, r.recovering = co, true
		}
	}
	if m.Round != r.round || !r.recovering {
		r.maxRound, r.round, r.recovering, r.waited = m.Round, m.Round, true, 0
		if m.Round.Coord != r.self {
			r.co = nil
		}
	}
	r.accepted, r.acceptedRound, r.acceptedWinner = m.View.Clone(), m.Round, m.Winner
	if mutate.installOnPropose && m.View.Has(r.self) {
		r.install(m.View, m.Winner)
	}
	a := Accept{Round: m.Round, Epoch: m.View.Epoch}
	if m.Round.Coord == r.self {
		r.onAccept(r.self, a)
	} else {
		r.send(m.Round.Coord, a)
	}
}

func (r *Rank) onAccept(from ID, m Accept) {
	co := r.co
	if co == nil || co.p == nil || co.done || co.round != m.Round || co.p.View.Epoch != m.Epoch ||
		slices.Contains(co.accepts, from) {
		return
	}
	co.accepts = append(co.accepts, from)
	if !co.ref.Majority(co.accepts) {
		return
	}
	co.done = true
	in := Install{Round: co.round, View: co.p.View, Winner: co.p.Winner}
	for _, m := range in.View.Members {
		if m != r.self {
			r.send(m, Install{Round: in.Round, View: in.View.Clone(), Winner: in.Winner})
		}
	}
	r.onInstall(in)
}

func (r *Rank) onInstall(m Install) {
	if m.View.Epoch > r.installed.Epoch && m.View.Has(r.self) {
		r.install(m.View, m.Winner)
	}
}

// install starts running in v from w's state. The lost ranks are those
// of the view it came from: the accepted one if that is v's predecessor.
func (r *Rank) install(v View, w Winner) {
	prev := r.installed
	if r.accepted.Epoch+1 == v.Epoch {
		prev = r.accepted
	}
	r.installed, r.installedWinner = v.Clone(), w
	r.accepted, r.acceptedWinner = v.Clone(), w
	r.commit = w.Commit
	r.recovering, r.co, r.lost = false, nil, nil
	r.lostGen++
	r.out = append(r.out, Installed{View: v.Clone(), Lost: LostFrom(prev, v), Winner: w})
}

// Committed records the state the rank now holds: a Commit after a
// boundary, or its own commit again after a state transfer failed. A
// rank in a round keeps the commit it reported.
func (r *Rank) Committed(c Commit) {
	if !r.recovering {
		r.commit = c
	}
}

// Decided records that a boundary decided view v, of the next epoch,
// from a table this rank holds: round 0's accept. Until the boundary's
// barrier ends (Advanced), a recovery reports v as accepted, and its
// coordinator re-proposes it, since every member may hold the table.
func (r *Rank) Decided(v View) {
	if v.Epoch != r.installed.Epoch+1 || r.recovering {
		return
	}
	r.accepted, r.acceptedRound, r.acceptedWinner = v.Clone(), Round{}, r.boundaryWinner(v, r.commit)
}

// boundaryWinner is the winner of a boundary's view v: every voter of v
// held commit c at the boundary, and the lowest sends it. Every rank
// computes the same, so a re-proposal of v (from Decided) and a catch-up
// Install of it (after Advanced) carry one value.
func (r *Rank) boundaryWinner(v View, c Commit) Winner {
	holder := r.self
	if vs := v.Voters(); len(vs) > 0 {
		holder = vs[0]
	}
	return Winner{Holder: holder, Commit: c}
}

// Advanced records that the rank started running in v at a boundary:
// the barrier after the table proved every member accepted it. c is the
// commit it holds.
func (r *Rank) Advanced(v View, c Commit) {
	r.installed, r.installedWinner = v.Clone(), r.boundaryWinner(v, c)
	r.accepted, r.acceptedRound, r.acceptedWinner = v.Clone(), Round{}, r.installedWinner
	r.commit, r.recovering, r.co, r.lost = c, false, nil, nil
	r.lostGen++
}
