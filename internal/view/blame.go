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
// member whose heartbeat connection broke first; else the peer err
// names, unless that peer closed the link itself
// (transport.ErrClosedByPeer) or its heartbeats say it left v: it was
// alive, and left the collective. Then nobody is blamed. Liveness comes first
// because a crash is often seen through its consequences: a survivor that
// learned of it first and gave up closes its connections at once, so the
// peer err names may be that survivor, while the crashed member's silence
// takes PeerTimeout to show and its broken connections (a killed process's
// reset) came first. Every survivor blames the crashed one all the same.
func (v *View) Blame(live *liveness.Monitor, peerTimeout time.Duration, err error) (int, transport.PeerID, bool) {
	now, best, longest := time.Now(), -1, peerTimeout
	for r, id := range v.IDs {
		if r == v.Rank {
			continue
		}
		if silent := now.Sub(live.LastHeard(id)); silent > longest {
			best, longest = r, silent
		}
	}
	if best >= 0 {
		return best, v.IDs[best], true
	}
	time.Sleep(blameGrace) // every break of the moment has been seen
	var first time.Time
	for r, id := range v.IDs {
		if at, ok := live.Broken(id); ok && r != v.Rank && (best < 0 || at.Before(first)) {
			best, first = r, at
		}
	}
	if best >= 0 {
		return best, v.IDs[best], true
	}
	if p, ok := transport.PeerOf(err); ok && !errors.Is(err, transport.ErrClosedByPeer) && !v.left(live, p) {
		return v.RankOf(p), p, true
	}
	return -1, "", false
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
