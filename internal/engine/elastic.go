package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gyre-ml/gyre/internal/admission"
	"github.com/gyre-ml/gyre/internal/config"
	"github.com/gyre-ml/gyre/internal/errs"
	"github.com/gyre-ml/gyre/internal/gossip"
	"github.com/gyre-ml/gyre/internal/recovery"
	"github.com/gyre-ml/gyre/internal/sampler"
	"github.com/gyre-ml/gyre/internal/vote"
	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/transport"
)

// Gossip membership (docs/membership.md). A worker with Listen and no
// Seeds starts a job: it forms view 1 alone. A worker with Seeds gossips
// in through them and waits, listed as pending in its metadata (epoch 0),
// until a boundary admits it: every member lists it in its boundary
// record, all decide the same next view (vote.DecideView), and each
// member still in it sends the joiner a welcome over the control channel
// before anything else of the new view. The members and the joiner then
// agree on the settings, and the state is broadcast from the first member
// of the old view, as at Join. Before iteration 0 the members vote in
// admission rounds until the view holds MinWorkers.

// joinGossip is Join with gossip membership.
func (e *Engine) joinGossip(ctx context.Context) error {
	start := time.Now()
	cfg := e.cfg
	sec, err := cfg.Secret()
	if err != nil {
		return err
	}
	self := e.self()
	e.gossip, err = gossip.Start(gossip.Config{Name: cfg.Name, Job: cfg.Job, DataAddr: self.Addr, Listen: cfg.Listen,
		Advertise: cfg.Advertise, Seeds: cfg.Seeds, Key: sec.GossipKey(), Local: cfg.GossipTiming == config.GossipLocal,
		ProbeInterval: cfg.GossipProbeInterval, SuspicionMult: cfg.GossipSuspicionMult, Block: e.opts.Test.GossipBlock, Logger: e.log})
	if err != nil {
		return err
	}
	e.log.Info().Str("gossip", e.gossip.Addr()).Str("data", self.Addr).Str("job", cfg.Job).Msg("gossip started")
	prestart, starting := true, len(cfg.Seeds) == 0
	if starting && cfg.MinWorkers <= 1 && e.gossip.AwaitRunningJob(ctx) {
		// This worker would have started a job at once, but it is a seed
		// started again with its own command: the running job's members
		// found it within gossip.StartWindow (KeepSeeds).
		e.log.Warn().Strs("workers", workerNames(e.gossip.Workers())).
			Msg("no --seed, but a running job of this name and key contacted this worker: joining it as a new member rather than starting a second job")
		starting = false
	} else if !starting {
		if starting, err = e.gossip.JoinSeeds(ctx, e.joinEnded); err != nil {
			return err
		}
		if !starting {
			e.log.Info().Strs("seeds", e.gossip.Seeds()).Msg("gossip joined; pending until a boundary admits this worker")
		}
		if e.gossip.NamedSeed() {
			// With one seed list for all, the workers that joined before
			// the starter came up may only know each other: join through
			// the seeds again until admitted, and through prestart's
			// admissions, which gossip feeds.
			defer e.gossip.Regossip(ctx, nil)()
		}
	}
	epoch := uint64(1) // of the view a starter forms
	for {
		if !starting {
			wel, err := e.admitted(ctx, start, e.gossip.Starter())
			switch {
			case errors.Is(err, gossip.ErrJobGone):
				e.log.Info().Msg("this worker is the first seed and gossip lists the job's workers in no view any more: starting the job")
				starting = true
			case err != nil:
				return err
			default:
				prestart = wel.Prestart
			}
		}
		if starting {
			if epoch == 1 {
				e.merge.own.Lead = "" // a new line: this worker names it
			}
			err := e.installView(ctx, newView{epoch: epoch, members: []vote.Member{self}, shares: sampler.EqualShares(cfg.GlobalBatch, 1),
				iter: e.it.iter, what: "the new job's view", sync: syncAlone})
			if err != nil {
				return err
			}
			if epoch == 1 {
				e.log.Info().Str("seed", e.gossip.Addr()).Msg("started a new job: others join it with --seed")
			}
		}
		e.startAdmissions()
		err := e.assemble(ctx, prestart, starting)
		if err == nil {
			e.gossip.SetStarted()
			e.gossip.Publish(e.cur.Epoch, e.cur.Rank)
			return nil
		}
		others := e.cur.Others()
		if errors.Is(err, errYield) {
			// The starter of a view still assembling hears from a started
			// job of this name and key: a seed started again with its own
			// command. It joins that job; its view's other members lose it,
			// go back to pending, and join too.
			e.log.Warn().Err(err).Msg("joining the running job as a new member rather than starting a second job")
			e.adm.Close()
			e.adm = nil
			e.backToPending(others)
			starting = false
			continue
		}
		if !lostBeforeStart(ctx, err) {
			return err
		}
		e.adm.Close()
		e.adm = nil
		if starting {
			// Before iteration 0 the starter is the job: it forms the
			// view anew, alone, and admits the others again.
			e.log.Warn().Err(err).Strs("dropped", peerNames(others)).Uint64("epoch", e.cur.Epoch+1).
				Msg("a member was lost before iteration 0: forming the job's view again; the live workers are admitted again")
			e.abandon(e.cur)
			e.live.Watch(nil)
			e.links.Forget(others)
			epoch, prestart = e.cur.Epoch+1, true
			continue
		}
		e.log.Warn().Err(err).Msg("a member was lost before iteration 0: pending again, until the worker that started the job admits this one")
		e.backToPending(others)
	}
}

