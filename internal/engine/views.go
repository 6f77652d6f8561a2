package engine

import (
	"context"
	"fmt"
	"math"
	"net"
	"slices"
	"time"

	"github.com/gyre-ml/gyre/internal/config"
	"github.com/gyre-ml/gyre/internal/probe"
	"github.com/gyre-ml/gyre/internal/recoverer"
	"github.com/gyre-ml/gyre/internal/recovery"
	"github.com/gyre-ml/gyre/internal/view"
	"github.com/gyre-ml/gyre/internal/vote"
	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/transport"
)

// newView is a view to install and how its members come to hold one
// state: the one description every view change gives installView, be it
// Join's first view, a boundary's, a joiner's welcome or a recovery's.
type newView struct {
	epoch   uint64
	members []vote.Member
	shares  []int
	// bandwidth is the previous view's measured estimate (0: none), so a
	// new ring does not start from the default.
	bandwidth float64
	// joiners are the members this view first adds: they vote in no
	// recovery from it until they hold its state.
	joiners []transport.PeerID
	// iter is the iteration the view runs next.
	iter int64
	// what names the view in errors: "the view of epoch 3".
	what string
	// patient connects within ctx (Join's timeout: static peers start when
	// they start) rather than ConnectTimeout.
	patient bool
	sync    viewSync
	// root is the rank whose state the others take (syncState,
	// syncRecovered), and winner the commit it reported holding
	// (syncRecovered).
	root   int
	winner recovery.Commit
}

// viewSync is how the members of a new view come to hold one state.
type viewSync int

const (
	// syncAlone: a view of one commits what it holds.
	syncAlone viewSync = iota
	// syncSettle: the members keep their state; they check their settings
	// agree and order the ring.
	syncSettle
	// syncState: as syncSettle, then everyone takes root's state (a view
	// with joiners, Join's static view).
	syncState
	// syncRecovered: everyone takes the winning commit from root, its
	// holder, and its balance models (takeRecovered checks it).
	syncRecovered
)

// installView makes nv the current view: it builds the view's
// communicators, makes it current with its iteration and a fresh balance
// state, connects its members, brings them one state as nv.sync says,
// and gossips the new epoch and rank. Every view change goes through it,
// so these steps happen in one order everywhere. The view is current even
// if a later step fails: the caller recovers from it, or closes it.
func (e *Engine) installView(ctx context.Context, nv newView) error {
	self := e.self().ID
	rank := slices.IndexFunc(nv.members, func(m vote.Member) bool { return m.ID == self })
	if rank < 0 {
		return fmt.Errorf("gyre: %s does not list this worker (%s)", nv.what, self)
	}
	if nv.sync == syncRecovered {
		e.fail(config.FailInstall)
	}
	v, err := e.builder().Build(nv.epoch, nv.members, rank, nv.shares, nv.bandwidth)
	if err != nil {
		return err
	}
	v.Joiners = nv.joiners
	e.setView(v)
	e.setIter(nv.iter)
	e.bal.Reset()
	if err := e.bringUp(ctx, v, nv); err != nil {
		return err
	}
	// The first boundary of a view checks the state: a member that took
	// it has just received it.
	e.it.nextCheck, e.it.lastVote = e.it.iter, time.Now()
	e.gossip.Publish(nv.epoch, rank)
	e.startPublishing(e.it.iter)
	return nil
}

// builder builds the views of this worker.
func (e *Engine) builder() view.Builder {
	fc := ring.FuserConfig{BucketBytes: e.cfg.BucketBytes}
	if bo, ok := e.rep.Observer.(ring.BucketObserver); ok {
		fc.Observer = bo
	}
	fc.Compress, fc.AutoCompress = config.Compressions[e.cfg.Compress], e.cfg.Compress == config.CompressAuto
	return view.Builder{T: e.links.T, Live: e.live, Fuser: fc, OnStall: e.onStall,
		Ring: ring.Config{Logger: e.plain, CollectiveTimeout: e.cfg.CollectiveTimeout, PeerTimeout: e.cfg.PeerTimeout,
			Liveness: e.live, SmallBytes: smallBytes(e.cfg.Algo), Observer: e.rep.Observer,
			StallThreshold: max(e.cfg.StallThreshold, 0)}}
}

