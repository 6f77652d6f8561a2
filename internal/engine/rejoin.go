package engine

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/gyre-ml/gyre/internal/recovery"
	"github.com/gyre-ml/gyre/transport"
)

// Rejoining: a worker that a recovery left out, or a joiner whose
// admission lost a member, forgets its old links and goes back to
// pending, to be admitted as a new member (docs/recovery.md,
// "Rejoining").

// forgetDropped drops the transport's records of the members a recovery
// left out (the lost, and joiners it dropped), so that nothing of theirs
// from the old view is read again: one that comes back dials afresh, and
// is admitted as a new member. It keeps listening for their calls from
// the old view, to tell them they are out.
func (e *Engine) forgetDropped(dropped []transport.PeerID) {
	e.links.Forget(dropped)
	for _, p := range dropped {
		e.adm.Reset(p)
	}
	e.rec.Formers(dropped)
}

// leftOutBecause says why the job may have recovered without this
// worker, given its own longest stall since the last boundary (0 if none
// passed the peer timeout): a worker that never stalled is not told it
// was stopped.
func leftOutBecause(stalled, peerTimeout time.Duration) string {
	if stalled > 0 {
		return fmt.Sprintf("(it was stopped or starved of CPU for %v, longer than PeerTimeout %v)", stalled.Round(time.Millisecond), peerTimeout)
	}
	return fmt.Sprintf("(it did not stall; the others stopped hearing it for PeerTimeout %v, or a majority formed without it: check the links between the workers)", peerTimeout)
}

// rejoin brings back a worker the others recovered without, as a new
// member: in is the Install of the view that left it out. Its own commits
// are dropped: it takes the job's state, as any joiner does (joinAnew).
func (e *Engine) rejoin(ctx context.Context, in recovery.Install, cause error) (Change, error) {
	start := time.Now()
	e.log.Warn().Uint64("epoch", in.View.Epoch).Int("world", len(in.View.Members)).
		Msg("the job recovered without this worker " + leftOutBecause(e.selfStall().Unresponsive, e.cfg.PeerTimeout) + "; rejoining as a new member")
	// Gossip may have declared the members dead while this worker was
	// cut off, and they it; memberlist never looks again by itself.
	ch, err := e.joinAnew(ctx, start, true)
	if err != nil {
		return Change{}, fmt.Errorf("gyre: rejoining the job after it recovered without this worker: %w (it was left out after: %w)", err, cause)
	}
	return ch, nil
}

// joinAnew makes this worker, out of its view, a new member of the job:
// it forgets every old link, goes back to pending in gossip (joining
// gossip again through its old view's members with regossip), and waits
// up to JoinTimeout to be admitted at a boundary, as a joiner.
func (e *Engine) joinAnew(ctx context.Context, start time.Time, regossip bool) (Change, error) {
	rc := e.rec
	old := rc.Known()
	rc.ClearInbox()
	// The joiners this worker was admitting, as a member, may be members
	// now of the view it joins: what it sent them as a member must not be
	// read as its requests as a joiner.
	e.backToPending(append(slices.Clone(old), e.adm.Joiners()...))
	// The member side of admission restarts with the new view.
	e.adm.Close()
	e.adm = nil
	// Close ends the wait too, as it ends every other call.
	ctx, stopLife := context.WithCancel(ctx)
	defer stopLife()
	stopOnClose := context.AfterFunc(e.life, stopLife)
	defer stopOnClose()
	jctx, cancel := context.WithTimeoutCause(ctx, e.cfg.JoinTimeout,
		fmt.Errorf("%w (%v, --join-timeout): %w", errJoinTimedOut, e.cfg.JoinTimeout, context.DeadlineExceeded))
	defer cancel()
	stopGossip := func() {}
	if regossip {
		stopGossip = e.gossip.Regossip(jctx, old)
	}
	_, err := e.admitted(jctx, start, false)
	stopGossip()
	if err != nil {
		return Change{}, err
	}
	e.startAdmissions()
	v := e.cur
	rc.Reset(recoveryView(v), e.commitOf(v.Epoch), v.Members)
	return Change{Iter: e.it.iter, View: e.View(), ViewChanged: true, Shares: e.Shares(), SharesChanged: true, Redo: true,
		Admitted: []string{e.cfg.Name}}, nil
}
