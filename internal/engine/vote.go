package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gyre-ml/gyre/internal/admission"
	"github.com/gyre-ml/gyre/internal/config"
	"github.com/gyre-ml/gyre/internal/errs"
	"github.com/gyre-ml/gyre/internal/state"
	"github.com/gyre-ml/gyre/internal/view"
	"github.com/gyre-ml/gyre/internal/vote"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/transport"
)

// The vote's I/O: one allgather of a fixed-size record per worker on the
// view's control Comm (package vote holds the record and the verdicts),
// the settling barrier, and the votes of Join: the settings, the state
// broadcast and its confirmation.

// vote allgathers rec among the view's workers on the control Comm and
// returns every worker's record in rank order. A failed allgather means a
// worker is lost or the caller's ctx ended.
func (e *Engine) vote(ctx context.Context, v *view.View, rec vote.Record) ([]vote.Record, error) {
	n := len(v.IDs)
	table := make([]int64, n*vote.Len)
	copy(table[v.Rank*vote.Len:], rec.Encode())
	if err := ring.AllGather(ctx, v.Ctrl, table); err != nil {
		return nil, e.lost(v, rec.Iter, err)
	}
	recs := make([]vote.Record, n)
	versions := make([]int64, n)
	for r := range recs {
		recs[r], versions[r] = vote.Decode(table[r*vote.Len:])
	}
	if err := vote.CheckTable(recs, versions, rec.Kind); err != nil {
		return nil, e.settle(ctx, v, err)
	}
	return recs, nil
}

// lost turns a failed vote into the error every survivor reports: a
// lost-peer error naming the peer the data plane blamed, if it named one.
func (e *Engine) lost(v *view.View, iter int64, err error) error {
	if errors.Is(err, ring.ErrClosed) {
		return errs.Closed
	}
	if lostPeer(err) { // ErrNotConnected: a failed send abandoned the link
		if r, p, ok := e.blame(v, err); ok {
			return e.peerLostError(iter, r, p, err)
		}
	}
	if iter < 0 {
		return fmt.Errorf("gyre: join: vote: %w", err)
	}
	return fmt.Errorf("gyre: boundary of iteration %d: vote: %w", iter, err)
}

// settle returns verdict once every worker holds the table it came from.
// All workers judge the same table, so when one settles all do; the
// barrier's own failure (a worker that died after sending its record) does
// not change the verdict. A nil verdict needs no settling: no worker stops.
func (e *Engine) settle(ctx context.Context, v *view.View, verdict error) error {
	if verdict == nil {
		return nil
	}
	if err := v.Ctrl.Barrier(ctx); err != nil {
		e.log.Debug().Err(err).Msg("settling a failed vote: barrier failed; the verdict stands")
	}
	return verdict
}

// failures returns the iteration error of a table in which some
// worker's collective failed, or nil.
func (e *Engine) failures(recs []vote.Record, iter int64, local error) error {
	ranks, reasons := vote.Failed(recs)
	if len(ranks) == 0 {
		return nil
	}
	// A worker that was stopped may see its peers' failures, which it
	// caused, in a vote that still completes: say so, as a lost peer's
	// error does.
	return e.opts.Errors.IterationFailed(IterationFailed{Iter: iter, Ranks: ranks, Reasons: reasons, Local: local,
		SelfStall: e.selfStall()})
}

// statusOf classifies a local failure for the record.
func statusOf(err error) int64 {
	switch {
	case err == nil:
		return vote.StatusOK
	case errors.Is(err, ring.ErrMismatch):
		return vote.StatusMismatch
	case errors.Is(err, transport.ErrPeerGone):
		return vote.StatusPeerGone
	case errors.Is(err, ring.ErrTimeout):
		return vote.StatusTimeout
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return vote.StatusCanceled
	case errors.Is(err, ring.ErrClosed), errors.Is(err, errs.Closed):
		return vote.StatusClosed
	}
	return vote.StatusOther
}

// digestState hashes the state if this vote checks it, and says how long
// that took.
func (e *Engine) digestState(check bool) (uint64, int64, error) {
	if !check {
		return 0, 0, nil
	}
	start := time.Now()
	d, err := e.state.Digest()
	// 0 means "not checked" in a record; a real digest of 0 becomes 1.
	return max(d, 1), max(time.Since(start).Nanoseconds(), 1), err
}

