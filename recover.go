package gyre

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gyre-ml/gyre/balance"
	"github.com/gyre-ml/gyre/internal/recovery"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
)

// Recovery from a lost worker (docs/recovery.md). The decisions are the
// pure recovery.Rank's; this file feeds it (messages from the recovery
// channel, loss evidence from the heartbeats, ticks of a clock) and acts
// on what it returns: it sends its messages, and when it installs a view
// it builds the view's communicators and brings every member the
// winning commit. Gossip is never evidence.

// recoverer is a gossip worker's side of recovery: the pure rank, which
// lives as long as the worker (it must remember what it accepted), and
// the plumbing of its messages.
type recoverer struct {
	w    *Worker
	rank *recovery.Rank
	// commitEpoch is the epoch of the view in which the last commit was
	// made.
	commitEpoch uint64

	mu sync.Mutex
	// inbox holds the messages received and not yet stepped; wake has a
	// token while it is not empty.
	inbox   []recovery.Recv
	wake    chan struct{}
	formers map[transport.PeerID]bool   // members lost from a view, who may call from an old one
	addrs   map[transport.PeerID]string // every member this worker knew, for dialling
	hearing map[transport.PeerID]bool   // receivers running
	// relisten is when a receiver that failed may start again: a stream
	// that fails at once must not spin.
	relisten map[transport.PeerID]time.Time
	dialing  map[transport.PeerID]bool // redials under way
	outboxes map[transport.PeerID]chan recovery.Msg
	inflight atomic.Int64 // messages posted and not yet sent or given up on
	// silent are the members the heartbeats said were gone, for telling
	// the rank when they are heard again. Only the recovery loop uses it.
	silent map[transport.PeerID]bool
}

// inboxSize bounds the messages buffered while nobody recovers; rounds
// send a few messages per member each.
const inboxSize = 1024

// maxRecoveryMsg bounds one encoded message: a Report carries three
// lists of at most MaxView IDs.
const maxRecoveryMsg = 256 << 10

// recoveryFlag marks recovery messages in the header's Flags.
const recoveryFlag = 0x40

func newRecoverer(w *Worker) *recoverer {
	vs := w.cur
	rc := &recoverer{w: w, commitEpoch: vs.view.Epoch, wake: make(chan struct{}, 1), formers: map[transport.PeerID]bool{},
		silent: map[transport.PeerID]bool{}, dialing: map[transport.PeerID]bool{},
		addrs: map[transport.PeerID]string{}, hearing: map[transport.PeerID]bool{}, relisten: map[transport.PeerID]time.Time{}, outboxes: map[transport.PeerID]chan recovery.Msg{}}
	rc.rank = recovery.NewRank(recovery.ID(w.cfg.Name), vs.recoveryView(), recovery.Commit{Epoch: vs.view.Epoch, Iter: uint64(w.iter)},
		recoveryConfig(w.cfg))
	rc.know(vs.members)
	return rc
}

// recoveryTick is the pure rank's unit of time.
func recoveryTick(cfg Config) time.Duration { return max(cfg.PeerTimeout/20, 5*time.Millisecond) }

// recoveryConfig maps the timeouts onto ticks. A coordinator waits for
// the reports of members it still hears for up to CollectiveTimeout, as
// a collective waits for a late member; a round gives up after that and
// a few peer timeouts more, for its messages. A round's messages go again
// every PeerTimeout, for links that come back.
func recoveryConfig(cfg Config) recovery.Config {
	tick := recoveryTick(cfg)
	collect := int(cfg.CollectiveTimeout/tick) + 1
	return recovery.Config{CollectTicks: collect, RoundTicks: collect + int(4*cfg.PeerTimeout/tick),
		ResendTicks: max(int(cfg.PeerTimeout/tick), 1)}
}

// recoveryView is vs as the recovery protocol sees it.
func (vs *viewState) recoveryView() recovery.View {
	v := recovery.View{Epoch: vs.view.Epoch}
	for _, id := range vs.ids {
		v.Members = append(v.Members, recovery.ID(id))
		if slices.Contains(vs.joiners, id) {
			v.Joiners = append(v.Joiners, recovery.ID(id))
		}
	}
	return v
}