// assemble runs the admission rounds before iteration 0 while prestart
// says more are needed. The starter's rounds end with errYield when
// gossip lists a started job of this name and key outside its view.
func (e *Engine) assemble(ctx context.Context, prestart, starter bool) error {
	for prestart {
		if starter {
			if ws := e.gossip.StartedElsewhere(e.cur.Has); len(ws) > 0 {
				return fmt.Errorf("%w: gossip lists %d worker(s) of a started job of this name and key, such as %s, while this worker's view of %d assembles",
					errYield, len(ws), ws[0], len(e.cur.IDs))
			}
		}
		var err error
		if prestart, err = e.admit(ctx); err != nil {
			return err
		}
	}
	return nil
}

// errYield ends a starter's admission rounds: a started job of its name
// and key runs, and the view still assembling yields to it.
var errYield = errors.New("gyre: a started job of this name and key runs")

// lostBeforeStart reports whether err, which ended the admission rounds
// before iteration 0, is the loss of a member (or its silence past a
// collective's timeout): the job, not yet started, forms again
// (docs/recovery.md). A worker whose own Join ended, that was closed, or
// that diverged, stops.
func lostBeforeStart(ctx context.Context, err error) bool {
	if ctx.Err() != nil || errors.Is(err, errs.Closed) || errors.Is(err, errs.Diverged) {
		return false
	}
	return lostPeer(err) || errors.Is(err, ring.ErrTimeout) || errors.Is(err, ring.ErrAborted)
}

// workerNames returns the IDs of ws, for logs.
func workerNames(ws []admission.Worker) []string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = string(w.ID)
	}
	return out
}

// peerNames returns ids as strings, for logs.
func peerNames(ids []transport.PeerID) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = string(id)
	}
	return out
}

// startAdmissions starts the members' side of the admission handshake
// for the current view.
func (e *Engine) startAdmissions() {
	e.adm = admission.Start(e.links.T, e.gossip, e.self().ID, e.fitting(), e.cur.Members, e.opts.Test.HandshakeNote,
		e.log.With().Str("component", "admission").Logger())
}

// awaitWelcome waits, pending, until the members admit this worker
// (gossip.AwaitWelcome).
func (e *Engine) awaitWelcome(ctx context.Context, startIfGone bool) (gossip.Welcome, error) {
	req := admission.Request{Version: admission.Version, Addr: e.self().Addr, Fit: e.fitting()}
	return e.gossip.AwaitWelcome(ctx, e.links.T, req, startIfGone, e.opts.Test.HandshakeNote, e.joinEnded)
}