// agree checks that every worker registered the same state layout and the
// same batch settings, so that a misconfigured worker fails Join on every
// worker instead of training on different data. With balancing, each
// worker's record also carries its memory cap, which the view's first
// shares then respect.
func (e *Engine) agree(ctx context.Context) error {
	v := e.cur
	rec := vote.Record{Kind: vote.KindSettings, Iter: -1, Layout: e.state.Layout(), Decision: config.DigestSettings(e.settings()),
		MinShare: int64(e.bal.MinShare())}
	if e.cfg.Balance == config.BalanceLBBSP {
		rec.Headroom, rec.MaxShare = e.bal.Cap()
	}
	recs, err := e.vote(ctx, v, rec)
	if err != nil {
		return err
	}
	var out []error
	for r, rec := range recs[1:] {
		if rec.Layout != recs[0].Layout {
			out = append(out, fmt.Errorf("%w: rank %d registered different state (names, kinds or lengths) from rank 0", errs.Diverged, r+1))
		}
		if rec.Decision != recs[0].Decision {
			out = append(out, fmt.Errorf("%w: rank %d (%s) has different batch settings (one of %s) from rank 0 (%s)",
				errs.Diverged, r+1, v.IDs[r+1], config.SettingNames(e.settings()), v.IDs[0]))
		}
	}
	if len(out) > 0 {
		// Every worker holds the same table, so all gather alike; the
		// digests' verdict stands if the gather fails.
		if named, err := admission.Differences(ctx, v.Ctrl, v.IDs, v.Rank, e.fitting()); err != nil {
			e.log.Debug().Err(err).Msg("could not gather the settings to name the difference")
		} else if len(named) > 0 {
			out = named
		}
	}
	if err := e.settle(ctx, v, errors.Join(out...)); err != nil {
		return err
	}
	v.Shares = e.bal.CapShares(recs, v.Shares)
	return nil
}

// confirm makes the outcome of the state broadcast known to every worker,
// the root included, whose part of a broadcast can end before the others
// receive theirs, and checks that every worker now holds the same state.
func (e *Engine) confirm(ctx context.Context, syncErr error, root int) error {
	v := e.cur
	rec := vote.Record{Kind: vote.KindSynced, Iter: -1, Status: statusOf(syncErr)}
	var err error
	if syncErr == nil {
		if rec.Digest, rec.HashNs, err = e.digestState(true); err != nil {
			return err
		}
	}
	recs, err := e.vote(ctx, v, rec)
	if err != nil {
		return errors.Join(syncErr, err)
	}
	if fe := e.failures(recs, -1, syncErr); fe != nil {
		return e.settle(ctx, v, fmt.Errorf("gyre: broadcast of rank %d's state: %w", root, fe))
	}
	return e.settle(ctx, v, errors.Join(vote.DivergedStates(recs)...))
}

// settings lists the settings every worker must share: Shares too in the
// static view, where they do not come with the view.
func (e *Engine) settings() []config.Setting {
	var static []int
	if e.gossip == nil {
		static = e.cur.Shares
	}
	return config.JobSettings(e.cfg, static)
}

// fitting is what a joiner must share with this worker's job.
func (e *Engine) fitting() admission.Fitting { return admission.FittingOf(e.settings(), e.state) }

// syncState broadcasts root's tensors, metadata and iteration to every
// worker, as Horovod's broadcast_parameters does, so all start identical.
func (e *Engine) syncState(ctx context.Context, root int) error {
	defer e.span("state transfer", time.Now())
	v := e.cur
	var blob []byte
	if v.Rank == root {
		var err error
		if blob, err = e.state.MarshalMeta(); err != nil {
			return err
		}
	}
	head := []int64{e.it.iter, int64(len(blob)), int64(e.ckpt.epochBase)}
	if err := ring.Broadcast(ctx, v.Data, root, head); err != nil {
		return fmt.Errorf("gyre: broadcast state from rank %d: %w", root, err)
	}
	e.setIter(head[0])
	e.ckpt.epochBase = uint64(head[2])
	if v.Rank != root {
		blob = make([]byte, head[1])
	}
	for _, en := range e.state.Entries() {
		var err error
		switch en.Kind {
		case state.F32:
			err = ring.Broadcast(ctx, v.Data, root, en.F32)
		case state.F64:
			err = ring.Broadcast(ctx, v.Data, root, en.F64)
		}
		if err != nil {
			return fmt.Errorf("gyre: broadcast %q from rank %d: %w", en.Name, root, err)
		}
		if v.Rank == root {
			e.fail(config.FailSendState)
		} else {
			e.fail(config.FailRecvState)
		}
	}
	if len(blob) > 0 {
		if err := v.Data.Broadcast(ctx, root, wire.DTypeBytes, blob); err != nil {
			return fmt.Errorf("gyre: broadcast metadata from rank %d: %w", root, err)
		}
	}
	if v.Rank != root {
		return e.state.UnmarshalMeta(blob)
	}
	return nil
}