// know records the members' addresses, for dialling them in a recovery.
func (rc *recoverer) know(ms []member) {
	rc.mu.Lock()
	for _, m := range ms {
		rc.addrs[m.ID] = m.Addr
	}
	rc.mu.Unlock()
}

// listen runs a receiver for each peer that has none: it reads the
// peer's recovery messages for the worker's life, buffering them until a
// recovery steps them. A receiver whose stream fails ends; the next
// recovery step starts it again.
func (rc *recoverer) listen(ids []recovery.ID) {
	w := rc.w
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, id := range ids {
		p := transport.PeerID(id)
		if p == transport.PeerID(w.cfg.Name) || rc.hearing[p] {
			continue
		}
		rc.hearing[p] = true
		go func() {
			defer func() {
				rc.mu.Lock()
				delete(rc.hearing, p)
				rc.mu.Unlock()
			}()
			buf := make([]byte, maxRecoveryMsg)
			for {
				h, n, err := w.t.Recv(w.life, p, transport.ChanRecovery, buf)
				if err != nil {
					if w.life.Err() == nil {
						w.log.Debug().Err(err).Str("peer", string(p)).Msg("recovery receiver stopped")
					}
					return
				}
				if h.Kind != wire.KindControl || h.Flags != recoveryFlag {
					w.log.Warn().Str("peer", string(p)).Msg("ignored a message on the recovery channel that is not one")
					continue
				}
				m, err := recovery.Decode(buf[:n])
				if err != nil {
					w.log.Warn().Err(err).Str("peer", string(p)).Msg("ignored a malformed recovery message")
					continue
				}
				rc.deliver(recovery.Recv{From: id, Msg: m})
			}
		}()
	}
}

// deliver queues a received message for the next step.
func (rc *recoverer) deliver(m recovery.Recv) {
	rc.mu.Lock()
	if len(rc.inbox) >= inboxSize {
		rc.inbox = rc.inbox[1:] // the oldest is likeliest stale
		rc.w.log.Warn().Msg("recovery inbox full; dropped the oldest message")
	}
	rc.inbox = append(rc.inbox, m)
	rc.mu.Unlock()
	select {
	case rc.wake <- struct{}{}:
	default:
	}
}

// next takes the oldest queued message, if any.
func (rc *recoverer) next() (recovery.Recv, bool) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.inbox) == 0 {
		return recovery.Recv{}, false
	}
	m := rc.inbox[0]
	rc.inbox = rc.inbox[1:]
	if len(rc.inbox) > 0 {
		select {
		case rc.wake <- struct{}{}:
		default:
		}
	}
	return m, true
}

// answerStale answers, between rounds, the calls of ranks that run an
// older view: those a recovery left out learn so, and rejoin. Other
// messages stay queued for the next recovery. It listens to the members
// lost from views, who make such calls.
func (rc *recoverer) answerStale() {
	rc.mu.Lock()
	var keep []recovery.Recv
	var answers []recovery.Send
	for _, m := range rc.inbox {
		if in, ok := rc.rank.Stale(m.Msg); ok {
			answers = append(answers, recovery.Send{To: m.From, Msg: in})
			continue
		}
		keep = append(keep, m)
	}
	rc.inbox = keep
	var formers []recovery.ID
	for id := range rc.formers {
		formers = append(formers, recovery.ID(id))
	}
	rc.mu.Unlock()
	for _, a := range answers {
		rc.post(a.To, a.Msg)
	}
	rc.listen(formers)
}

// drain waits until every posted message has been sent or given up on,
// or for at most limit.
func (rc *recoverer) drain(limit time.Duration) {
	for end := time.Now().Add(limit); rc.inflight.Load() > 0 && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
	}
}

// post queues m for to. Each peer has one sender, so its messages leave
// in order; a sender gives up on a message after PeerTimeout, and the
// rounds' own timeouts cover what is lost.
func (rc *recoverer) post(to recovery.ID, m recovery.Msg) {
	w := rc.w
	p := transport.PeerID(to)
	rc.mu.Lock()
	q := rc.outboxes[p]
	if q == nil {
		q = make(chan recovery.Msg, 64)
		rc.outboxes[p] = q
		go rc.sender(p, q)
	}
	rc.mu.Unlock()
	rc.inflight.Add(1)
	select {
	case q <- m:
	default:
		rc.inflight.Add(-1)
		w.log.Warn().Str("peer", string(p)).Msg("recovery outbox full; dropped a message")
	}
}

