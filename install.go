package gyre

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/gyre-ml/gyre/balance"
	"github.com/gyre-ml/gyre/internal/recovery"
	"github.com/gyre-ml/gyre/transport"
)

// newView is a view to install and how its members come to hold one
// state: the one description every view change gives installView, be it
// Join's first view, a boundary's, a joiner's welcome or a recovery's.
type newView struct {
	epoch   uint64
	members []member
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
	// holder, and its balance models (installRecovered checks it).
	syncRecovered
)

// installView makes nv the current view: it builds the view's
// communicators, makes it current with its iteration and a fresh balance
// state, connects its members, brings them one state as nv.sync says,
// and gossips the new epoch and rank. Every view change goes through it,
// so these steps happen in one order everywhere. The view is current even
// if a later step fails: the caller recovers from it, or closes it.
func (w *Worker) installView(ctx context.Context, nv newView) error {
	self := transport.PeerID(w.cfg.Name)
	rank := slices.IndexFunc(nv.members, func(m member) bool { return m.ID == self })
	if rank < 0 {
		return fmt.Errorf("gyre: %s does not list this worker (%s)", nv.what, self)
	}
	if nv.sync == syncRecovered {
		w.fail(FailInstall)
	}
	vs, err := w.newViewState(nv.epoch, nv.members, rank, nv.shares, nv.bandwidth)
	if err != nil {
		return err
	}
	vs.joiners = nv.joiners
	w.setView(vs)
	w.setIter(nv.iter)
	w.bst = balance.State{}
	if err := w.bringUp(ctx, vs, nv); err != nil {
		return err
	}
	// The first boundary of a view checks the state: a member that took
	// it has just received it.
	w.nextCheck, w.lastVote = w.iter, time.Now()
	w.meta.publish(w.nodeMeta(nv.epoch, rank))
	return nil
}

// bringUp connects the members of vs, the view nv describes, and brings
// them one state.
func (w *Worker) bringUp(ctx context.Context, vs *viewState, nv newView) error {
	if nv.sync == syncAlone {
		return w.state.commit(w.iter)
	}
	if nv.sync == syncRecovered {
		// Nothing of the old view's collectives is read again.
		w.reopenLinks(vs)
		// A view chosen before a further loss may hold a member already
		// gone: recover from it at once rather than dial it for
		// ConnectTimeout.
		for r, id := range vs.ids {
			if r != vs.rank && w.silent(id) {
				return fmt.Errorf("gyre: %s holds rank %d (%s), already lost: %w", nv.what, r, id, transport.ErrPeerGone)
			}
		}
		// Every member was heard as the view was agreed. One that falls
		// silent since has died too: recover again without it at once
		// rather than dial it, or wait on its state, until ConnectTimeout.
		var stop func()
		ctx, stop = w.watchMembers(ctx, vs)
		defer stop()
	}
	cctx, cancel := ctx, context.CancelFunc(func() {})
	if !nv.patient {
		// Every member answered every other moments ago, so these
		// connects take milliseconds; ConnectTimeout keeps one that has
		// become unreachable since from holding up the job.
		cctx, cancel = context.WithTimeout(ctx, w.cfg.ConnectTimeout)
	}
	err := w.connectView(cctx, vs)
	cancel()
	if err != nil {
		if nv.patient {
			if ctx.Err() != nil {
				return fmt.Errorf("%w; %v", err, w.joinEnded(ctx))
			}
			return err
		}
		return fmt.Errorf("gyre: connecting %s (ConnectTimeout %v, --connect-timeout): %w", nv.what, w.cfg.ConnectTimeout, silentCause(ctx, err))
	}
	switch nv.sync {
	case syncSettle:
		return w.settleView(ctx)
	case syncState:
		return w.syncView(ctx, nv.root)
	}
	return silentCause(ctx, w.takeRecovered(ctx, nv.root, nv.winner))
}

// syncView makes every member of the current view agree on the settings,
// orders its ring, has every member hold root's state and iteration, and
// commits it: the end of Join, and of a boundary that admitted workers.
func (w *Worker) syncView(ctx context.Context, root int) error {
	if err := w.settleView(ctx); err != nil {
		return err
	}
	if err := w.confirm(ctx, w.syncState(ctx, root), root); err != nil {
		return err
	}
	return w.state.commit(w.iter)
}

// settleView readies a new view's members: they check their settings
// agree, cap the view's first shares at their device memory, and order
// the ring.
func (w *Worker) settleView(ctx context.Context) error {
	if err := w.agree(ctx); err != nil {
		return err
	}
	return w.arrangeRing(ctx)
}

// setView makes vs the current view, closing the previous one.
func (w *Worker) setView(vs *viewState) {
	w.mu.Lock()
	old := w.cur
	w.cur = vs
	w.mu.Unlock()
	w.view.Store(vs)
	w.rank.Store(int64(vs.rank))
	w.adm.setView(vs.members)
	if old != nil {
		old.close()
	}
}
