package gyre

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gyre-ml/gyre/internal/recovery"
	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/transport"
)

// Recovery from a lost worker (docs/recovery.md). The decisions are the
// pure recovery.Rank's; the recoverer (recoverer.go) feeds it messages,
// loss evidence from the heartbeats and ticks of a clock. This file runs
// the loop and acts on what the rank returns: it sends its messages, and
// when it installs a view it builds the view's communicators and brings
// every member the winning commit. Gossip is never evidence.

// recoverView runs recovery after a failure that lost a peer: it rolls
// this worker back to its commit, takes part in rounds until it installs
// a view and holds the winning commit, and returns the Change that says
// so, with Redo set. It gives up with ErrNoQuorum after QuorumTimeout.
func (w *Worker) recoverView(ctx context.Context, cause error) (Change, error) {
	rc := w.rec
	defer func() { rc.late = nil }() // evidence for this recovery only
	start := time.Now()
	old := w.cur
	// Nothing of the old view's collectives is read again: the new view
	// has a higher epoch, and its links are reopened (installRecovered).
	old.close()
	// A member that advanced past the boundary this worker failed runs the
	// next iteration's collectives and waits for this worker's part, which
	// never comes, with no evidence against it: it would wait out
	// CollectiveTimeout, deaf to the rounds. Closing this side's streams
	// of the old view ends its receive, so that it recovers too.
	w.reopenLinks(old)
	if err := w.rollBack(); err != nil {
		return Change{}, errors.Join(cause, err)
	}
	digest, err := w.state.Digest()
	if err != nil {
		return Change{}, errors.Join(cause, err)
	}
	own := recovery.Commit{Epoch: rc.commitEpoch, Iter: uint64(w.iter), Digest: digest}
	rc.rank.Committed(own)
	w.log.Warn().Err(cause).Uint64("epoch", old.view.Epoch).Int64("commit", w.iter).
		Msg("the view failed: recovering")

	// The quorum timer runs from the failure, and again from every view
	// installed but not started: an install proves a majority answered.
	quorum := time.NewTimer(w.cfg.QuorumTimeout)
	defer quorum.Stop()
	tick := time.NewTicker(recoveryTick(w.cfg))
	defer tick.Stop()
	var roundAt time.Time // when this worker entered its first round
	redialed := time.Now()
	rc.redial(old.recoveryView().Members)
	suspect := true
	for {
		inst := rc.rank.Installed()
		acc, _ := rc.rank.Accepted()
		rc.listen(append(inst.Members, acc.Members...))
		outs := rc.evidence()
		if suspect {
			// A round starts even if the heartbeats name nobody (a stream
			// broke, not a connection): the members that saw the same
			// failure then agree on a view of everyone. Evidence goes
			// first, so that a round it starts skips the lost.
			suspect = false
			outs = append(outs, rc.rank.Step(recovery.Suspect{})...)
		}
		select {
		case <-rc.wake:
			m, ok := rc.next()
			if !ok {
				continue
			}
			if in, ok := m.Msg.(recovery.Install); ok && recovery.Excluded(rc.rank.Self(), inst, in) {
				return w.rejoin(ctx, in, cause)
			}
			// A member of the installed view that missed its install is
			// the rank's to count in its round (onReport); only a rank
			// outside the view gets the bare answer.
			if in, ok := rc.rank.Stale(m.Msg); ok && !inst.Has(m.From) {
				rc.post(m.From, in)
				continue
			}
			if e := w.log.Debug(); e.Enabled() {
				e.Str("from", string(m.From)).Str("msg", fmt.Sprintf("%T %+v", m.Msg, m.Msg)).Msg("recovery: received")
			}
			outs = append(outs, rc.rank.Step(m)...)
		case <-tick.C:
			outs = append(outs, rc.rank.Step(recovery.Tick{})...)
			if time.Since(redialed) >= w.cfg.PeerTimeout {
				redialed = time.Now()
				rc.redial(append(inst.Members, acc.Members...))
			}
		case <-ctx.Done():
			return Change{}, fmt.Errorf("gyre: recovery from a lost member cancelled: %w (it began with: %w)", ctx.Err(), cause)
		case <-w.life.Done():
			return Change{}, ErrClosed
		case <-quorum.C:
			return Change{}, w.noQuorum(inst, cause)
		}
		if roundAt.IsZero() && rc.rank.Recovering() {
			roundAt = time.Now()
		}
		// Every message goes out first: a step can install one view and
		// accept the proposal of the next in one go (a view it had only
		// accepted is learned), and that Accept must not be lost.
		var installed *recovery.Installed
		for _, o := range outs {
			switch o := o.(type) {
			case recovery.Send:
				if e := w.log.Debug(); e.Enabled() {
					e.Str("to", string(o.To)).Str("msg", fmt.Sprintf("%T %+v", o.Msg, o.Msg)).Msg("recovery: sending")
				}
				rc.post(o.To, o.Msg)
				if _, ok := o.Msg.(recovery.Propose); ok && w.failAt.name == FailPropose {
					rc.drain(time.Second) // the proposal is out before the failpoint kills
					w.fail(FailPropose)
				}
			case recovery.Waiting:
				if len(o.Diverged) > 0 {
					return Change{}, fmt.Errorf("%w: the members %v hold the newest commit with different state digests; no copy can be trusted",
						ErrDiverged, o.Diverged)
				}
				w.log.Debug().Stringer("round", o.Round).Msg("a recovery round ended without a view; trying the next")
			case recovery.Installed:
				installed = &o
			}
		}
		// A view installed while the rank is already in a round for the
		// next one is only a step on the way: start the view that round
		// installs.
		if installed == nil || rc.rank.Recovering() {
			continue
		}
		o := *installed
		agreed, heard := time.Now(), w.lastHeardOf(o.Lost)
		if heard.IsZero() || heard.After(start) {
			heard = start // no heartbeat before the failure: count from it
		}
		if roundAt.IsZero() {
			roundAt = agreed // installed from a round others ran
		}
		// A member that missed the Install waits for it, and the install
		// waits for that member in the state transfer: answer its late
		// Accepts and calls meanwhile.
		stopAnswering := rc.answering(recoveryTick(w.cfg))
		ch, err := w.installRecovered(ctx, old, o)
		stopAnswering()
		if errors.Is(err, ErrDiverged) || errors.Is(err, ErrClosed) {
			return Change{}, err
		}
		if err != nil {
			w.log.Warn().Err(err).Uint64("epoch", o.View.Epoch).Msg("could not start the recovered view; recovering again")
			w.cur.close() // nothing of it runs while the rounds go on
			// The broadcast may have set the winner's state and iteration.
			if rerr := w.rollBack(); rerr != nil {
				return Change{}, errors.Join(err, rerr)
			}
			rc.rank.Committed(own)
			quorum.Reset(w.cfg.QuorumTimeout)
			continue
		}
		w.log.Warn().Strs("lost", ch.Lost).Uint64("old_epoch", old.view.Epoch).Strs("old_members", old.view.Members).
			Uint64("epoch", o.View.Epoch).Strs("members", ch.View.Members).Int64("iter", w.iter).
			Str("state_from", string(o.Winner.Holder)).
			Dur("detect", roundAt.Sub(heard)).Dur("agree", agreed.Sub(roundAt)).Dur("transfer", time.Since(agreed)).
			Dur("total", time.Since(heard)).
			Msg("recovered: the job goes on without the lost members")
		return ch, nil
	}
}

