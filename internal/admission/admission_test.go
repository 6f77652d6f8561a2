package admission

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/internal/vote"
	"github.com/gyre-ml/gyre/transport"
)

var errCut = errors.New("cut")

func TestJoinerLinkEvents(t *testing.T) {
	misfitBatch := &Misfit{What: "setting GlobalBatch (--batch)", Joiner: "48", Job: "24"}
	for _, tc := range []struct {
		name   string
		events func(l *joinerLink)
		want   bool
	}{
		{"nothing yet", func(l *joinerLink) {}, false},
		{"dialled only", func(l *joinerLink) { l.onDial(nil) }, false},
		{"heard only", func(l *joinerLink) { l.onRequest(nil) }, false},
		{"both, unanswered", func(l *joinerLink) { l.onDial(nil); l.onRequest(nil) }, false},
		{"handshake done", func(l *joinerLink) { l.onDial(nil); l.onRequest(nil); l.onAnswer(nil) }, true},
		{"heard before dialled", func(l *joinerLink) { l.onRequest(nil); l.onDial(nil); l.onAnswer(nil) }, true},
		{"answer lost", func(l *joinerLink) { l.onDial(nil); l.onRequest(nil); l.onAnswer(errCut) }, false},
		{"answer lost, redialled, answered", func(l *joinerLink) {
			l.onDial(nil)
			l.onRequest(nil)
			l.onAnswer(errCut)
			l.onDial(nil)
			l.onAnswer(nil)
		}, true},
		{"receive broke", func(l *joinerLink) {
			l.onDial(nil)
			l.onRequest(nil)
			l.onAnswer(nil)
			l.onRecvBroken(errCut)
		}, false},
		{"receive broke, heard again", func(l *joinerLink) {
			l.onDial(nil)
			l.onRequest(nil)
			l.onAnswer(nil)
			l.onRecvBroken(errCut)
			l.onRequest(nil)
			l.onAnswer(nil)
		}, true},
		{"a repeat keeps it listed", func(l *joinerLink) {
			l.onDial(nil)
			l.onRequest(nil)
			l.onAnswer(nil)
			l.onRequest(nil)
		}, true},
		{"Misfit", func(l *joinerLink) { l.onDial(nil); l.onRequest(misfitBatch); l.onAnswer(nil) }, false},
		{"Misfit, then fits: waits for the answer", func(l *joinerLink) {
			l.onDial(nil)
			l.onRequest(misfitBatch)
			l.onAnswer(nil)
			l.onRequest(nil)
		}, false},
		{"dial failed", func(l *joinerLink) { l.onDial(errCut); l.onRequest(nil) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l joinerLink
			tc.events(&l)
			if got := l.listable(); got != tc.want {
				t.Fatalf("listable = %v, want %v (%+v): %s", got, tc.want, l, l.missing())
			}
		})
	}
}

// simPair is the network between one member and one joiner in the
// admission simulator: each direction works or is cut for good, and the
// joiner fits the job or not.
type simPair struct {
	toJoiner, toMember bool // member→joiner and joiner→member work
	link               joinerLink
	requests           int // requests sent by the joiner, not yet heard
	// What the simulator knows happened, kept apart from link: the last
	// dial succeeded and no send failed since (up), a request was heard
	// since the last broken receive (heard), an answer went out since
	// the joiner was last heard afresh (answered).
	up, heard, answered bool
}