func (rc *recoverer) sender(p transport.PeerID, q chan recovery.Msg) {
	w := rc.w
	for {
		var m recovery.Msg
		select {
		case m = <-q:
		case <-w.life.Done():
			return
		}
		rc.send(p, m)
		rc.inflight.Add(-1)
	}
}

// send sends one message to p, dialling it if need be.
func (rc *recoverer) send(p transport.PeerID, m recovery.Msg) {
	w := rc.w
	b, err := recovery.Encode(m)
	if err != nil {
		w.log.Error().Err(err).Msg("encoding a recovery message")
		return
	}
	rc.mu.Lock()
	addr := rc.addrs[p]
	rc.mu.Unlock()
	ctx, cancel := context.WithTimeout(w.life, w.cfg.PeerTimeout)
	defer cancel()
	err = w.t.Connect(ctx, p, addr)
	if err == nil {
		err = w.t.Send(ctx, p, transport.ChanRecovery, wire.Header{Kind: wire.KindControl, Flags: recoveryFlag}, b)
	}
	if err != nil {
		w.log.Debug().Err(err).Str("peer", string(p)).Msg("a recovery message was not sent")
	}
}

// redial dials again, in the background, every member whose link is
// down (Connect returns at once for the others). A link whose send failed
// is abandoned until someone dials it (transport.Transport.Send), and the
// heartbeats do not dial: a collective aborted mid-send abandons links to
// members that are alive, whose heartbeats then stop, and after a
// partition heals nothing else dials the other side. This brings the
// heartbeats back, and with them the evidence that the members are there.
func (rc *recoverer) redial(ids []recovery.ID) {
	w := rc.w
	for _, id := range ids {
		p := transport.PeerID(id)
		if p == transport.PeerID(w.cfg.Name) {
			continue
		}
		rc.mu.Lock()
		addr, busy := rc.addrs[p], rc.dialing[p]
		if !busy {
			rc.dialing[p] = true
		}
		rc.mu.Unlock()
		if busy {
			continue
		}
		go func() {
			ctx, cancel := context.WithTimeout(w.life, w.cfg.PeerTimeout)
			err := w.t.Connect(ctx, p, addr)
			cancel()
			rc.mu.Lock()
			delete(rc.dialing, p)
			rc.mu.Unlock()
			if err != nil {
				w.log.Debug().Err(err).Str("peer", string(p)).Msg("recovery: a member gone does not answer a dial")
			}
		}()
	}
}

// evidence steps a Lost for every member of the rank's views that the
// heartbeats say is gone (silent past PeerTimeout, or its connection
// broken), and a Heard for every one they said was gone and now hear
// again. It returns what the steps output.
func (rc *recoverer) evidence() []recovery.Output {
	w := rc.w
	var out []recovery.Output
	now := time.Now()
	inst := rc.rank.Installed()
	acc, _ := rc.rank.Accepted()
	for _, v := range []recovery.View{inst, acc} {
		for _, m := range v.Members {
			p := transport.PeerID(m)
			switch {
			case p == transport.PeerID(w.cfg.Name):
			case w.silentAt(p, now):
				if !rc.silent[p] {
					w.log.Debug().Str("peer", string(p)).Msg("recovery: evidence that a member is gone")
				}
				rc.silent[p] = true
				out = append(out, rc.rank.Step(recovery.Lost{Peer: m})...)
			case rc.silent[p]:
				w.log.Debug().Str("peer", string(p)).Msg("recovery: a member gone is heard again")
				delete(rc.silent, p)
				out = append(out, rc.rank.Step(recovery.Heard{Peer: m})...)
			}
		}
	}
	return out
}

// silent reports whether the heartbeats say p is gone: unheard for longer
// than PeerTimeout, its connection broken, or not watched at all.
func (w *Worker) silent(p transport.PeerID) bool { return w.silentAt(p, time.Now()) }