// membershipRecord fills rec's membership fields: the leave request, the
// worker bounds and the pending joiners this worker may list (see
// admission.Admissions.Ready), which it returns by hash.
func (e *Engine) membershipRecord(rec *vote.Record) map[uint64]vote.Member {
	rec.Leave = e.members.leaveReq.Load()
	rec.MinWorkers, rec.MaxWorkers = int64(e.cfg.MinWorkers), int64(e.cfg.MaxWorkers)
	if e.gossip == nil {
		return nil
	}
	e.forgetDeparted()
	e.members.joiners = len(e.gossip.Pending(e.cur.Has))
	ready := e.adm.Ready()
	rec.Joiners = vote.ListJoiners(ready, uint64(rec.Iter))
	known := make(map[uint64]vote.Member, len(ready))
	for _, m := range ready {
		known[vote.JoinerHash(m)] = m
	}
	return known
}

// decisionDigest hashes the view and shares this worker runs with, as the
// previous boundary decided them.
func (e *Engine) decisionDigest() uint64 {
	v := e.cur
	return vote.ViewDigest(v.Epoch, v.Members, v.Shares)
}

// admit runs one admission round before iteration 0 and reports whether
// more are needed: the view is still below the largest MinWorkers.
func (e *Engine) admit(ctx context.Context) (bool, error) {
	select {
	case <-time.After(admission.Poll):
	case <-ctx.Done():
		return false, fmt.Errorf("gyre: waiting for %d workers before iteration 0 (the view has %d): %w",
			e.cfg.MinWorkers, e.Size(), e.joinEnded(ctx))
	}
	v := e.cur
	rec := vote.Record{Kind: vote.KindAdmit, Iter: e.it.iter, Decision: e.decisionDigest()}
	known := e.membershipRecord(&rec)
	recs, err := e.vote(ctx, v, rec)
	if err != nil {
		return false, err
	}
	var out []error
	for r, got := range recs {
		if got.Decision != rec.Decision {
			out = append(out, fmt.Errorf("%w: rank %d (%s) runs a different view or shares", errs.Diverged, r, v.IDs[r]))
		}
	}
	if err := e.settle(ctx, v, errors.Join(out...)); err != nil {
		return false, err
	}
	d, err := vote.DecideView(e.it.iter, v.Members, recs, known, e.bal.BatchFit(), config.MaxView)
	if err != nil {
		return false, e.settle(ctx, v, err)
	}
	e.noteCapped(d)
	if d.Changed {
		if err := e.changeView(ctx, d, e.it.iter, !d.Start); err != nil {
			return false, err
		}
		if e.members.left {
			return false, errs.Closed
		}
	}
	return !d.Start, nil
}

// noteCapped says when the number of joiners that MaxWorkers keeps
// pending changes.
func (e *Engine) noteCapped(d vote.ViewDecision) {
	if d.Capped == e.members.capped {
		return
	}
	e.members.capped = d.Capped
	if d.Capped == 0 {
		e.log.Info().Int("world", len(d.Members)).Msg("no listed joiner is kept pending any more")
		return
	}
	e.log.Warn().Int("waiting", d.Capped).Int("max_workers", e.cfg.MaxWorkers).Int("global_batch", e.cfg.GlobalBatch).
		Int("world", len(d.Members)).
		Msg("joiners that every member lists stay pending: the view is at MaxWorkers, or one more worker would get no sample of the global batch")
}