// lastHeardOf is when the latest heartbeat of the lost members arrived:
// for a killed worker, about when it died. The time since is the whole
// cost of the loss to this worker, detection included. Zero if none of
// them was watched.
func (w *Worker) lastHeardOf(lost []recovery.ID) time.Time {
	var last time.Time
	for _, id := range lost {
		if t := w.live.LastHeard(transport.PeerID(id)); t.After(last) {
			last = t
		}
	}
	return last
}

// noQuorum is the error of a recovery that found no majority.
func (w *Worker) noQuorum(v recovery.View, cause error) error {
	var reach, gone []string
	now := time.Now()
	voters := v.Voters()
	for _, m := range voters {
		p := transport.PeerID(m)
		switch {
		case p == transport.PeerID(w.cfg.Name):
			reach = append(reach, fmt.Sprintf("rank %d %s (this worker)", v.Rank(m), m))
		case w.silentAt(p, now):
			gone = append(gone, fmt.Sprintf("rank %d %s", v.Rank(m), m))
		default:
			reach = append(reach, fmt.Sprintf("rank %d %s", v.Rank(m), m))
		}
	}
	return fmt.Errorf("%w: this worker reaches %d of the %d voters of the view of epoch %d (%s) and needs %d; "+
		"it does not hear %s; it waited QuorumTimeout %v (--quorum-timeout) after: %w",
		ErrNoQuorum, len(reach), len(voters), v.Epoch, strings.Join(reach, ", "), len(voters)/2+1,
		strings.Join(gone, ", "), w.cfg.QuorumTimeout, cause)
}

