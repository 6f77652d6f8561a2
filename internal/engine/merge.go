package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/gyre-ml/gyre/internal/gossip"
	"github.com/gyre-ml/gyre/internal/merge"
	"github.com/gyre-ml/gyre/internal/vote"
)

// Merging started views of one job that meet in gossip
// (docs/membership.md, "Merging started views"): the decisions are
// package merge's; this file keeps the view's lead and published
// iteration, puts each member's verdict in its boundary record, and
// yields when the table says so.

// mergeState is this worker's view in the merge: its lead and the
// committed iteration it last published, and rank 0's wall time since;
// and this worker's samples and compute time since, for its status.
type mergeState struct {
	own                merge.Own
	sincePub           time.Duration
	samples, computeNs int64
}

// publishEvery is how often a view publishes its committed iteration in
// gossip: far longer than gossip takes to spread it on a LAN (under a
// second), so that two views that meet compare the same pair of values.
const publishEvery = 2 * time.Second

// lineageLead is a view's lead once it holds members: the smallest
// member ID its line has had (lead "" for a new line).
func lineageLead(lead string, members []vote.Member) string {
	for _, m := range members {
		if id := string(m.ID); lead == "" || id < lead {
			lead = id
		}
	}
	return lead
}

// startPublishing records the start of the current view, at iteration
// iter, in the merge: every member of the view publishes iter from
// there. A joiner takes the view's lead from its welcome first.
func (e *Engine) startPublishing(iter int64) {
	e.merge.own.Lead = lineageLead(e.merge.own.Lead, e.cur.Members)
	e.merge.own.Published, e.merge.sincePub, e.merge.samples, e.merge.computeNs = iter, 0, 0, 0
	e.gossip.PublishCommit(e.merge.own.Lead, iter, gossip.Status{}) // no boundary of this view yet
}

// judgeMerge puts this worker's merge verdict in its boundary record.
func (e *Engine) judgeMerge(rec *vote.Record) {
	if e.gossip == nil {
		return
	}
	if v := merge.Judge(e.merge.own, e.gossip.StartedViews(e.cur.Has)); v.Yield {
		rec.MergeTo, rec.MergeCommit = v.To, v.Commit
	}
}

// mergeVerdict is the view's verdict from the boundary's table; when the
// view stays, it publishes the committed iteration once rank 0's clock
// says publishEvery has passed, the same boundary on every member.
func (e *Engine) mergeVerdict(recs []vote.Record) merge.Verdict {
	verdicts := make([]merge.Verdict, len(recs))
	for r, rec := range recs {
		verdicts[r] = merge.Verdict{Yield: rec.MergeTo != 0, To: rec.MergeTo, Commit: rec.MergeCommit}
	}
	if v := merge.Agree(verdicts); v.Yield {
		return v
	}
	if self := e.cur.Rank; self >= 0 && self < len(recs) {
		e.merge.samples += recs[self].Share
		e.merge.computeNs += recs[self].Compute
	}
	if e.merge.sincePub += time.Duration(recs[0].Wall); e.merge.sincePub >= publishEvery {
		st := e.jobStatus(recs, recs[0].Iter-e.merge.own.Published)
		e.merge.own.Published, e.merge.sincePub, e.merge.samples, e.merge.computeNs = recs[0].Iter, 0, 0, 0
		e.gossip.PublishCommit(e.merge.own.Lead, recs[0].Iter, st)
	}
	return merge.Verdict{}
}

// yieldView ends this worker's view, which the table says yields to the
// started view v of the same job, and joins that view as a new member,
// within JoinTimeout: the state and iterations of this view are dropped.
func (e *Engine) yieldView(ctx context.Context, v merge.Verdict) (Change, error) {
	start := time.Now()
	e.log.Warn().Int64("iter", e.it.iter).Int64("published", e.merge.own.Published).Str("lead", e.merge.own.Lead).
		Int64("their_commit", v.Commit).Uint64("epoch", e.cur.Epoch).
		Msg(fmt.Sprintf("another started view of this job (same key and --job) ranks above this one: it published committed iteration %d, "+
			"this one %d; joining it as a new member, and discarding this view's state at iteration %d", v.Commit, e.merge.own.Published, e.it.iter))
	// Every member yields at this boundary: none closes its links before
	// all hold the table (the barrier), nor before all are done with its
	// messages (the farewells, as a worker that leaves waits for).
	v0 := e.cur
	if err := v0.Ctrl.Barrier(ctx); err != nil {
		e.log.Debug().Err(err).Msg("yielding: the barrier failed; every member holds the table all the same")
	}
	fctx, cancel := context.WithTimeout(ctx, e.cfg.CollectiveTimeout)
	if err := e.live.Farewell(fctx, e.cfg.PeerTimeout); err != nil {
		e.log.Debug().Err(err).Msg("yielding: waiting for the farewells of the view's members")
	}
	cancel()
	ch, err := e.joinAnew(ctx, start, false)
	if err != nil {
		return Change{}, fmt.Errorf("gyre: joining the started view of this job that this view yielded to: %w", err)
	}
	return ch, nil
}