// smallBytes is ring.Config.SmallBytes for Config.Algo.
func smallBytes(algo string) int {
	switch algo {
	case config.AlgoRing, config.AlgoHierarchical:
		return -1
	case config.AlgoDoubling:
		return math.MaxInt
	}
	return 0 // the cost model's threshold
}

// bringUp connects the members of v, the view nv describes, and brings
// them one state.
func (e *Engine) bringUp(ctx context.Context, v *view.View, nv newView) error {
	if nv.sync == syncAlone {
		return e.state.Commit(e.it.iter)
	}
	if nv.sync == syncRecovered {
		// Nothing of the old view's collectives is read again.
		e.links.Reopen(v.Others())
		// A view chosen before a further loss may hold a member already
		// gone: recover from it at once rather than dial it for
		// ConnectTimeout.
		for r, id := range v.IDs {
			if r != v.Rank && e.rec.Silent(id) {
				return fmt.Errorf("gyre: %s holds rank %d (%s), already lost: %w", nv.what, r, id, transport.ErrPeerGone)
			}
		}
		// Every member was heard as the view was agreed. One that falls
		// silent since has died too: recover again without it at once
		// rather than dial it, or wait on its state, until ConnectTimeout.
		var stop func()
		ctx, stop = e.rec.Watch(ctx, v.Epoch, v.IDs, v.Rank)
		defer stop()
	}
	cctx, cancel := ctx, context.CancelFunc(func() {})
	if !nv.patient {
		// Every member answered every other moments ago, so these
		// connects take milliseconds; ConnectTimeout keeps one that has
		// become unreachable since from holding up the job.
		cctx, cancel = context.WithTimeout(ctx, e.cfg.ConnectTimeout)
	}
	err := e.links.ConnectView(cctx, v)
	cancel()
	if err != nil {
		if nv.patient {
			if ctx.Err() != nil {
				return fmt.Errorf("%w; %v", err, e.joinEnded(ctx))
			}
			return err
		}
		return fmt.Errorf("gyre: connecting %s (ConnectTimeout %v, --connect-timeout): %w", nv.what, e.cfg.ConnectTimeout, silentCause(ctx, err))
	}
	switch nv.sync {
	case syncSettle:
		return e.settleView(ctx)
	case syncState:
		return e.syncView(ctx, nv.root)
	}
	return silentCause(ctx, e.takeRecovered(ctx, nv.root, nv.winner))
}

// syncView makes every member of the current view agree on the settings,
// orders its ring, has every member hold root's state and iteration, and
// commits it: the end of Join, and of a boundary that admitted workers.
func (e *Engine) syncView(ctx context.Context, root int) error {
	if err := e.settleView(ctx); err != nil {
		return err
	}
	if err := e.confirm(ctx, e.syncState(ctx, root), root); err != nil {
		return err
	}
	return e.state.Commit(e.it.iter)
}

// settleView readies a new view's members: they check their settings
// agree, cap the view's first shares at their device memory, and order
// the ring.
func (e *Engine) settleView(ctx context.Context) error {
	if err := e.agree(ctx); err != nil {
		return err
	}
	v := e.cur
	p, err := e.probe(ctx, v, e.it.iter)
	if err != nil {
		// A member lost in the probes is named as a loss anywhere else
		// is, and a worker that was itself stopped says so.
		if lostPeer(err) {
			if r, id, ok := e.blame(v, err); ok {
				return e.peerLostError(e.it.iter, r, id, err)
			}
		}
		return err
	}
	return v.SetProbed(p)
}

