package gyre

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/recovery"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/kernels"
	"github.com/gyre-ml/gyre/membership"
	"github.com/gyre-ml/gyre/transport"
)

// Gossip membership. A worker with Listen and no Seeds starts a job: it
// forms view 1 alone. A worker with Seeds gossips in through them and waits,
// listed as pending in its metadata (epoch 0), until a boundary admits it:
// every member lists it in its boundary record, all decide the same next
// view (decideView), and each member still in it sends the joiner a
// welcome over the control channel before anything else of the new view.
// The members and the joiner then agree on the settings, and the state is
// broadcast from the first member of the old view, as at Join. Before
// iteration 0 the members vote in admission rounds until the view holds
// MinWorkers.

// protocolVersion is the protocol in node metadata: workers that speak
// another are never admitted. Version 2 added the admission handshake,
// 3 the cores in the link probes' table, 4 the machines' boot ids in it.
const protocolVersion = 4

// seedQuiet is how long a joiner that no seed answers waits before it
// warns, and seedWarnEvery how often it warns again.
const (
	seedQuiet     = time.Second
	seedWarnEvery = 10 * time.Second
)

// errJobGone: the starter, pending to join a running job, saw gossip
// list none of the job's workers in a view for jobGoneGrace (the job
// ended, or died, while the starter restarted), so it starts the job.
var errJobGone = errors.New("gyre: the job's workers are gone from gossip")

const jobGoneGrace = 5 * time.Second

// admitPoll paces the admission rounds before iteration 0.
const admitPoll = 100 * time.Millisecond

// joinGossip is Join with gossip membership.
func (w *Worker) joinGossip(ctx context.Context) error {
	start := time.Now()
	cfg := w.cfg
	sec, err := cfg.Secret()
	if err != nil {
		return err
	}
	self := w.self()
	w.node, err = membership.Start(membership.Config{Name: cfg.Name, Listen: cfg.Listen, Advertise: cfg.Advertise,
		Key: sec.GossipKey(), Meta: w.nodeMeta(0, -1), Local: cfg.GossipTiming == GossipLocal,
		ProbeInterval: cfg.GossipProbeInterval, SuspicionMult: cfg.GossipSuspicionMult, Logger: w.log, Block: w.gossipCut})
	if err != nil {
		return err
	}
	w.meta = newMetaPublisher(w.node, w.log)
	w.log.Info().Str("gossip", w.node.Addr()).Str("data", self.Addr).Str("job", cfg.Job).Msg("gossip started")
	prestart, starting := true, len(cfg.Seeds) == 0
	if !starting {
		if starting, err = w.joinSeeds(ctx); err != nil {
			return err
		}
		if !starting {
			w.log.Info().Strs("seeds", w.seeds).Msg("gossip joined; pending until a boundary admits this worker")
		}
		if w.namedSeed {
			// With one seed list for all, the workers that joined before
			// the starter came up may only know each other: join through
			// the seeds again until admitted, and through prestart's
			// admissions, which gossip feeds.
			defer w.regossip(ctx, nil)()
		}
	}
	for !starting {
		wel, err := w.awaitWelcome(ctx, w.starter)
		if errors.Is(err, errJobGone) {
			w.log.Info().Dur("after", jobGoneGrace).Msg("this worker is the first seed and gossip lists the job's workers in no view any more: starting the job")
			starting = true
			break
		}
		if err != nil {
			return err
		}
		err = w.enterView(ctx, wel, start)
		if err == nil {
			prestart = wel.Prestart
			break
		}
		if !lostPeer(err) || ctx.Err() != nil {
			return err
		}
		// The members recover without this worker, and admit it later.
		w.log.Warn().Err(err).Msg("a member was lost while this worker was being admitted; pending again")
		w.backToPending(peerIDs(wel.Members))
	}
	if starting {
		err := w.installView(ctx, newView{epoch: 1, members: []member{self}, shares: EqualShares(cfg.GlobalBatch, 1),
			iter: w.iter, what: "the new job's view", sync: syncAlone})
		if err != nil {
			return err
		}
		w.log.Info().Str("seed", w.node.Addr()).Msg("started a new job: others join it with --seed")
	}
	w.adm = startAdmissions(w.t, w.node, cfg.Job, self.ID, w.fitting(), w.cur.members, w.handshakeNote,
		w.log.With().Str("component", "admission").Logger())
	for prestart {
		if prestart, err = w.admit(ctx); err != nil {
			return err
		}
	}
	return nil
}

