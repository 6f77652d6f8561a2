package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gyre-ml/gyre/internal/config"
	"github.com/gyre-ml/gyre/internal/errs"
	"github.com/gyre-ml/gyre/internal/recoverer"
	"github.com/gyre-ml/gyre/internal/recovery"
	"github.com/gyre-ml/gyre/internal/sampler"
	"github.com/gyre-ml/gyre/internal/view"
	"github.com/gyre-ml/gyre/internal/vote"
	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/transport"
)

// Recovery from a lost worker (docs/recovery.md). The decisions are the
// pure recovery.Rank's; the recoverer (package recoverer) feeds it messages,
// loss evidence from the heartbeats and ticks of a clock. This file runs
// the loop and acts on what the rank returns: it sends its messages, and
// when it installs a view it builds the view's communicators and brings
// every member the winning commit. Gossip is never evidence.

// recoverView runs recovery after a failure that lost a peer: it rolls
// this worker back to its commit, takes part in rounds until it installs
// a view and holds the winning commit, and returns the Change that says
// so, with Redo set. It gives up with ErrNoQuorum after QuorumTimeout if
// it then hears no majority of its view (else after JoinTimeout in all),
// or at once when asked to leave (RequestLeave) while it hears none; with
// one, it recovers and leaves at the next boundary.
//
// late are members a boundary's table found late past CollectiveTimeout:
// this recovery counts them gone, though their heartbeats come.
func (e *Engine) recoverView(ctx context.Context, cause error, late []transport.PeerID) (Change, error) {
	rc := e.rec
	rc.SetLate(late)
	defer rc.SetLate(nil) // evidence for this recovery only
	start := time.Now()
	old := e.cur
	// Nothing of the old view's collectives is read again: the new view
	// has a higher epoch, and its links are reopened (installRecovered).
	e.abandon(old)
	// A member that advanced past the boundary this worker failed runs the
	// next iteration's collectives and waits for this worker's part, which
	// never comes, with no evidence against it: it would wait out
	// CollectiveTimeout, deaf to the rounds. Closing this side's streams
	// of the old view ends its receive, so that it recovers too.
	e.links.Reopen(old.Others())
	if err := e.rollBack(); err != nil {
		return Change{}, errors.Join(cause, err)
	}
	digest, err := e.state.Digest()
	if err != nil {
		return Change{}, errors.Join(cause, err)
	}
	own := recovery.Commit{Epoch: rc.CommitEpoch(), Iter: uint64(e.it.iter), Digest: digest}
	rc.Rank.Committed(own)
	e.log.Warn().Err(cause).Uint64("epoch", old.Epoch).Int64("commit", e.it.iter).
		Msg("the view failed: recovering")

	// The quorum timer runs from the failure, and again from every view
	// installed but not started: an install proves a majority answered.
	quorum := time.NewTimer(e.cfg.QuorumTimeout)
	defer quorum.Stop()
	tick := time.NewTicker(rc.Tick())
	defer tick.Stop()
	var roundAt time.Time // when this worker entered its first round
	redialed := time.Now()
	rc.Redial(recoveryView(old).Members)
	suspect := true
	for {
		inst := rc.Rank.Installed()
		acc, _ := rc.Rank.Accepted()
		rc.Listen(append(inst.Members, acc.Members...))
		outs := rc.Evidence()
		if suspect {
			// A round starts even if the heartbeats name nobody (a stream
			// broke, not a connection): the members that saw the same
			// failure then agree on a view of everyone. Evidence goes
			// first, so that a round it starts skips the lost.
			suspect = false
			outs = append(outs, rc.Rank.Step(recovery.Suspect{})...)
		}
		select {
		case <-rc.Wake():
			m, ok := rc.Next()
			if !ok {
				continue
			}
			if in, ok := m.Msg.(recovery.Install); ok && recovery.Excluded(rc.Rank.Self(), inst, in) {
				return e.rejoin(ctx, in, cause)
			}
			// A member of the installed view that missed its install is
			// the rank's to count in its round (onReport); only a rank
			// outside the view gets the bare answer.
			if in, ok := rc.Rank.Stale(m.Msg); ok && !inst.Has(m.From) {
				rc.Post(m.From, in)
				continue
			}
			if ev := e.log.Debug(); ev.Enabled() {
				ev.Str("from", string(m.From)).Str("msg", fmt.Sprintf("%T %+v", m.Msg, m.Msg)).Msg("recovery: received")
			}
			outs = append(outs, rc.Rank.Step(m)...)
		case <-tick.C:
			if e.members.leaveReq.Load() && !rc.HearsMajority(inst) {
				// Whoever asked (a launcher stopping the job, a scheduler
				// draining the node) is waiting for this process to end,
				// and no round can install a view without a majority.
				return Change{}, rc.LeftWithoutQuorum(inst, cause)
			}
			outs = append(outs, rc.Rank.Step(recovery.Tick{})...)
			if time.Since(redialed) >= e.cfg.PeerTimeout {
				redialed = time.Now()
				rc.Redial(append(inst.Members, acc.Members...))
			}
		case <-ctx.Done():
			return Change{}, fmt.Errorf("gyre: recovery from a lost member cancelled: %w (it began with: %w)", ctx.Err(), cause)
		case <-e.life.Done():
			return Change{}, errs.Closed
		case <-quorum.C:
			// A worker that hears a majority is not cut off from it: its
			// members are late to the rounds (a long step, an eval, a
			// checkpoint), and it waits for them, up to JoinTimeout in all.
			if left := e.cfg.JoinTimeout - time.Since(start); left > 0 && rc.HearsMajority(inst) {
				quorum.Reset(min(e.cfg.QuorumTimeout, left))
				continue
			}
			return Change{}, rc.NoQuorum(inst, e.cfg.QuorumTimeout, cause)
		}
		if roundAt.IsZero() && rc.Rank.Recovering() {
			roundAt = time.Now()
		}
		// Every message goes out first: a step can install one view and
		// accept the proposal of the next in one go (a view it had only
		// accepted is learned), and that Accept must not be lost.
		var installed *recovery.Installed
		for _, o := range outs {
			switch o := o.(type) {
			case recovery.Send:
				if ev := e.log.Debug(); ev.Enabled() {
					ev.Str("to", string(o.To)).Str("msg", fmt.Sprintf("%T %+v", o.Msg, o.Msg)).Msg("recovery: sending")
				}
				rc.Post(o.To, o.Msg)
				if _, ok := o.Msg.(recovery.Propose); ok && e.fp.at.Name == config.FailPropose {
					rc.Drain(time.Second) // the proposal is out before the failpoint kills
					e.fail(config.FailPropose)
				}
			case recovery.Waiting:
				if len(o.Diverged) > 0 {
					return Change{}, fmt.Errorf("%w: the members %v hold the newest commit with different state digests; no copy can be trusted",
						errs.Diverged, o.Diverged)
				}
				e.log.Debug().Stringer("round", o.Round).Msg("a recovery round ended without a view; trying the next")
			case recovery.Installed:
				installed = &o
			}
		}
		// A view installed while the rank is already in a round for the
		// next one is only a step on the way: start the view that round
		// installs.
		if installed == nil || rc.Rank.Recovering() {
			continue
		}
		o := *installed
		agreed, heard := time.Now(), rc.LastHeardOf(o.Lost)
		if heard.IsZero() || heard.After(start) {
			heard = start // no heartbeat before the failure: count from it
		}
		if roundAt.IsZero() {
			roundAt = agreed // installed from a round others ran
		}
		// A member that missed the Install waits for it, and the install
		// waits for that member in the state transfer: answer its late
		// Accepts and calls meanwhile.
		stopAnswering := rc.Answering(rc.Tick())
		ch, err := e.installRecovered(ctx, old, o)
		stopAnswering()
		if errors.Is(err, errs.Diverged) || errors.Is(err, errs.Closed) {
			return Change{}, err
		}
		if err != nil {
			e.log.Warn().Err(err).Uint64("epoch", o.View.Epoch).Msg("could not start the recovered view; recovering again")
			e.abandon(e.cur) // nothing of it runs while the rounds go on
			// The broadcast may have set the winner's state and iteration.
			if rerr := e.rollBack(); rerr != nil {
				return Change{}, errors.Join(err, rerr)
			}
			rc.Rank.Committed(own)
			quorum.Reset(e.cfg.QuorumTimeout)
			continue
		}
		e.log.Warn().Strs("lost", ch.Lost).Strs("pending", ch.Pending).Uint64("old_epoch", old.Epoch).Strs("old_members", old.Names).
			Uint64("epoch", o.View.Epoch).Strs("members", ch.View.Members).Int64("iter", e.it.iter).
			Str("state_from", string(o.Winner.Holder)).
			Dur("detect", roundAt.Sub(heard)).Dur("agree", agreed.Sub(roundAt)).Dur("transfer", time.Since(agreed)).
			Dur("total", time.Since(heard)).
			Msg("recovered: the job goes on without the lost members")
		return ch, nil
	}
}

