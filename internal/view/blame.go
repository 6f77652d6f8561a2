package view

import (
	"errors"
	"time"

	"github.com/gyre-ml/gyre/liveness"
	"github.com/gyre-ml/gyre/transport"
)

// Blame names the member lost when err, a peer-gone failure, ended a
// collective of v: the member unheard for longest (live's heartbeats), if
// any has been silent past peerTimeout; else, after blameGrace, the
// member whose heartbeat connection was lost first (liveness.Monitor.Lost:
// broken other than by the member's own close); else the peer err names,
// unless that peer closed the link itself (transport.ErrClosedByPeer) or
// its heartbeats say it left v or it closed their connection itself: it
// was alive, and left the collective. Then nobody is blamed. Liveness
// comes first because a crash is often seen through its consequences: a
// survivor that learned of it first and gave up closes its connections at
// once, so the peer err names may be that survivor, while the crashed
// member's silence takes PeerTimeout to show and its broken connections
// (a killed process's reset) came first. A survivor's close is no
// evidence against it, however early: the crashed member's link may be
// one that shows nothing before its silence (a network link to a killed
// process, whose peers get no reset). Every survivor blames the crashed
// one all the same.
func (v *View) Blame(live *liveness.Monitor, peerTimeout time.Duration, err error) (int, transport.PeerID, bool) {
	if r := longestSilent(v.evidence(live, time.Now()), v.Rank, peerTimeout); r >= 0 {
		return r, v.IDs[r], true
	}
	time.Sleep(blameGrace) // every break of the moment has been seen
	named := -1
	if p, ok := transport.PeerOf(err); ok {
		named = v.RankOf(p)
	}
	r := blame(v.evidence(live, time.Now()), v.Rank, peerTimeout, named, errors.Is(err, transport.ErrClosedByPeer))
	if r < 0 {
		return -1, "", false
	}
	return r, v.IDs[r], true
}

// evidence is what the heartbeats say of one member when a collective
// failed.
type evidence struct {
	silent time.Duration // since it was last heard
	lost   time.Time     // when its heartbeat connection was lost (liveness.Monitor.Lost); zero if it was not
	// left: it closed its heartbeat connection itself (broken, not lost),
	// or its heartbeats say it left the view: alive, whatever its links
	// did.
	left bool
}

// evidence gathers what live says of each member of v at now.
func (v *View) evidence(live *liveness.Monitor, now time.Time) []evidence {
	ev := make([]evidence, len(v.IDs))
	for r, id := range v.IDs {
		if r == v.Rank {
			continue
		}
		e := &ev[r]
		e.silent = now.Sub(live.LastHeard(id))
		if at, ok := live.Lost(id); ok {
			e.lost = at
		}
		_, broken := live.Broken(id)
		e.left = v.left(live, id) || broken && e.lost.IsZero()
	}
	return ev
}

// longestSilent returns the member other than self silent for longest,
// if any has been past peerTimeout, or -1.
func longestSilent(ev []evidence, self int, peerTimeout time.Duration) int {
	best, longest := -1, peerTimeout
	for r, e := range ev {
		if r != self && e.silent > longest {
			best, longest = r, e.silent
		}
	}
	return best
}

// blame decides whom Blame names, from ev: the member silent for longest
// past peerTimeout; else the one whose heartbeat connection was lost
// first; else named, the member the collective's error names (-1: none),
// unless that error is its own close (closedByPeer) or its heartbeats say
// it left. It returns -1 for nobody.
func blame(ev []evidence, self int, peerTimeout time.Duration, named int, closedByPeer bool) int {
	if r := longestSilent(ev, self, peerTimeout); r >= 0 {
		return r
	}
	best := -1
	for r, e := range ev {
		if r != self && !e.lost.IsZero() && (best < 0 || e.lost.Before(ev[best].lost)) {
			best = r
		}
	}
	if best >= 0 {
		return best
	}
	if named >= 0 && named < len(ev) && named != self && !closedByPeer && !ev[named].left {
		return named
	}
	return -1
}

// left reports whether p's heartbeats say it saw v fail and left it
// (liveness.Progress.Left): alive, whatever its links did.
func (v *View) left(live *liveness.Monitor, p transport.PeerID) bool {
	pr, _, ok := live.Progress(p)
	return ok && pr.Left >= v.Epoch
}

// blameGrace is how long Blame waits for the heartbeat connections to
// report breaks that happened at the same moment as the one that ended the
// collective.
const blameGrace = 100 * time.Millisecond
