package gyre

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gyre-ml/gyre/balance"
	"github.com/gyre-ml/gyre/transport"
)

// Boundary ends the current iteration with a vote that every worker joins,
// including one whose collectives failed. Each contributes a record
// (iteration, share, compute time, whether its collectives completed, a
// digest of the view and shares it will use next, and at the iterations
// where the state is checked, a digest of the state about to be
// committed) to one allgather on the control channel, apart from the
// gradients. All judge the same table:
//   - every worker completed and agrees: Boundary advances to the next
//     iteration and returns what changed for it;
//   - some worker's collective failed with every member there: every
//     worker returns an *IterationError naming the failed ranks
//     (ErrIterationFailed), and the iteration stays where it was. In a
//     gossip job, a first mismatch (sizes that differ across workers) at
//     an iteration is redone instead: every worker returns Redo, from
//     the last commit, in a view of the same members at the next epoch;
//     the same mismatch again at that iteration is the error. A rank
//     late past CollectiveTimeout is left out as if lost (below), and
//     rejoins as a new member when it gets there;
//   - workers disagree about the iteration, shares, decision or state:
//     every worker returns ErrDiverged naming the ranks;
//   - a member was lost (it died, froze past PeerTimeout, or was cut
//     off): in a gossip job the others recover without it
//     (docs/recovery.md) and return a Change with Redo set, the new view,
//     and Iter, the iteration to run next, with the winning commit's state
//     restored; a member left out of the new view rejoins as a new member
//     and returns the same. Without a majority of the view, Boundary
//     returns ErrNoQuorum after Config.QuorumTimeout. In a static view
//     every survivor returns a *PeerLostError naming the lost rank
//     (ErrPeerLost).
//
// Survivors may see different outcomes from the Boundary in which a
// member was lost (some advanced, some recovered); the recovery that
// follows brings them to one view, iteration and state before any
// commits again. Call Commit after every Boundary that returns no error.
//
// If ctx ends first (the trainer's own cancellation or deadline), this
// worker leaves the job: Boundary returns ctx's error and, in a gossip
// job, closes the worker, so that the others see it go at once and
// recover without it instead of waiting for its record.
//
// The state is hashed at every boundary while hashing costs at most 1% of
// the iteration's compute time; for larger models it is checked every K
// iterations, K chosen from the table so that it stays within that budget.
func (w *Worker) Boundary(ctx context.Context) (Change, error) {
	w.ctrlStep.Store(int32(stepBoundary))
	start, iter, compute := time.Now(), w.iter, w.compute
	ch, err := w.boundary(ctx)
	w.observeBoundary(iter, compute, start, ch, err)
	if err != nil && ctx.Err() != nil && w.rec != nil && !w.closed.Load() {
		w.log.Warn().Err(err).Int64("iter", w.iter).
			Msg("the boundary's context ended: this worker leaves the job, and the others recover without it")
		w.leaveGossip()
		w.Close()
	}
	return ch, err
}

func (w *Worker) boundary(ctx context.Context) (Change, error) {
	if err := ctx.Err(); err != nil {
		// Before ErrPending: the gradients of a cancelled iteration may
		// still be in flight, and the cancellation is the news.
		return Change{}, fmt.Errorf("gyre: boundary of iteration %d: %w", w.iter, err)
	}
	if err := w.idle(); err != nil {
		return Change{}, err
	}
	if w.rec != nil {
		w.rec.answerStale()
	}
	vs := w.cur
	rec := record{kind: kindBoundary, iter: w.iter, share: int64(vs.shares[vs.rank]), compute: int64(w.compute),
		decision: w.decisionDigest(), status: statusOf(w.failed), wall: int64(time.Since(w.lastVote))}
	if w.failed == nil {
		var err error
		if rec.digest, rec.hashNs, err = w.digestState(w.iter >= w.nextCheck); err != nil {
			return Change{}, err
		}
	}
	known := w.membershipRecord(&rec)
	w.balanceRecord(&rec)
	rec.ckptFailed = w.ckpt.requiredFailed()
	w.fail(FailVote)
	recs, err := w.vote(ctx, vs, rec)
	if err != nil {
		return w.recoverOr(ctx, err)
	}
	if err := w.checkpointFailures(vs, recs); err != nil {
		return Change{}, w.settle(ctx, vs, err)
	}
	if err := w.settle(ctx, vs, w.judge(recs, rec)); err != nil {
		if late := lateRanks(recs, w.cfg.CollectiveTimeout); w.rec != nil && len(late) > 0 {
			// A member arrived at the iteration's collectives past
			// CollectiveTimeout: every member, the late one too, recovers
			// counting it gone. The view left holds the others; the
			// late one rejoins as a new member.
			w.rec.late = map[transport.PeerID]bool{}
			for _, r := range late {
				w.rec.late[vs.ids[r]] = true
			}
			w.log.Warn().Ints("late", late).Dur("collective_timeout", w.cfg.CollectiveTimeout).
				Msg("members late past CollectiveTimeout: recovering without them")
			return w.recoverView(ctx, err)
		}
		if w.rec != nil && (peerGoneIn(recs) || w.redoMismatch(recs)) {
			// The vote got through, but a collective of the iteration
			// lost a peer (one is going, or the links broke), or its
			// sizes differed for the first time at this iteration. Every
			// member judged the same table, so all recover together, and
			// a view with every member still there is a view like any
			// other: the iteration is redone from the last commit.
			return w.recoverView(ctx, err)
		}
		return Change{}, err
	}
	w.keepFits(vs, recs)
	w.computes = w.computes[:0]
	for _, r := range recs {
		w.computes = append(w.computes, time.Duration(r.compute))
	}
	p, err := w.plan(vs, recs, known, rec.digest != 0)
	if err != nil {
		return Change{}, w.settle(ctx, vs, err)
	}
	if p.reprobe {
		if p.probed, err = w.probe(ctx, vs); err != nil {
			return w.recoverOr(ctx, w.lost(vs, w.iter, err))
		}
	}
	if p.view.Changed {
		// Installing the view is applying it: its iteration and shares
		// come with it, and the new view's own collectives follow.
		if err := w.changeView(ctx, p.view, p.next, false); err != nil {
			return w.recoverOr(ctx, err)
		}
	}
	if err := w.apply(vs, p); err != nil {
		return Change{}, err
	}
	ch := Change{Iter: p.next, ViewChanged: p.view.Changed, SharesChanged: p.view.Changed || p.shares != nil,
		Admitted: memberIDs(p.view.Admitted), Departed: memberIDs(p.view.Left)}
	if w.left {
		ch.Left = true
		return ch, nil
	}
	ch.View, ch.Shares = w.View(), w.Shares()
	return ch, nil
}

