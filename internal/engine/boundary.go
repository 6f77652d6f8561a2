package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/gyre-ml/gyre/balance"
	"github.com/gyre-ml/gyre/internal/config"
	"github.com/gyre-ml/gyre/internal/errs"
	"github.com/gyre-ml/gyre/internal/obs"
	"github.com/gyre-ml/gyre/internal/view"
	"github.com/gyre-ml/gyre/internal/vote"
	"github.com/gyre-ml/gyre/transport"
)

// Change is what a Boundary decided for the next iteration (gyre.Change).
type Change struct {
	Iter                     int64
	View                     View
	ViewChanged              bool
	Shares                   []int
	SharesChanged            bool
	Redo                     bool
	Admitted, Departed, Lost []string
	Pending                  []string
	Left                     bool
}

// Boundary ends the current iteration with a vote that every worker
// joins (gyre.Worker.Boundary).
func (e *Engine) Boundary(ctx context.Context) (Change, error) {
	e.it.ctrlStep.Store(int32(stepBoundary))
	start, iter, compute := time.Now(), e.it.iter, e.it.compute
	ch, err := e.boundary(ctx)
	e.observeBoundary(iter, compute, start, ch, err)
	if err != nil && ctx.Err() != nil && e.rec != nil && !e.closed.Load() {
		e.log.Warn().Err(err).Int64("iter", e.it.iter).
			Msg("the boundary's context ended: this worker leaves the job, and the others recover without it")
		e.gossip.Leave()
		e.Close()
	}
	return ch, err
}

// boundary decides from the vote's table, does the plan's I/O, then
// applies it.
func (e *Engine) boundary(ctx context.Context) (Change, error) {
	if err := ctx.Err(); err != nil {
		// Before ErrPending: the gradients of a cancelled iteration may
		// still be in flight, and the cancellation is the news.
		return Change{}, fmt.Errorf("gyre: boundary of iteration %d: %w", e.it.iter, err)
	}
	if err := e.idle(); err != nil {
		return Change{}, err
	}
	if e.rec != nil {
		e.rec.AnswerStale()
	}
	v := e.cur
	rec, known, err := e.record()
	if err != nil {
		return Change{}, err
	}
	e.fail(config.FailVote)
	recs, err := e.vote(ctx, v, rec)
	if err != nil {
		return e.recoverOr(ctx, err)
	}
	if err := e.checkpointFailures(v, recs); err != nil {
		return Change{}, e.settle(ctx, v, err)
	}
	if err := e.settle(ctx, v, e.judge(recs, rec)); err != nil {
		return e.afterFailure(ctx, v, recs, err)
	}
	if mv := e.mergeVerdict(recs); mv.Yield {
		return e.yieldView(ctx, mv)
	}
	e.bal.Keep(v.IDs, recs)
	e.it.computes = e.it.computes[:0]
	for _, r := range recs {
		e.it.computes = append(e.it.computes, time.Duration(r.Compute))
	}
	p, err := vote.Make(vote.Input{Iter: e.it.iter, Members: v.Members, Joiners: v.Joiners, Shares: v.Shares, Recs: recs,
		Known: known, BatchFit: e.bal.BatchFit(), MaxView: config.MaxView, Checked: rec.Digest != 0,
		NextCheck: e.it.nextCheck, LBBSP: e.cfg.Balance == config.BalanceLBBSP, Global: e.cfg.GlobalBatch,
		Balance: e.bal.State(), ReprobeEvery: e.opts.Test.ReprobeEvery})
	if err != nil {
		return Change{}, e.settle(ctx, v, err)
	}
	e.noteCapped(p.View)
	e.notePlan(v, recs, p)
	var probed view.Probed
	if p.Reprobe {
		if probed, err = e.probe(ctx, v, p.Next); err != nil {
			return e.recoverOr(ctx, e.lost(v, e.it.iter, err))
		}
	}
	if p.View.Changed {
		// Installing the view is applying it: its iteration and shares
		// come with it, and the new view's own collectives follow.
		if err := e.changeView(ctx, p.View, p.Next, false); err != nil {
			return e.recoverOr(ctx, err)
		}
	}
	if err := e.apply(v, p, probed); err != nil {
		return Change{}, err
	}
	ch := Change{Iter: p.Next, ViewChanged: p.View.Changed, SharesChanged: p.View.Changed || p.Shares != nil,
		Admitted: vote.Names(p.View.Admitted), Departed: vote.Names(p.View.Left)}
	if e.members.left {
		ch.Left = true
		return ch, nil
	}
	ch.View, ch.Shares = e.View(), e.Shares()
	return ch, nil
}

// record is this worker's boundary record: the iteration's own part, then
// what membership, balancing and checkpointing each contribute. It also
// returns the joiners this worker listed, by hash.
func (e *Engine) record() (vote.Record, map[uint64]vote.Member, error) {
	v := e.cur
	rec := vote.Record{Kind: vote.KindBoundary, Iter: e.it.iter, Share: int64(v.Shares[v.Rank]), Compute: int64(e.it.compute),
		Decision: e.decisionDigest(), Status: statusOf(e.it.failed), Wall: int64(time.Since(e.it.lastVote))}
	if e.it.failed == nil {
		var err error
		if rec.Digest, rec.HashNs, err = e.digestState(e.it.iter >= e.it.nextCheck); err != nil {
			return rec, nil, err
		}
	}
	known := e.membershipRecord(&rec)
	e.judgeMerge(&rec)
	e.bal.Record(&rec, e.it.failed != nil, e.it.compute)
	rec.CkptFailed = e.ckpt.taker.RequiredFailed()
	return rec, known, nil
}