// changeView moves to the view d decided. Every member first proves at a
// barrier that it holds the table, so that leaving or closing the old
// view's communicators cuts off nothing a peer still needs. A member that
// asked to leave then leaves; the others welcome the joiners, build the
// new view's communicators, and, if workers joined, bring them the state.
// The view starts at iteration iter: installing it sets the worker's
// iteration, shares and a fresh balance state together.
func (e *Engine) changeView(ctx context.Context, d vote.ViewDecision, iter int64, prestart bool) error {
	old := e.cur
	self := old.Self()
	leaving := slices.ContainsFunc(d.Left, func(m vote.Member) bool { return m.ID == self })
	next := recovery.View{Epoch: old.Epoch + 1}
	for _, m := range d.Members {
		next.Members = append(next.Members, recovery.ID(m.ID))
	}
	joiners := vote.ViewJoiners(iter, d.Admitted)
	for _, id := range joiners {
		next.Joiners = append(next.Joiners, recovery.ID(id))
	}
	if e.rec != nil && !leaving {
		// Holding the table is round 0's accept: a recovery that begins
		// before the barrier ends finds it (docs/recovery.md).
		e.rec.Know(d.Members)
		e.rec.Rank.Decided(next)
	}
	if err := old.Ctrl.Barrier(ctx); err != nil && !leaving {
		return e.lost(old, iter-1, err)
	}
	if e.rec != nil && !leaving {
		e.rec.Rank.Advanced(next, e.rec.Rank.Commit())
	}
	if leaving {
		// The decision stands even if the barrier failed: every member
		// holds the table it came from. Before closing, wait for the
		// others' farewells: a transport hands messages to the network
		// without confirming delivery, and closing at once could cut off
		// the last messages of this worker's barrier.
		e.members.left = true
		fctx, cancel := context.WithTimeout(ctx, e.cfg.CollectiveTimeout)
		if err := e.live.Farewell(fctx, e.cfg.PeerTimeout); err != nil {
			e.log.Debug().Err(err).Msg("waiting for the farewells of the members that stay")
		}
		cancel()
		e.log.Info().Int64("iter", iter).Msg("left the job at the boundary, as requested")
		e.gossip.Leave()
		return e.Close()
	}
	if len(d.Left) > 0 {
		// This member's barrier is done: it needs nothing more from the
		// leavers, which wait for that before they close.
		fctx, cancel := context.WithTimeout(ctx, e.cfg.PeerTimeout)
		if err := e.live.Dismiss(fctx, vote.PeerIDs(d.Left)); err != nil {
			e.log.Debug().Err(err).Msg("saying farewell to the members that left")
		}
		cancel()
	}
	e.forgetDeparted()
	// A new view starts from the shares the members' fitted models give
	// (a joiner, with none, an equal share) and a fresh balance state,
	// which a joiner has too.
	epoch, shares := old.Epoch+1, e.bal.StartShares(vote.PeerIDs(d.Members))
	var oldRanks []int
	for r, m := range d.Members {
		if old.Has(m.ID) {
			oldRanks = append(oldRanks, r)
		}
	}
	if e.gossip != nil {
		e.gossip.Depart(d.Left)
	}
	e.members.forget = append(e.members.forget, vote.PeerIDs(d.Left)...)
	// The joiners' handshakes end before anything of the view change
	// touches their links.
	e.adm.SetView(d.Members)
	wel := gossip.Welcome{Version: gossip.WelcomeVersion, Epoch: epoch, Iter: iter, Members: d.Members, Shares: shares,
		Old: oldRanks, Prestart: prestart, Lead: lineageLead(e.merge.own.Lead, d.Members)}
	// Every joiner answered every member moments ago, so these connects
	// take milliseconds; ConnectTimeout keeps one that has become
	// unreachable since from holding up the job.
	cctx, cancel := context.WithTimeout(ctx, e.cfg.ConnectTimeout)
	defer cancel()
	for _, j := range d.Admitted {
		if err := e.sendWelcome(cctx, j, slices.Index(d.Members, j), wel); err != nil {
			return err
		}
	}
	sync := syncSettle
	if len(d.Admitted) > 0 {
		sync = syncState
	}
	err := e.installView(ctx, newView{epoch: epoch, members: d.Members, shares: shares, bandwidth: old.Data.Bandwidth(),
		joiners: joiners, iter: iter, what: fmt.Sprintf("the view of epoch %d", epoch), sync: sync, root: oldRanks[0]})
	if err != nil {
		return err
	}
	ev := e.log.Info().Uint64("epoch", epoch).Int("world", len(d.Members)).Int64("iter", e.it.iter)
	if len(d.Admitted) > 0 {
		ev = ev.Strs("admitted", vote.Names(d.Admitted))
	}
	if len(d.Left) > 0 {
		ev = ev.Strs("left", vote.Names(d.Left))
	}
	if d.Promoted {
		ev = ev.Bool("joiners_vote", true)
	}
	ev.Msg("view changed")
	if !prestart && len(d.Members) < e.cfg.MinWorkers {
		e.log.Warn().Int("world", len(d.Members)).Int("min_workers", e.cfg.MinWorkers).
			Msg("the view shrank below MinWorkers, which gates iteration 0 only; training goes on")
	}
	return nil
}