// installRecovered starts the view a recovery installed: it builds its
// communicators over the old view's links, reopened so that no message
// cut off in the old view is waited on, and brings every member the
// winner's state, which each checks before committing it. Until then its
// own commit stays whole.
func (e *Engine) installRecovered(ctx context.Context, old *view.View, in recovery.Installed) (Change, error) {
	rc := e.rec
	members := make([]vote.Member, len(in.View.Members))
	for i, id := range in.View.Members {
		members[i] = vote.Member{ID: transport.PeerID(id), Addr: rc.Addr(transport.PeerID(id))}
	}
	holder := slices.IndexFunc(members, func(m vote.Member) bool { return m.ID == transport.PeerID(in.Winner.Holder) })
	if holder < 0 {
		return Change{}, fmt.Errorf("gyre: the state's holder %s is not in the recovered view", in.Winner.Holder)
	}
	var joiners []transport.PeerID
	for _, j := range in.View.Joiners {
		joiners = append(joiners, transport.PeerID(j))
	}
	// Equal shares until the holder's models come (LB-BSP).
	err := e.installView(ctx, newView{epoch: in.View.Epoch, members: members, shares: sampler.EqualShares(e.cfg.GlobalBatch, len(members)),
		bandwidth: old.Data.Bandwidth(), joiners: joiners, iter: e.it.iter, what: fmt.Sprintf("the recovered view of epoch %d", in.View.Epoch),
		sync: syncRecovered, root: holder, winner: in.Winner.Commit})
	if err != nil {
		return Change{}, err
	}
	v := e.cur
	rc.SetCommitEpoch(in.Winner.Commit.Epoch)
	var dropped []transport.PeerID
	for _, id := range old.IDs {
		if !v.Has(id) {
			dropped = append(dropped, id)
		}
	}
	e.forgetDropped(dropped)
	for _, s := range recovery.Notices(in) {
		rc.Post(s.To, s.Msg)
	}
	// Lost is against the view this worker ran: a view installed by the
	// protocol but never started here (in.Lost's reference) dropped some.
	// Its own joiners are not lost: a recovery leaves them out alive or
	// dead (they hold no state), and a live one is pending again.
	var lost, pending []string
	for _, id := range dropped {
		if slices.Contains(old.Joiners, id) {
			pending = append(pending, string(id))
		} else {
			lost = append(lost, string(id))
		}
	}
	return Change{Iter: e.it.iter, View: e.View(), ViewChanged: true, Shares: e.Shares(), SharesChanged: true,
		Redo: true, Lost: lost, Pending: pending}, nil
}