// probe measures v's links, where the configuration asks for it, before
// iteration at (a failpoint's iteration, and the probe messages'). The
// probes end as soon as a member falls silent, as a collective does: a
// pair's exchange would otherwise wait out its round timeout on a dead
// partner, and the members waiting on that pair would blame a live one.
func (e *Engine) probe(ctx context.Context, v *view.View, at int64) (view.Probed, error) {
	env := probe.Env{T: e.links.T, Order: e.cfg.RingOrder == config.RingOrderAuto,
		Tune:   e.cfg.Algo == config.AlgoAuto || e.cfg.Algo == config.AlgoHierarchical || e.cfg.Compress == config.CompressAuto,
		Always: e.cfg.Algo == config.AlgoHierarchical, Machine: e.opts.Test.Machine, Seq: uint64(at), Log: e.log,
		Fail: func() { e.failAt(config.FailProbe, at) }, Span: e.span}
	if _, ok := e.links.T.(transport.Striper); ok && e.cfg.Stripes == config.StripesAuto {
		env.Stripes = probe.AutoStripes
	}
	if e.live != nil {
		// A joiner has no Recoverer yet, and its probes too must end.
		env.Watch = func(ctx context.Context) (context.Context, func()) {
			return recoverer.Watch(ctx, e.live, e.cfg.PeerTimeout, v.Epoch, v.IDs, v.Rank)
		}
	}
	p, err := probe.Run(ctx, env, v)
	if err != nil || p.Stripes == nil {
		return p, err
	}
	if err := e.links.SetStripes(*p.Stripes, v.Others()); err != nil {
		return p, err
	}
	// No member sends data before every member reopened: a generation
	// that reached a member before its own Reopen would count as left
	// behind, and a peer's crash in it would wait for a successor
	// instead of failing the collective.
	if err := v.Ctrl.Barrier(ctx); err != nil {
		return p, fmt.Errorf("gyre: reopen the data channel after the link probes: %w", err)
	}
	return p, nil
}

// setView makes v the current view, closing the previous one.
func (e *Engine) setView(v *view.View) {
	e.mu.Lock()
	old := e.cur
	e.cur = v
	e.mu.Unlock()
	e.shared.Store(v)
	e.rank.Store(int64(v.Rank))
	e.adm.SetView(v.Members)
	if old != nil {
		old.Close()
	}
}

// self is this worker as a view member: its name and advertised data
// address, with the port the transport bound.
func (e *Engine) self() vote.Member {
	id := transport.PeerID(e.cfg.Name)
	l, ok := e.links.T.(transport.Listener)
	if !ok {
		return vote.Member{ID: id, Addr: e.cfg.AdvertisedData()}
	}
	addr := l.Addr()
	if !e.links.Own {
		return vote.Member{ID: id, Addr: addr} // a given transport's own address
	}
	if _, port, err := net.SplitHostPort(addr); err == nil {
		addr = net.JoinHostPort(e.cfg.Advertise, port)
	}
	return vote.Member{ID: id, Addr: addr}
}

// joinStatic joins the static view of cfg.Peers, in which a worker's name
// is its address.
func (e *Engine) joinStatic(ctx context.Context) error {
	cfg := e.cfg
	peers := cfg.Peers
	if len(peers) == 0 {
		peers = []string{cfg.Name}
	}
	if peers[cfg.Rank] != cfg.Name {
		return fmt.Errorf("%w: Name %q must be this worker's address in Peers, %q", config.ErrConfig, cfg.Name, peers[cfg.Rank])
	}
	members := make([]vote.Member, len(peers))
	for i, p := range peers {
		members[i] = vote.Member{ID: transport.PeerID(p), Addr: p}
	}
	return e.installView(ctx, newView{epoch: 1, members: members, shares: cfg.Shares, what: "the static view",
		patient: true, sync: syncState, root: 0})
}

// recoveryView is v as the recovery protocol sees it.
func recoveryView(v *view.View) recovery.View {
	rv := recovery.View{Epoch: v.Epoch}
	for _, id := range v.IDs {
		rv.Members = append(rv.Members, recovery.ID(id))
		if slices.Contains(v.Joiners, id) {
			rv.Joiners = append(rv.Joiners, recovery.ID(id))
		}
	}
	return rv
}

// commitOf is this worker's commit, as the recovery protocol sees it,
// made in the view of epoch.
func (e *Engine) commitOf(epoch uint64) recovery.Commit {
	return recovery.Commit{Epoch: epoch, Iter: uint64(e.it.iter)}
}