// TestAdmissionSimulation drives the members' handshake state, joinerLink,
// through random interleavings of the handshake's I/O with faults at
// every step: directions cut for good, dials and sends that fail once,
// receives that break, requests that repeat. After every step the members
// vote with the joiners they may list, and decideView must admit only
// joiners that fit and that every member reaches both ways. Once the
// transient faults stop, every joiner that fits and is reachable is
// admitted.
func TestAdmissionSimulation(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 300 {
		nm, nj := 1+rng.IntN(4), 1+rng.IntN(4)
		view := testMembers(func() []string {
			var a []string
			for i := range nm {
				a = append(a, fmt.Sprintf("10.0.0.%d:7000", i+1))
			}
			return a
		}()...)
		joiners := make([]vote.Member, nj)
		fits := make([]bool, nj)
		for j := range joiners {
			joiners[j] = vote.Member{ID: transport.PeerID(fmt.Sprintf("j%d", j)), Addr: fmt.Sprintf("10.0.1.%d:7000", j+1)}
			fits[j] = rng.IntN(5) > 0
		}
		pairs := make([][]simPair, nm)
		for m := range pairs {
			pairs[m] = make([]simPair, nj)
			for j := range pairs[m] {
				pairs[m][j] = simPair{toJoiner: rng.IntN(6) > 0, toMember: rng.IntN(6) > 0}
			}
		}
		reachable := func(j int) bool {
			for m := range pairs {
				if !pairs[m][j].toJoiner || !pairs[m][j].toMember {
					return false
				}
			}
			return true
		}
		check := func(step int) []vote.Member {
			t.Helper()
			ws := workersOf(view)
			for m := range ws {
				for j := range joiners {
					p := pairs[m][j]
					if !p.link.listable() {
						continue
					}
					if !p.up || !p.heard || !p.answered || !fits[j] {
						t.Fatalf("trial %d step %d: member %d lists joiner %d with link up %v, heard %v, answered %v, fits %v",
							trial, step, m, j, p.up, p.heard, p.answered, fits[j])
					}
					ws[m].pending = append(ws[m].pending, joiners[j])
				}
			}
			d, err := simBoundary(t, view, ws)
			if err != nil {
				t.Fatalf("trial %d step %d: %v", trial, step, err)
			}
			for _, a := range d.Admitted {
				j := slices.Index(joiners, a)
				if !fits[j] || !reachable(j) {
					t.Fatalf("trial %d step %d: admitted %s, which fits=%v reachable=%v", trial, step, a.ID, fits[j], reachable(j))
				}
			}
			return d.Admitted
		}
		steps := 50 + rng.IntN(150)
		for step := range steps + 200 {
			faults := step < steps // the transient faults stop after steps
			m, j := rng.IntN(nm), rng.IntN(nj)
			p := &pairs[m][j]
			var verdict *Misfit
			if !fits[j] {
				verdict = &Misfit{What: "setting GlobalBatch (--batch)", Joiner: "1", Job: "2"}
			}
			switch rng.IntN(6) {
			case 0: // the member dials when it has no link
				if !p.link.dialled {
					p.up = p.toJoiner && !(faults && rng.IntN(3) == 0)
					if p.up {
						p.link.onDial(nil)
					} else {
						p.link.onDial(errCut)
						p.answered = false
					}
				}
			case 1: // the joiner sends a request (again every joinResend)
				if p.toMember {
					p.requests++
				}
			case 2: // the member hears one
				if p.requests > 0 {
					p.requests--
					if !p.heard {
						p.answered = false
					}
					p.heard = true
					p.link.onRequest(verdict)
				}
			case 3: // the member answers what it owes
				if p.link.owesAnswer() {
					if !p.toJoiner || faults && rng.IntN(3) == 0 {
						p.link.onAnswer(errCut)
						p.up, p.answered = false, false
					} else {
						p.link.onAnswer(nil)
						p.answered = true
					}
				}
			case 4: // a receive breaks
				if faults && rng.IntN(4) == 0 {
					p.link.onRecvBroken(errCut)
					p.requests, p.heard, p.answered = 0, false, false
				}
			case 5: // the member asks for the request; the joiner answers with one
				if p.link.dialled && !p.link.heard {
					now := p.link.since.Add(time.Duration(step+1) * joinResend)
					if !p.toJoiner || faults && rng.IntN(3) == 0 {
						p.link.onNudge(now, errCut)
						p.up, p.answered = false, false
					} else {
						p.link.onNudge(now, nil)
						if p.toMember {
							p.requests++
						}
					}
				}
			}
			check(step)
		}
		// Fault-free: play every handshake out.
		for m := range pairs {
			for j := range pairs[m] {
				p := &pairs[m][j]
				if !p.toJoiner || !p.toMember {
					continue
				}
				if !p.link.dialled {
					p.link.onDial(nil)
				}
				verdict := (*Misfit)(nil)
				if !fits[j] {
					verdict = &Misfit{What: "x", Joiner: "1", Job: "2"}
				}
				p.link.onRequest(verdict)
				p.link.onAnswer(nil)
				p.up, p.heard, p.answered = true, true, true
			}
		}
		admitted := check(-1)
		for j := range joiners {
			if want := fits[j] && reachable(j); want != slices.Contains(admitted, joiners[j]) {
				t.Fatalf("trial %d: joiner %d (fits %v, reachable %v) admitted %v", trial, j, fits[j], reachable(j), !want)
			}
		}
	}
}

