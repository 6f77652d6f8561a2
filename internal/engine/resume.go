package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/gyre-ml/gyre/internal/checkpoint"
	"github.com/gyre-ml/gyre/internal/config"
	"github.com/gyre-ml/gyre/internal/errs"
	"github.com/gyre-ml/gyre/internal/vote"
)

// Resuming from a checkpoint (docs/checkpoints.md, "Resume"): at the end
// of Join, the view that starts iteration 0 votes on the newest checkpoint
// its members hold; the holder of the newest loads it and the state is
// broadcast from it, as at Join. A worker admitted into a running job
// (its iteration is past 0) skips this: the job it joins is ahead of its
// checkpoints.
func (e *Engine) resume(ctx context.Context) error {
	if e.it.iter != 0 {
		return nil
	}
	v := e.cur
	snap, name, dirEpoch := e.ckpt.taker.Newest()
	rec := vote.Record{Kind: vote.KindResume, Iter: -1, DirEpoch: dirEpoch}
	if snap != nil {
		rec.Iter, rec.Epoch, rec.Digest = snap.Iter, snap.Epoch, snap.Sum
	}
	recs, err := e.vote(ctx, v, rec)
	if err != nil {
		return err
	}
	// This job's checkpoints count their epochs on from the highest any
	// member's directory names, valid or not, so that they sort above
	// every file there and pruning keeps them.
	for _, r := range recs {
		e.ckpt.epochBase = max(e.ckpt.epochBase, r.Epoch, r.DirEpoch)
	}
	root := vote.NewestCheckpoint(recs)
	if root < 0 {
		return nil
	}
	won := recs[root]
	var loadErr error
	carried := int64(0) // the holder brings its balance models
	if v.Rank == root {
		iter, fits, err := e.ckpt.taker.Load(name, e.state, config.JobSettings(e.cfg, nil), len(v.IDs), e.cfg.Balance == config.BalanceLBBSP)
		if loadErr = err; err == nil {
			e.setIter(iter)
			e.bal.SetFits(fits)
			if len(fits) > 0 {
				carried = 1
			}
		}
	}
	// Every member learns whether the holder loaded it, and what it
	// brings, before any waits for its broadcast.
	loaded, err := e.vote(ctx, v, vote.Record{Kind: vote.KindResume, Iter: -1, Status: statusOf(loadErr), Share: carried})
	if err != nil {
		return errors.Join(loadErr, err)
	}
	if loaded[root].Status != vote.StatusOK {
		if loadErr == nil {
			loadErr = fmt.Errorf("%w: rank %d (%s) could not load its checkpoint %s; its log says why",
				errs.Diverged, root, v.IDs[root], checkpoint.FileName(won.Epoch, won.Iter))
		}
		return e.settle(ctx, v, loadErr)
	}
	if err := e.confirm(ctx, e.syncState(ctx, root), root); err != nil {
		return err
	}
	if err := e.state.Commit(e.it.iter); err != nil {
		return err
	}
	// The view's shares stand (equal or --shares, within the devices'
	// memory) unless the holder brings the models of as many workers.
	if loaded[root].Share == 1 {
		if err := e.bal.Sync(ctx, v, root); err != nil {
			return err
		}
	}
	e.ckpt.resumed = Resumed{File: checkpoint.FileName(won.Epoch, won.Iter), Rank: root, ID: string(v.IDs[root]),
		Epoch: won.Epoch, Iter: e.it.iter}
	e.log.Info().Str("file", e.ckpt.resumed.File).Int("holder", root).Uint64("epoch", e.ckpt.resumed.Epoch).Int64("iter", e.it.iter).
		Ints("shares", v.Shares).Msg("resumed from a checkpoint")
	return nil
}