// self is this worker as a view member: its name and advertised data
// address, with the port the transport bound.
func (w *Worker) self() member {
	id := transport.PeerID(w.cfg.Name)
	l, ok := w.t.(transport.Listener)
	if !ok {
		return member{ID: id, Addr: w.cfg.AdvertisedData()}
	}
	addr := l.Addr()
	if !w.ownT {
		return member{ID: id, Addr: addr} // a given transport's own address
	}
	if _, port, err := net.SplitHostPort(addr); err == nil {
		addr = net.JoinHostPort(w.cfg.Advertise, port)
	}
	return member{ID: id, Addr: addr}
}

// nodeMeta is this worker's gossip metadata at epoch and rank (0 and -1:
// pending).
func (w *Worker) nodeMeta(epoch uint64, rank int) membership.Meta {
	return membership.Meta{DataAddr: w.self().Addr, Job: w.cfg.Job, Protocol: protocolVersion,
		Role: membership.RoleWorker, Epoch: epoch, Rank: int32(rank), Device: kernels.Probe().String()}
}

// joinSeeds joins gossip through the seeds, retrying while they start,
// and reports whether this worker, the first seed, is to start the job
// (seeds.go). A seed that answers with another cluster secret fails at
// once.
func (w *Worker) joinSeeds(ctx context.Context) (start bool, err error) {
	var warned time.Time
	began := time.Now()
	for attempt := 0; ; attempt++ {
		others, named, starter := seedRoles(w.cfg.Seeds, w.selfSeeds(ctx, w.cfg.Seeds))
		w.seeds, w.namedSeed, w.starter = others, named, starter
		if len(others) == 0 {
			w.log.Info().Strs("seeds", w.cfg.Seeds).Msg("the only seed is this worker: starting the job")
			return true, nil
		}
		answers, err := w.joinEach(ctx, others, starter)
		if err != nil && isKeyMismatch(err) {
			return false, fmt.Errorf("gyre: joining through %v: a seed does not hold this cluster secret (gossip could not be decrypted): %w",
				others, err)
		}
		if ctx.Err() != nil {
			return false, fmt.Errorf("gyre: no seed of %v answered: %w; last attempt: %v", others, w.joinEnded(ctx), err)
		}
		running := runningJob(jobWorkers(w.node.Members(), w.cfg.Job), w.cfg.Name)
		step := nextSeedStep(starter, answers, running, time.Since(began) < starterPatience)
		switch {
		case step == stepStart:
			// err, if any, says which seeds did not answer.
			w.log.Info().Err(err).Strs("seeds", others).Msg("this worker is the first seed and no other seed is in a job: starting the job")
			return true, nil
		case step == stepPend && starter:
			w.log.Info().Strs("seeds", others).Msg("this worker is the first seed and the job is running: joining it")
			return false, nil
		case step == stepPend:
			return false, nil
		}
		// A warning after seedQuiet and then every seedWarnEvery: a seed
		// started with its joiners answers within moments, but a wrong
		// address should not wait out JoinTimeout in silence.
		ev := w.log.Debug()
		if time.Since(began) >= seedQuiet && time.Since(warned) >= seedWarnEvery {
			ev, warned = w.log.Warn(), time.Now()
		}
		deadline, _ := ctx.Deadline()
		msg := "no seed answers yet; retrying"
		if starter {
			msg = "this worker is the first seed; waiting for the seeds that do not answer, which may be in the job"
		}
		ev.Err(err).Strs("seeds", others).Int("attempts", attempt+1).Time("until", deadline).Msg(msg)
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			return false, fmt.Errorf("gyre: no seed of %v answered: %w; last attempt: %v", others, w.joinEnded(ctx), err)
		}
	}
}