// TestNudgeDue: a member asks for the request once it can send and has
// heard nothing for joinResend, since the handshake began or it last
// asked; a failed ask drops the link.
func TestNudgeDue(t *testing.T) {
	t0 := time.Unix(100, 0)
	l := joinerLink{since: t0}
	if l.nudgeDue(t0.Add(time.Hour)) {
		t.Fatal("a nudge is due before the member could dial")
	}
	l.onDial(nil)
	if l.nudgeDue(t0.Add(joinResend - time.Millisecond)) {
		t.Fatal("a nudge is due before joinResend passed")
	}
	at := t0.Add(joinResend)
	if !l.nudgeDue(at) {
		t.Fatal("no nudge due after joinResend")
	}
	l.onNudge(at, nil)
	if l.nudgeDue(at.Add(joinResend/2)) || !l.nudgeDue(at.Add(joinResend)) {
		t.Fatal("nudges are not paced by joinResend")
	}
	l.onNudge(at.Add(joinResend), errCut)
	if l.dialled || l.nudgeDue(at.Add(time.Hour)) {
		t.Fatalf("a failed nudge left the link up: %+v", l)
	}
	l.onDial(nil)
	l.onRequest(nil)
	if l.nudgeDue(at.Add(time.Hour)) {
		t.Fatal("a nudge is due although the request was heard")
	}
}

func testMembers(addrs ...string) []vote.Member {
	out := make([]vote.Member, len(addrs))
	for i, a := range addrs {
		out[i] = vote.Member{ID: transport.PeerID("w" + a), Addr: a}
	}
	return out
}

// simWorker is what one member may list at a boundary.
type simWorker struct{ pending []vote.Member }

func workersOf(view []vote.Member) []simWorker { return make([]simWorker, len(view)) }

// simBoundary builds every member's record from what it may list, runs
// vote.DecideView on each member's copy of the table, and checks that all
// decide alike.
func simBoundary(t *testing.T, view []vote.Member, ws []simWorker) (vote.ViewDecision, error) {
	t.Helper()
	recs := make([]vote.Record, len(ws))
	knowns := make([]map[uint64]vote.Member, len(ws))
	for r, w := range ws {
		recs[r] = vote.Record{Kind: vote.KindBoundary, MinWorkers: 1, Joiners: vote.ListJoiners(w.pending, 7)}
		knowns[r] = map[uint64]vote.Member{}
		for _, m := range w.pending {
			knowns[r][vote.JoinerHash(m)] = m
		}
	}
	var first vote.ViewDecision
	var firstErr error
	for r := range ws {
		d, err := vote.DecideView(7, view, recs, knowns[r], 0, 256)
		if r == 0 {
			first, firstErr = d, err
			continue
		}
		if !reflect.DeepEqual(d, first) || fmt.Sprint(err) != fmt.Sprint(firstErr) {
			t.Fatalf("rank %d decided %+v, %v; rank 0 %+v, %v", r, d, err, first, firstErr)
		}
	}
	return first, firstErr
}