// boundaryPlan is what a boundary's table decided, before any of it is
// carried out. Boundary decides, then does the plan's fallible I/O (a
// re-probe of the links, a view change), then applies it in one step, so
// that a boundary that fails leaves the iteration, shares, ring order and
// balance state as they were; the recovery that may follow starts from
// them.
type boundaryPlan struct {
	next int64        // the iteration after the boundary
	view viewDecision // the next view; Changed if it differs
	// shares are the next shares, nil if kept, and bst the balance state
	// that chose them; both LB-BSP only, with no view change.
	shares []int
	bst    balance.State
	// reprobe says the links are measured again; probed is what the
	// probes chose.
	reprobe bool
	probed  probed
	// nextCheck is the iteration whose boundary next checks the state.
	nextCheck int64
}

// plan decides, from a table every member of vs judged alike, the next
// view, shares and state check, the same on every member.
func (w *Worker) plan(vs *viewState, recs []record, known map[uint64]member, checked bool) (boundaryPlan, error) {
	d, err := decideView(w.iter, vs.members, recs, known, w.batchFit())
	if err != nil {
		return boundaryPlan{}, err
	}
	w.noteCapped(d)
	promoteJoiners(&d, vs.joiners)
	p := boundaryPlan{next: w.iter + 1, view: d, bst: w.bst, nextCheck: w.nextCheck}
	if checked {
		p.nextCheck = w.iter + checkInterval(recs)
	}
	if d.Changed {
		// The first boundary of a view checks the state, on every member:
		// a joiner, whose Join sets the same, has just received it.
		p.nextCheck = p.next
		return p, nil
	}
	if w.cfg.Balance == BalanceLBBSP {
		p.shares, p.bst = w.rebalance(vs, recs)
	}
	p.reprobe = p.next%w.reprobeEvery == 0
	return p, nil
}

// apply makes a boundary's plan the worker's state once its I/O is done.
// A view change has installed its view, shares and iteration already
// (changeView). Only setting the ring order and the cost model can fail,
// with a closed view, and that comes first.
func (w *Worker) apply(vs *viewState, p boundaryPlan) error {
	if !p.view.Changed {
		if err := vs.setProbed(p.probed); err != nil {
			return err
		}
		w.setIter(p.next)
		if p.shares != nil {
			vs.shares = p.shares
		}
		w.bst = p.bst
	}
	w.nextCheck = p.nextCheck
	w.started, w.compute, w.lastVote = time.Time{}, 0, time.Now()
	return nil
}

// RequestLeave asks for this worker to leave the job at the next boundary:
// the request rides in its boundary record, every member removes it from
// the next view, and that Boundary returns a Change with Left set, with no
// iteration redone. It is safe from any goroutine (a SIGTERM handler).
func (w *Worker) RequestLeave() { w.leaveReq.Store(true) }

// judge returns the verdict on a boundary's table: nil if every worker
// completed the same iteration with the same decision and state.
func (w *Worker) judge(recs []record, own record) error {
	if fe := failures(recs, w.iter, w.failed); fe != nil {
		return fe
	}
	vs := w.cur
	var errs []error
	for r, rec := range recs {
		switch {
		case rec.iter != own.iter:
			errs = append(errs, fmt.Errorf("%w: rank %d ended iteration %d, this worker %d", ErrDiverged, r, rec.iter, own.iter))
		case rec.share != int64(vs.shares[r]):
			errs = append(errs, fmt.Errorf("%w: rank %d used share %d, expected %d", ErrDiverged, r, rec.share, vs.shares[r]))
		case rec.decision != own.decision:
			errs = append(errs, fmt.Errorf("%w: rank %d decided a different view or shares", ErrDiverged, r))
		}
	}
	if len(errs) == 0 {
		errs = divergedStates(recs)
	}
	return errors.Join(errs...)
}

// checkpointFailures returns, if some member's record says a checkpoint
// it had to write (CheckpointRequired) failed, the error that ends the
// job on every member: this worker's own failure, or one naming the rank.
func (w *Worker) checkpointFailures(vs *viewState, recs []record) error {
	for r, rec := range recs {
		if !rec.ckptFailed {
			continue
		}
		if err := w.ckpt.takeFailed(); r == vs.rank && err != nil {
			return err
		}
		return fmt.Errorf("%w: rank %d (%s) could not write a checkpoint, and --checkpoint-required ends the job; its log says why",
			ErrCheckpoint, r, vs.ids[r])
	}
	return nil
}