// judge returns the verdict on a boundary's table: nil if every worker
// completed the same iteration with the same decision and state.
func (e *Engine) judge(recs []vote.Record, own vote.Record) error {
	if fe := e.failures(recs, e.it.iter, e.it.failed); fe != nil {
		return fe
	}
	return vote.Diverged(recs, own, e.cur.Shares)
}

// afterFailure acts on a failed verdict. A member late past
// CollectiveTimeout, a collective that lost a peer, or a first mismatch
// at this iteration, in a gossip job, is recovered from: every member
// judged the same table, so all recover together. Else the verdict is the
// boundary's error.
func (e *Engine) afterFailure(ctx context.Context, v *view.View, recs []vote.Record, verdict error) (Change, error) {
	if e.rec == nil {
		return Change{}, verdict
	}
	if late := vote.LateRanks(recs, e.cfg.CollectiveTimeout); len(late) > 0 {
		// A member arrived at the iteration's collectives past
		// CollectiveTimeout: every member, the late one too, recovers
		// counting it gone. The view left holds the others; the late one
		// rejoins as a new member.
		ids := make([]transport.PeerID, len(late))
		for i, r := range late {
			ids[i] = v.IDs[r]
		}
		e.log.Warn().Ints("late", late).Dur("collective_timeout", e.cfg.CollectiveTimeout).
			Msg("members late past CollectiveTimeout: recovering without them")
		return e.recoverView(ctx, verdict, ids)
	}
	redo := vote.RedoMismatch(recs, e.it.iter, e.it.redoneMismatch)
	if redo {
		e.it.redoneMismatch = e.it.iter
	}
	if vote.PeerGoneIn(recs) || redo {
		// The vote got through, but a collective of the iteration lost a
		// peer (one is going, or the links broke), or its sizes differed
		// for the first time at this iteration. A view with every member
		// still there is a view like any other: the iteration is redone
		// from the last commit.
		return e.recoverView(ctx, verdict, nil)
	}
	return Change{}, verdict
}

// notePlan logs what the plan's balancing decided, the same on every
// member.
func (e *Engine) notePlan(v *view.View, recs []vote.Record, p vote.Plan) {
	if p.Kept != nil {
		e.log.Warn().Err(p.Kept).Ints("shares", v.Shares).Msg("shares kept")
		return
	}
	if p.Shares == nil {
		return
	}
	if ev := e.log.Debug(); ev.Enabled() {
		ws := vote.Workers(recs)
		models := make([]string, len(ws))
		for i, x := range ws {
			models[i] = x.Model.String()
		}
		ev.Ints("from", v.Shares).Ints("to", p.Shares).Bool("speed_changed", p.SpeedChanged).Strs("models", models).
			Float64("predicted_s", balance.Predict(ws, p.Shares)).Msg("shares rebalanced")
	}
}

// apply makes a boundary's plan the worker's state once its I/O is done.
// A view change has installed its view, shares and iteration already
// (changeView). Only setting the ring order and the cost model can fail,
// with a closed view, and that comes first.
func (e *Engine) apply(v *view.View, p vote.Plan, probed view.Probed) error {
	if !p.View.Changed {
		if err := v.SetProbed(probed); err != nil {
			return err
		}
		e.setIter(p.Next)
		if p.Shares != nil {
			v.Shares = p.Shares
		}
		e.bal.SetState(p.Balance)
	}
	e.it.nextCheck = p.NextCheck
	e.it.started, e.it.compute, e.it.lastVote = time.Time{}, 0, time.Now()
	return nil
}

// checkpointFailures returns, if some member's record says a checkpoint
// it had to write (CheckpointRequired) failed, the error that ends the
// job on every member: this worker's own failure, or one naming the rank.
func (e *Engine) checkpointFailures(v *view.View, recs []vote.Record) error {
	for r, rec := range recs {
		if !rec.CkptFailed {
			continue
		}
		if err := e.ckpt.taker.TakeFailed(); r == v.Rank && err != nil {
			return err
		}
		return fmt.Errorf("%w: rank %d (%s) could not write a checkpoint, and --checkpoint-required ends the job; its log says why",
			errs.Checkpoint, r, v.IDs[r])
	}
	return nil
}

// observeBoundary reports a boundary that ran from start and returned ch
// and err.
func (e *Engine) observeBoundary(iter int64, compute time.Duration, start time.Time, ch Change, err error) {
	if e.rep.Observer == nil {
		return
	}
	rank := -1
	if err == nil && !ch.Left {
		rank = e.cur.Rank
	}
	b := obs.Boundary{Iter: iter, Next: ch.Iter, Duration: time.Since(start), Compute: compute, Err: err,
		Epoch: ch.View.Epoch, Members: len(ch.View.Members), MemberNames: ch.View.Members, Rank: rank, Shares: ch.Shares,
		ViewChanged: ch.ViewChanged, SharesChanged: ch.SharesChanged, Redo: ch.Redo, Pending: e.members.joiners}
	if err == nil && !ch.ViewChanged {
		b.Computes = e.it.computes
	}
	e.rep.Observer.Boundary(b)
}