// sendWelcome connects to joiner j, rank in the view wel describes, and
// sends it wel on the control channel, within ctx.
func (e *Engine) sendWelcome(ctx context.Context, j vote.Member, rank int, wel gossip.Welcome) error {
	err := e.links.DialJoiner(ctx, j.ID, j.Addr)
	if err == nil {
		err = gossip.SendWelcome(ctx, e.links.T, j.ID, wel)
	}
	if err != nil {
		return fmt.Errorf("gyre: welcoming joiner %s at %s (rank %d of epoch %d; ConnectTimeout %v, --connect-timeout): %w",
			j.ID, j.Addr, rank, wel.Epoch, e.cfg.ConnectTimeout, err)
	}
	return nil
}

// forgetDeparted releases the transport's records of the members that
// left at an earlier boundary. Not at once: a leaver may still be
// forwarding the last messages of its final barrier.
func (e *Engine) forgetDeparted() {
	if len(e.members.forget) == 0 || e.cur == nil {
		return
	}
	for _, id := range e.members.forget {
		if !e.cur.Has(id) {
			// Dialled afresh if it comes back, and a handshake with it
			// already under way begins again.
			e.links.Forget([]transport.PeerID{id})
			e.adm.Reset(id)
		}
	}
	e.members.forget = e.members.forget[:0]
}

// admitted waits for a welcome and enters the view it describes. A
// member lost while this worker enters the view, or one that aborted its
// setup, sends it back to pending: the members recover without it, and
// admit it later.
func (e *Engine) admitted(ctx context.Context, start time.Time, startIfGone bool) (gossip.Welcome, error) {
	for {
		wel, err := e.awaitWelcome(ctx, startIfGone)
		if err != nil {
			return wel, err
		}
		err = e.enterView(ctx, wel, start)
		// A member that aborted the view's setup (its probes' watch found
		// another silent) saw it fail, as a lost member says.
		if err == nil || !(lostPeer(err) || errors.Is(err, ring.ErrAborted)) || ctx.Err() != nil {
			return wel, err
		}
		e.log.Warn().Err(err).Msg("a member was lost while this worker was being admitted; pending again")
		e.backToPending(vote.PeerIDs(wel.Members))
	}
}

// enterView makes this joiner a member of the view its welcome describes,
// and takes the state from the root. start is when Join began.
func (e *Engine) enterView(ctx context.Context, wel gossip.Welcome, start time.Time) error {
	self := e.self()
	rank := slices.IndexFunc(wel.Members, func(m vote.Member) bool { return m.ID == self.ID })
	switch {
	case rank < 0:
		return fmt.Errorf("gyre: the welcome's view does not list this worker (%s)", self.ID)
	case wel.Members[rank].Addr != self.Addr:
		return fmt.Errorf("gyre: the welcome lists this worker at %s, but it is at %s", wel.Members[rank].Addr, self.Addr)
	case len(wel.Old) == 0 || len(wel.Shares) != len(wel.Members):
		return fmt.Errorf("gyre: malformed welcome: %d members, %d shares, %d old members", len(wel.Members), len(wel.Shares), len(wel.Old))
	}
	var admitted []vote.Member
	for r, m := range wel.Members {
		if !slices.Contains(wel.Old, r) {
			admitted = append(admitted, m)
		}
	}
	if wel.Lead != "" {
		e.merge.own.Lead = wel.Lead // the view's line, not this worker's old one
	}
	err := e.installView(ctx, newView{epoch: wel.Epoch, members: wel.Members, shares: wel.Shares,
		joiners: vote.ViewJoiners(wel.Iter, admitted), iter: wel.Iter,
		what: fmt.Sprintf("the view of epoch %d that admitted this worker", wel.Epoch), sync: syncState, root: wel.Old[0]})
	if err != nil {
		return err
	}
	e.log.Info().Uint64("epoch", wel.Epoch).Int("world", len(wel.Members)).Int64("iter", e.it.iter).
		Dur("since_join", time.Since(start)).Msg("admitted")
	return nil
}

// backToPending makes a worker whose admission failed on a lost member a
// pending joiner again: it stops talking to the view that was admitting
// it (its silence tells the members it is gone) and says it is pending.
func (e *Engine) backToPending(members []transport.PeerID) {
	e.abandon(e.cur)
	e.live.Watch(nil)
	self := transport.PeerID(e.cfg.Name)
	e.links.Forget(slices.DeleteFunc(slices.Clone(members), func(p transport.PeerID) bool { return p == self }))
	e.gossip.Publish(0, -1)
}
