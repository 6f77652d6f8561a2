package gyre

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
func (w *Worker) forgetDropped(dropped []transport.PeerID) {
	rc := w.rec
	w.forgetPeers(dropped)
	for _, p := range dropped {
		w.adm.reset(p)
		rc.mu.Lock()
		rc.formers[p] = true
		rc.mu.Unlock()
	}
}

// forgetPeers drops every record the transport holds of peers, and
// forgets where they were dialled.
func (w *Worker) forgetPeers(peers []transport.PeerID) {
	f, _ := w.t.(transport.Forgetter)
	for _, p := range peers {
		if f != nil {
			f.Forget(p)
		}
		delete(w.dialled, p)
	}
}

// regossip joins gossip again, every regossipEvery until stopped,
// through the seeds and the gossip addresses gossip remembers for the
// members of the view this worker left: after a partition, each side's
// gossip holds the other dead and never probes it again.
func (w *Worker) regossip(ctx context.Context, members []transport.PeerID) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			addrs := slices.Clone(w.seeds)
			for _, m := range w.node.All() {
				if slices.Contains(members, transport.PeerID(m.Name)) && !slices.Contains(addrs, m.Addr) {
					addrs = append(addrs, m.Addr)
				}
			}
			if len(addrs) > 0 {
				jctx, jcancel := context.WithTimeout(ctx, regossipEvery)
				if err := w.node.Join(jctx, addrs); err != nil {
					w.log.Debug().Err(err).Strs("addrs", addrs).Msg("joining gossip again")
				}
				jcancel()
			}
			select {
			case <-time.After(regossipEvery):
			case <-ctx.Done():
				return
			}
		}
	}()
	return func() { cancel(); <-done }
}

// regossipEvery is how often a rejoining worker joins gossip again.
const regossipEvery = 2 * time.Second

// backToPending makes a worker whose admission failed on a lost member a
// pending joiner again: it stops talking to the view that was admitting
// it (its silence tells the members it is gone) and says it is pending.
func (w *Worker) backToPending(members []transport.PeerID) {
	if vs := w.cur; vs != nil {
		vs.close()
	}
	w.live.Watch(nil)
	self := transport.PeerID(w.cfg.Name)
	w.forgetPeers(slices.DeleteFunc(slices.Clone(members), func(p transport.PeerID) bool { return p == self }))
	w.meta.publish(w.nodeMeta(0, -1))
}

// rejoin brings back a worker the others recovered without, as a new
// member: in is the Install of the view that left it out. It forgets
// every old link, goes back to pending in gossip, and waits up to
// JoinTimeout to be admitted at a boundary, as a joiner. Its own commits
// are dropped: it takes the job's state, as any joiner does.
func (w *Worker) rejoin(ctx context.Context, in recovery.Install, cause error) (Change, error) {
	start := time.Now()
	rc := w.rec
	w.log.Warn().Uint64("epoch", in.View.Epoch).Int("world", len(in.View.Members)).
		Msg("the job recovered without this worker (it was stopped, starved or cut off for longer than PeerTimeout); rejoining as a new member")
	rc.mu.Lock()
	var old []transport.PeerID
	for id := range rc.addrs {
		if id != transport.PeerID(w.cfg.Name) {
			old = append(old, id)
		}
	}
	rc.inbox = nil
	rc.mu.Unlock()
	w.backToPending(old)
	// The member side of admission restarts with the new view.
	w.adm.close()
	w.adm = nil
	// Close ends the wait too, as it ends every other call.
	ctx, stopLife := context.WithCancel(ctx)
	defer stopLife()
	stopOnClose := context.AfterFunc(w.life, stopLife)
	defer stopOnClose()
	jctx, cancel := context.WithTimeoutCause(ctx, w.cfg.JoinTimeout,
		fmt.Errorf("%w (%v, --join-timeout): %w", errJoinTimedOut, w.cfg.JoinTimeout, context.DeadlineExceeded))
	defer cancel()
	fail := func(err error) (Change, error) {
		return Change{}, fmt.Errorf("gyre: rejoining the job after it recovered without this worker: %w (it was left out after: %w)", err, cause)
	}
	// Gossip may have declared the members dead while this worker was
	// cut off, and they it; memberlist never looks again by itself.
	stopGossip := w.regossip(jctx, old)
	wel, err := w.awaitWelcome(jctx, false)
	stopGossip()
	if err != nil {
		return fail(err)
	}
	if err := w.enterView(jctx, wel, start); err != nil {
		return fail(err)
	}
	w.adm = startAdmissions(w.t, w.node, w.cfg.Job, transport.PeerID(w.cfg.Name), w.fitting(), w.cur.members, w.handshakeNote,
		w.log.With().Str("component", "admission").Logger())
	vs := w.cur
	rc.rank = recovery.NewRank(recovery.ID(w.cfg.Name), vs.recoveryView(), recovery.Commit{Epoch: vs.view.Epoch, Iter: uint64(w.iter)},
		recoveryConfig(w.cfg))
	rc.commitEpoch = vs.view.Epoch
	rc.know(vs.members)
	return Change{Iter: w.iter, View: w.View(), ViewChanged: true, Shares: w.Shares(), SharesChanged: true, Redo: true,
		Admitted: []string{w.cfg.Name}}, nil
}