// installRecovered starts the view a recovery installed: it builds its
// communicators over the old view's links, reopened so that no message
// cut off in the old view is waited on, and brings every member the
// winner's state, which each checks before committing it. Until then its
// own commit stays whole.
func (w *Worker) installRecovered(ctx context.Context, old *viewState, in recovery.Installed) (Change, error) {
	rc := w.rec
	rc.mu.Lock()
	members := make([]member, len(in.View.Members))
	for i, id := range in.View.Members {
		members[i] = member{ID: transport.PeerID(id), Addr: rc.addrs[transport.PeerID(id)]}
	}
	rc.mu.Unlock()
	holder := slices.IndexFunc(members, func(m member) bool { return m.ID == transport.PeerID(in.Winner.Holder) })
	if holder < 0 {
		return Change{}, fmt.Errorf("gyre: the state's holder %s is not in the recovered view", in.Winner.Holder)
	}
	var joiners []transport.PeerID
	for _, j := range in.View.Joiners {
		joiners = append(joiners, transport.PeerID(j))
	}
	// Equal shares until syncFits brings the holder's models (LB-BSP).
	err := w.installView(ctx, newView{epoch: in.View.Epoch, members: members, shares: EqualShares(w.cfg.GlobalBatch, len(members)),
		bandwidth: old.data.Bandwidth(), joiners: joiners, iter: w.iter, what: fmt.Sprintf("the recovered view of epoch %d", in.View.Epoch),
		sync: syncRecovered, root: holder, winner: in.Winner.Commit})
	if err != nil {
		return Change{}, err
	}
	vs := w.cur
	rc.commitEpoch = in.Winner.Commit.Epoch
	var dropped []transport.PeerID
	for _, id := range old.ids {
		if vs.rankOf(id) < 0 {
			dropped = append(dropped, id)
		}
	}
	w.forgetDropped(dropped)
	for _, s := range recovery.Notices(in) {
		rc.post(s.To, s.Msg)
	}
	// Lost is against the view this worker ran: a view installed by the
	// protocol but never started here (in.Lost's reference) dropped some.
	lost := make([]string, len(dropped))
	for i, id := range dropped {
		lost[i] = string(id)
	}
	return Change{Iter: w.iter, View: w.View(), ViewChanged: true, Shares: w.Shares(), SharesChanged: true,
		Redo: true, Lost: lost}, nil
}

// takeRecovered brings every member of the recovered view the winning
// commit from root, its holder, with its balance models, and checks it
// against what the holder reported before committing it.
func (w *Worker) takeRecovered(ctx context.Context, root int, want recovery.Commit) error {
	vs := w.cur
	holder := vs.ids[root]
	if err := w.confirm(ctx, w.syncState(ctx, root), root); err != nil {
		return err
	}
	// Only once every member confirmed the state: a member whose
	// transfer failed must not leave the others waiting in a broadcast.
	if w.cfg.Balance == BalanceLBBSP {
		if err := w.syncFits(ctx, root); err != nil {
			return err
		}
	}
	if want.Digest != 0 {
		if got, err := w.state.Digest(); err != nil || got != want.Digest {
			return fmt.Errorf("%w: the state rank %d (%s) sent does not match the digest it reported (%016x, got %016x, %v)",
				ErrDiverged, root, holder, want.Digest, got, err)
		}
	}
	if w.iter != int64(want.Iter) {
		return fmt.Errorf("%w: rank %d (%s) sent iteration %d, but reported %d", ErrDiverged, root, holder, w.iter, want.Iter)
	}
	return w.state.commit(w.iter)
}

// watchMembers returns a context that ends, with a lost-peer cause, when
// the heartbeats say a member of vs other than this worker is gone.
func (w *Worker) watchMembers(ctx context.Context, vs *viewState) (context.Context, func()) {
	wctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		tick := time.NewTicker(recoveryTick(w.cfg))
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-wctx.Done():
				return
			case <-tick.C:
			}
			for r, id := range vs.ids {
				if r != vs.rank && w.silent(id) {
					cancel(fmt.Errorf("rank %d (%s) of epoch %d fell silent for PeerTimeout %v: %w",
						r, id, vs.view.Epoch, w.cfg.PeerTimeout, transport.ErrPeerGone))
					return
				}
			}
		}
	}()
	return wctx, func() { close(done); cancel(nil) }
}

// silentCause is err, or the loss of a member that ended ctx with it.
func silentCause(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); err != nil && cause != nil && lostPeer(cause) {
		return fmt.Errorf("%w (%w)", cause, err)
	}
	return err
}

// recoverOr recovers from err if it lost a peer in a gossip view, or
// timed out on a late one (the round leaves out whoever does not answer),
// and otherwise returns it: a static view fails fast, and so do a closed
// worker and an ended context. A link abandoned after a failed send
// (ErrNotConnected) is a lost peer's too.
func (w *Worker) recoverOr(ctx context.Context, err error) (Change, error) {
	if w.rec == nil || w.closed.Load() || ctx.Err() != nil || !(lostPeer(err) || errors.Is(err, ring.ErrTimeout)) {
		return Change{}, err
	}
	return w.recoverView(ctx, err)
}

// lostPeer reports whether err is the loss of a peer: one a recovery, or
// a joiner's return to pending, can get over.
func lostPeer(err error) bool {
	return errors.Is(err, transport.ErrPeerGone) || errors.Is(err, transport.ErrNotConnected)
}

// reopenLinks closes this side's data and control streams to every other
// member of vs (transport.Reopener): the next send opens new ones, and a
// peer still reading the old ones sees them end.
func (w *Worker) reopenLinks(vs *viewState) {
	ro, ok := w.t.(transport.Reopener)
	if !ok {
		return
	}
	self := transport.PeerID(w.cfg.Name)
	for _, id := range vs.ids {
		if id != self {
			ro.Reopen(id, transport.ChanData)
			ro.Reopen(id, transport.ChanControl)
		}
	}
}