// protocolMismatch says, with a leading "; ", that gossip lists workers of
// this job that speak another protocol version, which this worker ignores,
// or returns "".
func (w *Worker) protocolMismatch() string {
	var others []string
	for _, m := range w.node.Members() {
		if m.MetaErr == nil && m.Meta.Role == membership.RoleWorker && m.Meta.Job == w.cfg.Job && m.Meta.Protocol != protocolVersion {
			others = append(others, fmt.Sprintf("%s (protocol %d)", m.Name, m.Meta.Protocol))
		}
	}
	if len(others) == 0 {
		return ""
	}
	slices.Sort(others)
	return fmt.Sprintf("; gossip lists worker(s) of job %q that speak another protocol version than this worker's %d, and ignores them: %s (run the same gyre version everywhere)",
		w.cfg.Job, protocolVersion, strings.Join(others, ", "))
}

// isKeyMismatch recognises memberlist's errors for gossip it cannot
// decrypt or that is not encrypted as it requires.
func isKeyMismatch(err error) bool {
	msg := err.Error()
	for _, s := range []string{"decrypt", "No installed keys", "encryption", "Encryption"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// gossipMembers reads gossip: the workers of this job it lists live, the
// pending ones not in vs, and those in some view but not in vs. Of the
// latter it keeps those at the newest epoch gossip lists: a member left
// at an older one died, or a recovery is dropping it, and gossip lists
// it until it declares it dead, seconds later. A joiner that waited to
// reach it stayed pending that long (a job with a few seconds left
// finished without it).
func (w *Worker) gossipMembers(vs *viewState) (live map[transport.PeerID]bool, pending, inView []member) {
	live = make(map[transport.PeerID]bool)
	self := transport.PeerID(w.cfg.Name)
	var viewed []gossipWorker
	newest := uint64(0)
	for _, m := range jobWorkers(w.node.Members(), w.cfg.Job) {
		live[m.ID] = true
		switch {
		case m.ID == self, vs != nil && vs.rankOf(m.ID) >= 0, w.departed[m.ID] == m.Addr:
		case m.epoch == 0:
			pending = append(pending, m.member)
		default:
			viewed = append(viewed, m)
			newest = max(newest, m.epoch)
		}
	}
	for _, m := range viewed {
		if m.epoch == newest {
			inView = append(inView, m.member)
		}
	}
	return live, pending, inView
}

// membershipRecord fills rec's membership fields: the leave request, the
// worker bounds and the pending joiners this worker may list (see
// admissions.ready), which it returns by hash.
func (w *Worker) membershipRecord(rec *record) map[uint64]member {
	rec.leave = w.leaveReq.Load()
	rec.minWorkers, rec.maxWorkers = int64(w.cfg.MinWorkers), int64(w.cfg.MaxWorkers)
	if w.node == nil {
		return nil
	}
	w.forgetDeparted()
	live, pending, _ := w.gossipMembers(w.cur)
	w.joiners = len(pending)
	for id := range w.departed {
		if !live[id] || slices.ContainsFunc(pending, func(m member) bool { return m.ID == id }) {
			delete(w.departed, id) // gossip has seen it go, or it is back elsewhere
		}
	}
	ready := w.adm.ready()
	rec.joiners = listJoiners(ready, uint64(rec.iter))
	known := make(map[uint64]member, len(ready))
	for _, m := range ready {
		known[joinerHash(m)] = m
	}
	return known
}

// admit runs one admission round before iteration 0 and reports whether
// more are needed: the view is still below the largest MinWorkers.
func (w *Worker) admit(ctx context.Context) (bool, error) {
	select {
	case <-time.After(admitPoll):
	case <-ctx.Done():
		return false, fmt.Errorf("gyre: waiting for %d workers before iteration 0 (the view has %d): %w",
			w.cfg.MinWorkers, w.Size(), w.joinEnded(ctx))
	}
	vs := w.cur
	rec := record{kind: kindAdmit, iter: w.iter, decision: w.decisionDigest()}
	known := w.membershipRecord(&rec)
	recs, err := w.vote(ctx, vs, rec)
	if err != nil {
		return false, err
	}
	var errs []error
	for r, got := range recs {
		if got.decision != rec.decision {
			errs = append(errs, fmt.Errorf("%w: rank %d (%s) runs a different view or shares", ErrDiverged, r, vs.ids[r]))
		}
	}
	if err := w.settle(ctx, vs, errors.Join(errs...)); err != nil {
		return false, err
	}
	d, err := decideView(w.iter, vs.members, recs, known, w.batchFit())
	if err != nil {
		return false, w.settle(ctx, vs, err)
	}
	w.noteCapped(d)
	if d.Changed {
		if err := w.changeView(ctx, d, w.iter, !d.Start); err != nil {
			return false, err
		}
		if w.left {
			return false, ErrClosed
		}
	}
	return !d.Start, nil
}

// noteCapped says when the number of joiners that MaxWorkers keeps
// pending changes.
func (w *Worker) noteCapped(d viewDecision) {
	if d.Capped == w.capped {
		return
	}
	w.capped = d.Capped
	if d.Capped == 0 {
		w.log.Info().Int("world", len(d.Members)).Msg("no listed joiner is kept pending any more")
		return
	}
	w.log.Warn().Int("waiting", d.Capped).Int("max_workers", w.cfg.MaxWorkers).Int("global_batch", w.cfg.GlobalBatch).
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
func (w *Worker) changeView(ctx context.Context, d viewDecision, iter int64, prestart bool) error {
	old := w.cur
	self := old.ids[old.rank]
	leaving := slices.ContainsFunc(d.Left, func(m member) bool { return m.ID == self })
	next := recovery.View{Epoch: old.view.Epoch + 1}
	for _, m := range d.Members {
		next.Members = append(next.Members, recovery.ID(m.ID))
	}
	joiners := viewJoiners(iter, d.Admitted)
	for _, id := range joiners {
		next.Joiners = append(next.Joiners, recovery.ID(id))
	}
	if w.rec != nil && !leaving {
		// Holding the table is round 0's accept: a recovery that begins
		// before the barrier ends finds it (docs/recovery.md).
		w.rec.know(d.Members)
		w.rec.rank.Decided(next)
	}
	if err := old.ctrl.Barrier(ctx); err != nil && !leaving {
		return w.lost(old, iter-1, err)
	}
	if w.rec != nil && !leaving {
		w.rec.rank.Advanced(next, w.rec.rank.Commit())
	}
	if leaving {
		// The decision stands even if the barrier failed: every member
		// holds the table it came from. Before closing, wait for the
		// others' farewells: a transport hands messages to the network
		// without confirming delivery, and closing at once could cut off
		// the last messages of this worker's barrier.
		w.left = true
		fctx, cancel := context.WithTimeout(ctx, w.cfg.CollectiveTimeout)
		if err := w.live.Farewell(fctx, w.cfg.PeerTimeout); err != nil {
			w.log.Debug().Err(err).Msg("waiting for the farewells of the members that stay")
		}
		cancel()
		w.log.Info().Int64("iter", iter).Msg("left the job at the boundary, as requested")
		return errors.Join(w.leaveGossip(), w.Close())
	}
	if len(d.Left) > 0 {
		// This member's barrier is done: it needs nothing more from the
		// leavers, which wait for that before they close.
		fctx, cancel := context.WithTimeout(ctx, w.cfg.PeerTimeout)
		if err := w.live.Dismiss(fctx, peerIDs(d.Left)); err != nil {
			w.log.Debug().Err(err).Msg("saying farewell to the members that left")
		}
		cancel()
	}
	w.forgetDeparted()
	// A new view starts from the shares the members' fitted models give
	// (a joiner, with none, an equal share) and a fresh balance state,
	// which a joiner has too.
	epoch, shares := old.view.Epoch+1, w.startShares(peerIDs(d.Members), w.fits)
	var oldRanks []int
	for r, m := range d.Members {
		if old.rankOf(m.ID) >= 0 {
			oldRanks = append(oldRanks, r)
		}
	}
	for _, m := range d.Left {
		// Gossip may list it, with its metadata of before it joined, for a
		// while yet: it must not look like a joiner.
		w.departed[m.ID] = m.Addr
		w.forget = append(w.forget, m.ID)
	}
	// The joiners' handshakes end before anything of the view change
	// touches their links.
	w.adm.setView(d.Members)
	wel := welcome{Version: welcomeVersion, Epoch: epoch, Iter: iter, Members: d.Members, Shares: shares,
		Old: oldRanks, Prestart: prestart}
	// Every joiner answered every member moments ago, so these connects
	// take milliseconds; ConnectTimeout keeps one that has become
	// unreachable since from holding up the job.
	cctx, cancel := context.WithTimeout(ctx, w.cfg.ConnectTimeout)
	defer cancel()
	for _, j := range d.Admitted {
		if err := w.sendWelcome(cctx, j, slices.Index(d.Members, j), wel); err != nil {
			return err
		}
	}
	sync := syncSettle
	if len(d.Admitted) > 0 {
		sync = syncState
	}
	err := w.installView(ctx, newView{epoch: epoch, members: d.Members, shares: shares, bandwidth: old.data.Bandwidth(),
		joiners: joiners, iter: iter, what: fmt.Sprintf("the view of epoch %d", epoch), sync: sync, root: oldRanks[0]})
	if err != nil {
		return err
	}
	ev := w.log.Info().Uint64("epoch", epoch).Int("world", len(d.Members)).Int64("iter", w.iter)
	if len(d.Admitted) > 0 {
		ev = ev.Strs("admitted", memberIDs(d.Admitted))
	}
	if len(d.Left) > 0 {
		ev = ev.Strs("left", memberIDs(d.Left))
	}
	if d.Promoted {
		ev = ev.Bool("joiners_vote", true)
	}
	ev.Msg("view changed")
	if !prestart && len(d.Members) < w.cfg.MinWorkers {
		w.log.Warn().Int("world", len(d.Members)).Int("min_workers", w.cfg.MinWorkers).
			Msg("the view shrank below MinWorkers, which gates iteration 0 only; training goes on")
	}
	return nil
}

// viewJoiners are the joiners that a view admitting admitted at iter
// keeps out of its recoveries' majorities: they hold none of its state
// until the view's state broadcast ends. Before iteration 0 nobody holds
// any, and every member of the first view votes, so that losing the
// seed worker is survived like losing any other.
func viewJoiners(iter int64, admitted []member) []transport.PeerID {
	if iter == 0 {
		return nil
	}
	return peerIDs(admitted)
}

// memberIDs returns the members' IDs, nil for none.
func memberIDs(ms []member) []string {
	if len(ms) == 0 {
		return nil
	}
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = string(m.ID)
	}
	return out
}

// forgetDeparted releases the transport's records of the members that
// left at an earlier boundary. Not at once: a leaver may still be
// forwarding the last messages of its final barrier.
func (w *Worker) forgetDeparted() {
	f, ok := w.t.(transport.Forgetter)
	if !ok || len(w.forget) == 0 || w.cur.members == nil {
		return
	}
	for _, id := range w.forget {
		if w.cur.rankOf(id) < 0 {
			f.Forget(id)
			// Dialled afresh if it comes back, and a handshake with it
			// already under way begins again.
			delete(w.dialled, id)
			w.adm.reset(id)
		}
	}
	w.forget = w.forget[:0]
}

// leaveGossip tells gossip this worker leaves, so the others list it as
// left rather than dead. When the whole job ends together nobody may be
// left to hear it, which is no error.
func (w *Worker) leaveGossip() error {
	if w.node == nil {
		return nil
	}
	w.meta.stop()
	if err := w.node.Leave(time.Second); err != nil {
		w.log.Debug().Err(err).Msg("leaving gossip")
	}
	return nil
}

// welcomeVersion is the welcome's encoding version.
const welcomeVersion = 1

// welcome is what the members send a joiner they admitted: the view it
// enters and where the job is.
type welcome struct {
	Version int
	Epoch   uint64
	// Iter is the iteration the view runs next.
	Iter    int64
	Members []member
	Shares  []int
	// Old are the ranks of the members of the previous view, each of
	// which sends a welcome; the first is the state broadcast's root.
	Old []int
	// Prestart says admission rounds go on before iteration 0.
	Prestart bool
}

// welcomeFlag marks a welcome in the header's Flags, apart from the ring's
// control messages.
const welcomeFlag = 0x80

// sendWelcome connects to joiner j, rank in the view wel describes, and
// sends it wel on the control channel, within ctx.
func (w *Worker) sendWelcome(ctx context.Context, j member, rank int, wel welcome) error {
	fail := func(err error) error {
		return fmt.Errorf("gyre: welcoming joiner %s at %s (rank %d of epoch %d; ConnectTimeout %v, --connect-timeout): %w",
			j.ID, j.Addr, rank, wel.Epoch, w.cfg.ConnectTimeout, err)
	}
	w.redialIfMoved(j.ID, j.Addr)
	// A worker back after the job recovered without it may have left
	// streams here since this member forgot it: an abort marker it sent
	// on resuming, say, that nothing has read. Marked left behind, they
	// give way to its streams of the new view instead of ending in a
	// failed receive when it closes them.
	if ro, ok := w.t.(transport.Reopener); ok {
		ro.Reopen(j.ID, transport.ChanData)
		ro.Reopen(j.ID, transport.ChanControl)
	}
	if err := connectPeer(ctx, w.t, j.ID, j.Addr, nil); err != nil {
		return fail(err)
	}
	w.dialled[j.ID] = j.Addr
	b, err := json.Marshal(wel)
	if err != nil {
		return err
	}
	hdr := wire.Header{Kind: wire.KindControl, Flags: welcomeFlag, Epoch: wel.Epoch}
	if err := w.t.Send(ctx, j.ID, transport.ChanControl, hdr, b); err != nil {
		return fail(err)
	}
	return nil
}

// maxWelcome bounds a welcome's JSON: MaxView members of about 100 bytes
// each, and their shares, fit with room to spare. A joiner listens to
// every member at once, so each buffer counts.
const maxWelcome = 64 << 10

// recvWelcome reads one welcome from peer on the control channel.
func (w *Worker) recvWelcome(ctx context.Context, peer transport.PeerID) (welcome, error) {
	buf := make([]byte, maxWelcome)
	h, n, err := w.t.Recv(ctx, peer, transport.ChanControl, buf)
	if err != nil {
		return welcome{}, err
	}
	if h.Kind != wire.KindControl || h.Flags != welcomeFlag {
		return welcome{}, fmt.Errorf("gyre: %s sent a %v message where its welcome was due", peer, h.Kind)
	}
	var wel welcome
	if err := json.Unmarshal(buf[:n], &wel); err != nil {
		return welcome{}, fmt.Errorf("gyre: welcome from %s: %w", peer, err)
	}
	if wel.Version != welcomeVersion {
		return welcome{}, fmt.Errorf("gyre: welcome from %s has version %d, this worker reads %d", peer, wel.Version, welcomeVersion)
	}
	return wel, nil
}

// awaitWelcome waits, pending, until the members admit this worker, and
// returns the welcome. Meanwhile it runs the admission handshake with
// every member gossip lists (handshakes), and fails if one refuses this
// worker. It listens to every worker gossip lists in a view;
// once one welcome arrives it reads the others' too, so that the control
// channels are past them before the new view's votes, and checks that
// they agree. With startIfGone (the starter, at Join) it returns
// errJobGone once gossip has listed no worker of the job in a view for
// jobGoneGrace.
func (w *Worker) awaitWelcome(ctx context.Context, startIfGone bool) (welcome, error) {
	type result struct {
		from transport.PeerID
		wel  welcome
		err  error
	}
	results := make(chan result)
	listening := map[transport.PeerID]context.CancelFunc{}
	got := map[transport.PeerID]welcome{}
	listen := func(id transport.PeerID) {
		lctx, cancel := context.WithCancel(ctx)
		listening[id] = cancel
		go func() {
			wel, err := w.recvWelcome(lctx, id)
			results <- result{id, wel, err}
		}()
	}
	collect := func(r result) error {
		listening[r.from]()
		delete(listening, r.from)
		if r.err == nil {
			got[r.from] = r.wel
			return nil
		}
		if ctx.Err() != nil || errors.Is(r.err, context.Canceled) {
			return nil
		}
		return r.err
	}
	defer func() { // stop the listeners left, and wait for them
		for _, cancel := range listening {
			cancel()
		}
		for range listening {
			<-results
		}
	}()
	hs := startHandshakes(w.t, joinRequest{Version: joinVersion, Addr: w.self().Addr, Fit: w.fitting()},
		w.log.With().Str("component", "admission").Logger())
	defer hs.close() // idempotent; the first welcome ends the handshakes already
	tick := time.NewTicker(admitPoll)
	defer tick.Stop()
	var first welcome
	since, noted, lastRunning := time.Now(), time.Now(), time.Now()
	for len(got) == 0 {
		_, _, inView := w.gossipMembers(nil)
		hs.retain(inView)
		if err := hs.refused(); err != nil {
			return welcome{}, err
		}
		if startIfGone {
			if runningJob(jobWorkers(w.node.Members(), w.cfg.Job), w.cfg.Name) {
				lastRunning = time.Now()
			} else if time.Since(lastRunning) >= jobGoneGrace {
				return welcome{}, errJobGone
			}
		}
		if time.Since(noted) >= w.handshakeNote {
			noted = time.Now()
			hs.note(time.Since(since), w.protocolMismatch())
			if e := w.log.Debug(); e.Enabled() {
				var seen []string
				for _, m := range jobWorkers(w.node.Members(), w.cfg.Job) {
					seen = append(seen, fmt.Sprintf("%s@%d", m.ID, m.epoch))
				}
				e.Strs("workers", seen).Msg("pending: the job's workers in gossip, with their epochs (0: pending)")
			}
		}
		for _, m := range inView {
			if listening[m.ID] == nil {
				listen(m.ID)
			}
		}
		select {
		case r := <-results:
			if err := collect(r); err != nil {
				w.log.Debug().Err(err).Str("peer", string(r.from)).Msg("listening for a welcome")
			}
		case <-tick.C:
		case <-ctx.Done():
			msg, _, _, _ := hs.status()
			if len(inView) == 0 {
				msg += w.protocolMismatch()
			}
			return welcome{}, fmt.Errorf("gyre: no boundary admitted this worker; %s: %w", msg, w.joinEnded(ctx))
		}
	}
	hs.close() // admitted: nothing more to say on the join channel
	for _, wel := range got {
		first = wel
	}
	need := map[transport.PeerID]bool{}
	for _, r := range first.Old {
		if r >= 0 && r < len(first.Members) {
			need[first.Members[r].ID] = true
		}
	}
	for id, cancel := range listening {
		if !need[id] {
			cancel() // not a member of the old view: it sends no welcome
		}
	}
	for len(listening) > 0 {
		if err := collect(<-results); err != nil {
			return welcome{}, err
		}
	}
	for id := range need {
		if _, ok := got[id]; ok {
			continue
		}
		wel, err := w.recvWelcome(ctx, id)
		if err != nil {
			return welcome{}, fmt.Errorf("gyre: waiting for the welcome of %s: %w", id, err)
		}
		got[id] = wel
	}
	for id, wel := range got {
		if !need[id] || wel.Epoch != first.Epoch || !slices.Equal(wel.Members, first.Members) || wel.Iter != first.Iter {
			return welcome{}, fmt.Errorf("%w: the welcomes of the members disagree (%s sent epoch %d)", ErrDiverged, id, wel.Epoch)
		}
	}
	return first, nil
}

// enterView makes this joiner a member of the view its welcome describes,
// and takes the state from the root. start is when Join began.
func (w *Worker) enterView(ctx context.Context, wel welcome, start time.Time) error {
	self := w.self()
	rank := slices.IndexFunc(wel.Members, func(m member) bool { return m.ID == self.ID })
	switch {
	case rank < 0:
		return fmt.Errorf("gyre: the welcome's view does not list this worker (%s)", self.ID)
	case wel.Members[rank].Addr != self.Addr:
		return fmt.Errorf("gyre: the welcome lists this worker at %s, but it is at %s", wel.Members[rank].Addr, self.Addr)
	case len(wel.Old) == 0 || len(wel.Shares) != len(wel.Members):
		return fmt.Errorf("gyre: malformed welcome: %d members, %d shares, %d old members", len(wel.Members), len(wel.Shares), len(wel.Old))
	}
	var admitted []member
	for r, m := range wel.Members {
		if !slices.Contains(wel.Old, r) {
			admitted = append(admitted, m)
		}
	}
	err := w.installView(ctx, newView{epoch: wel.Epoch, members: wel.Members, shares: wel.Shares,
		joiners: viewJoiners(wel.Iter, admitted), iter: wel.Iter,
		what: fmt.Sprintf("the view of epoch %d that admitted this worker", wel.Epoch), sync: syncState, root: wel.Old[0]})
	if err != nil {
		return err
	}
	w.log.Info().Uint64("epoch", wel.Epoch).Int("world", len(wel.Members)).Int64("iter", w.iter).
		Dur("since_join", time.Since(start)).Msg("admitted")
	return nil
}

// metaPublisher gossips this worker's metadata in the background, the
// latest value winning, so a view change never waits on gossip.
type metaPublisher struct {
	node   *membership.Node
	log    zerolog.Logger
	mu     sync.Mutex
	latest *membership.Meta
	kick   chan struct{}
	done   chan struct{}
	once   sync.Once
	wg     sync.WaitGroup
}

func newMetaPublisher(node *membership.Node, log zerolog.Logger) *metaPublisher {
	p := &metaPublisher{node: node, log: log, kick: make(chan struct{}, 1), done: make(chan struct{})}
	p.wg.Add(1)
	go p.run()
	return p
}

// publish gossips m in the background; with no gossip (p nil, the static
// view) it does nothing.
func (p *metaPublisher) publish(m membership.Meta) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.latest = &m
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

func (p *metaPublisher) run() {
	defer p.wg.Done()
	for {
		select {
		case <-p.kick:
		case <-p.done:
			return
		}
		p.mu.Lock()
		m := p.latest
		p.mu.Unlock()
		if err := p.node.UpdateMeta(*m, 2*time.Second); err != nil {
			p.log.Debug().Err(err).Msg("gossiping metadata")
		}
	}
}

// stop ends publishing; it is idempotent.
func (p *metaPublisher) stop() {
	if p == nil {
		return
	}
	p.once.Do(func() { close(p.done) })
	p.wg.Wait()
}

// peerIDs returns the transport IDs of ms.
func peerIDs(ms []member) []transport.PeerID {
	ids := make([]transport.PeerID, len(ms))
	for i, m := range ms {
		ids[i] = m.ID
	}
	return ids
}