// takeRecovered brings every member of the recovered view the winning
// commit from root, its holder, with its balance models, and checks it
// against what the holder reported before committing it.
func (e *Engine) takeRecovered(ctx context.Context, root int, want recovery.Commit) error {
	v := e.cur
	holder := v.IDs[root]
	if err := e.confirm(ctx, e.syncState(ctx, root), root); err != nil {
		return err
	}
	// Only once every member confirmed the state: a member whose
	// transfer failed must not leave the others waiting in a broadcast.
	if e.cfg.Balance == config.BalanceLBBSP {
		if err := e.bal.Sync(ctx, v, root); err != nil {
			return err
		}
	}
	if want.Digest != 0 {
		if got, err := e.state.Digest(); err != nil || got != want.Digest {
			return fmt.Errorf("%w: the state rank %d (%s) sent does not match the digest it reported (%016x, got %016x, %v)",
				errs.Diverged, root, holder, want.Digest, got, err)
		}
	}
	if e.it.iter != int64(want.Iter) {
		return fmt.Errorf("%w: rank %d (%s) sent iteration %d, but reported %d", errs.Diverged, root, holder, e.it.iter, want.Iter)
	}
	return e.state.Commit(e.it.iter)
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
func (e *Engine) recoverOr(ctx context.Context, err error) (Change, error) {
	// An abort marker in a vote or a new view's setup (its link probes)
	// comes from a member that saw the view fail, as a joiner whose watch
	// found a member silent does: the view failed here too.
	failed := lostPeer(err) || errors.Is(err, ring.ErrTimeout) || errors.Is(err, ring.ErrAborted)
	if e.rec == nil || e.closed.Load() || ctx.Err() != nil || !failed {
		return Change{}, err
	}
	return e.recoverView(ctx, err, nil)
}

// lostPeer reports whether err is the loss of a peer, or a member's
// leaving a failed view: one a recovery, or a joiner's return to pending,
// can get over.
func lostPeer(err error) bool {
	return errors.Is(err, transport.ErrPeerGone) || errors.Is(err, transport.ErrNotConnected) ||
		errors.Is(err, recoverer.ErrMemberLeft)
}