func (w *Worker) silentAt(p transport.PeerID, now time.Time) bool {
	heard := w.live.LastHeard(p)
	_, broken := w.live.Broken(p)
	return broken || heard.IsZero() || now.Sub(heard) > w.cfg.PeerTimeout
}

// recoverView runs recovery after a failure that lost a peer: it rolls
// this worker back to its commit, takes part in rounds until it installs
// a view and holds the winning commit, and returns the Change that says
// so, with Redo set. It gives up with ErrNoQuorum after QuorumTimeout.
func (w *Worker) recoverView(ctx context.Context, cause error) (Change, error) {
	rc := w.rec
	start := time.Now()
	old := w.cur
	// Nothing of the old view's collectives is read again: the new view
	// has a higher epoch, and its links are reopened (installRecovered).
	old.close()
	iter, err := w.state.restore()
	if err != nil {
		return Change{}, errors.Join(cause, err)
	}
	w.iter, w.failed = iter, nil
	w.started, w.compute = time.Time{}, 0
	digest, err := w.state.Digest()
	if err != nil {
		return Change{}, errors.Join(cause, err)
	}
	own := recovery.Commit{Epoch: rc.commitEpoch, Iter: uint64(iter), Digest: digest}
	rc.rank.Committed(own)
	w.log.Warn().Err(cause).Uint64("epoch", old.view.Epoch).Int64("commit", iter).
		Msg("lost touch with a member: recovering")

	// The quorum timer runs from the failure, and again from every view
	// installed but not started: an install proves a majority answered.
	quorum := time.NewTimer(w.cfg.QuorumTimeout)
	defer quorum.Stop()
	tick := time.NewTicker(recoveryTick(w.cfg))
	defer tick.Stop()
	var roundAt time.Time // when this worker entered its first round
	redialed := time.Now()
	rc.redial(old.recoveryView().Members)
	for {
		inst := rc.rank.Installed()
		acc, _ := rc.rank.Accepted()
		rc.listen(append(inst.Members, acc.Members...))
		outs := rc.evidence()
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
		ch, err := w.installRecovered(ctx, old, o)
		if errors.Is(err, ErrDiverged) || errors.Is(err, ErrClosed) {
			return Change{}, err
		}
		if err != nil {
			w.log.Warn().Err(err).Uint64("epoch", o.View.Epoch).Msg("could not start the recovered view; recovering again")
			iter, rerr := w.state.restore()
			if rerr != nil {
				return Change{}, errors.Join(err, rerr)
			}
			// The broadcast may have set the winner's iteration already.
			w.iter, w.started, w.compute = iter, time.Time{}, 0
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
	self := transport.PeerID(w.cfg.Name)
	rc.mu.Lock()
	members := make([]member, len(in.View.Members))
	for i, id := range in.View.Members {
		members[i] = member{ID: transport.PeerID(id), Addr: rc.addrs[transport.PeerID(id)]}
	}
	rc.mu.Unlock()
	rank := slices.IndexFunc(members, func(m member) bool { return m.ID == self })
	if rank < 0 {
		return Change{}, fmt.Errorf("gyre: the recovered view of epoch %d does not list this worker", in.View.Epoch)
	}
	shares := EqualShares(w.cfg.GlobalBatch, len(members))
	vs, err := w.newViewState(in.View.Epoch, members, rank, shares, old.data.Bandwidth())
	if err != nil {
		return Change{}, err
	}
	for _, j := range in.View.Joiners {
		vs.joiners = append(vs.joiners, transport.PeerID(j))
	}
	w.setView(vs)
	if ro, ok := w.t.(transport.Reopener); ok {
		for _, id := range vs.ids {
			if id != self {
				ro.Reopen(id, transport.ChanData)
				ro.Reopen(id, transport.ChanControl)
			}
		}
	}
	// A view chosen before a further loss may hold a member already
	// gone: recover from it at once rather than dial it for
	// ConnectTimeout.
	for r, id := range vs.ids {
		if r != rank && w.silent(id) {
			return Change{}, fmt.Errorf("gyre: the recovered view of epoch %d holds rank %d (%s), already lost: %w",
				in.View.Epoch, r, id, transport.ErrPeerGone)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, w.cfg.ConnectTimeout)
	defer cancel()
	if err := w.connectView(cctx, vs); err != nil {
		return Change{}, fmt.Errorf("gyre: connecting the recovered view of epoch %d: %w", in.View.Epoch, err)
	}
	holder := vs.rankOf(transport.PeerID(in.Winner.Holder))
	if holder < 0 {
		return Change{}, fmt.Errorf("gyre: the state's holder %s is not in the recovered view", in.Winner.Holder)
	}
	if err := w.confirm(ctx, w.syncState(ctx, holder), holder); err != nil {
		return Change{}, err
	}
	if want := in.Winner.Commit.Digest; want != 0 {
		if got, err := w.state.Digest(); err != nil || got != want {
			return Change{}, fmt.Errorf("%w: the state rank %d (%s) sent does not match the digest it reported (%016x, got %016x, %v)",
				ErrDiverged, holder, in.Winner.Holder, want, got, err)
		}
	}
	if w.iter != int64(in.Winner.Commit.Iter) {
		return Change{}, fmt.Errorf("%w: rank %d (%s) sent iteration %d, but reported %d", ErrDiverged, holder, in.Winner.Holder, w.iter, in.Winner.Commit.Iter)
	}
	if err := w.state.commit(w.iter); err != nil {
		return Change{}, err
	}
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
	w.meta.publish(w.nodeMeta(in.View.Epoch, rank))
	w.nextCheck, w.lastVote = w.iter, time.Now()
	w.bst = balance.State{} // as after any view change: shares start equal
	var lost []string
	for _, id := range in.Lost {
		lost = append(lost, string(id))
	}
	return Change{Iter: w.iter, View: w.View(), ViewChanged: true, Shares: w.Shares(), SharesChanged: true,
		Redo: true, Lost: lost}, nil
}

// committed records a Commit made in the view of epoch at iteration iter.
// Its digest is left to a recovery, which hashes the commit it restores:
// hashing every commit would cost what the boundary's state check saves.
func (rc *recoverer) committed(epoch uint64, iter int64) {
	rc.commitEpoch = epoch
	rc.rank.Committed(recovery.Commit{Epoch: epoch, Iter: uint64(iter)})
}

// recoverOr recovers from err if it lost a peer in a gossip view, and
// otherwise returns it: a static view fails fast, and so do a closed
// worker and an ended context. A link abandoned after a failed send
// (ErrNotConnected) is a lost peer's too.
func (w *Worker) recoverOr(ctx context.Context, err error) (Change, error) {
	if w.rec == nil || w.closed.Load() || ctx.Err() != nil || !lostPeer(err) {
		return Change{}, err
	}
	return w.recoverView(ctx, err)
}

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
			addrs := slices.Clone(w.cfg.Seeds)
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

// lostPeer reports whether err is the loss of a peer: one a recovery, or
// a joiner's return to pending, can get over.
func lostPeer(err error) bool {
	return errors.Is(err, transport.ErrPeerGone) || errors.Is(err, transport.ErrNotConnected)
}

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
	wel, err := w.awaitWelcome(jctx)
	stopGossip()
	if err != nil {
		return fail(err)
	}
	if err := w.enterView(jctx, wel, start); err != nil {
		return fail(err)
	}
	w.adm = startAdmissions(w.t, w.node, w.cfg.Job, transport.PeerID(w.cfg.Name), w.fitting(), w.cur.members,
		w.log.With().Str("component", "admission").Logger())
	vs := w.cur
	rc.rank = recovery.NewRank(recovery.ID(w.cfg.Name), vs.recoveryView(), recovery.Commit{Epoch: vs.view.Epoch, Iter: uint64(w.iter)},
		recoveryConfig(w.cfg))
	rc.commitEpoch = vs.view.Epoch
	rc.know(vs.members)
	w.nextCheck, w.lastVote = w.iter, time.Now()
	w.bst = balance.State{}
	return Change{Iter: w.iter, View: w.View(), ViewChanged: true, Shares: w.Shares(), SharesChanged: true, Redo: true,
		Admitted: []string{w.cfg.Name}}, nil
}
