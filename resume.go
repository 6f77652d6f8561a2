package gyre

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/gyre-ml/gyre/balance"
	"github.com/gyre-ml/gyre/internal/checkpoint"
	"github.com/gyre-ml/gyre/transport"
)

// Resuming from a checkpoint (docs/checkpoints.md, "Resume"): at the end
// of Join, the view that starts iteration 0 votes on the newest checkpoint
// its members hold; the holder of the newest loads it and the state is
// broadcast from it, as at Join. A worker admitted into a running job
// (its iteration is past 0) skips this: the job it joins is ahead of its
// checkpoints.

// Resumed says which checkpoint a job resumed from.
type Resumed struct {
	// File is the checkpoint's file name, in the directory of the worker
	// that held it: Rank, ID in the view that resumed.
	File string
	Rank int
	ID   string
	// Epoch and Iter are the checkpoint's job epoch and iteration: the
	// job went on from iteration Iter.
	Epoch uint64
	Iter  int64
}

// Resumed returns the checkpoint the job resumed from at Join, and false
// if it started afresh or this worker was admitted into a running job.
func (w *Worker) Resumed() (Resumed, bool) { return w.resumed, w.resumed.File != "" }

// newestCheckpoint returns the rank whose resume record names the newest
// checkpoint, the highest (epoch, iteration), the lowest rank on a tie;
// -1 if no record names one.
func newestCheckpoint(recs []record) int {
	best := -1
	for r, rec := range recs {
		if rec.iter < 0 {
			continue
		}
		if best < 0 || rec.epoch > recs[best].epoch || rec.epoch == recs[best].epoch && rec.iter > recs[best].iter {
			best = r
		}
	}
	return best
}

// resume runs the resume step of Join: see above.
func (w *Worker) resume(ctx context.Context) error {
	if w.iter != 0 {
		return nil
	}
	vs := w.cur
	snap, name := w.newestOwnCheckpoint()
	rec := record{kind: kindResume, iter: -1}
	if snap != nil {
		rec.iter, rec.epoch, rec.digest = snap.Iter, snap.Epoch, snap.Sum
	}
	if w.ckpt != nil {
		rec.dirEpoch = w.ckpt.dir.HighestEpoch()
	}
	recs, err := w.vote(ctx, vs, rec)
	if err != nil {
		return err
	}
	// This job's checkpoints count their epochs on from the highest any
	// member's directory names, valid or not (checkpointer.fill), so that
	// they sort above every file there and pruning keeps them.
	for _, r := range recs {
		w.epochBase = max(w.epochBase, r.epoch, r.dirEpoch)
	}
	root := newestCheckpoint(recs)
	if root < 0 {
		return nil
	}
	won := recs[root]
	var loadErr error
	carried := int64(0) // the holder brings its balance models
	if vs.rank == root {
		if loadErr = w.loadCheckpoint(name, len(vs.ids)); loadErr == nil && len(w.fits) > 0 {
			carried = 1
		}
	}
	// Every member learns whether the holder loaded it, and what it
	// brings, before any waits for its broadcast.
	loaded, err := w.vote(ctx, vs, record{kind: kindResume, iter: -1, status: statusOf(loadErr), share: carried})
	if err != nil {
		return errors.Join(loadErr, err)
	}
	if loaded[root].status != statusOK {
		if loadErr == nil {
			loadErr = fmt.Errorf("%w: rank %d (%s) could not load its checkpoint %s; its log says why",
				ErrDiverged, root, vs.ids[root], checkpoint.FileName(won.epoch, won.iter))
		}
		return w.settle(ctx, vs, loadErr)
	}
	if err := w.confirm(ctx, w.syncState(ctx, root), root); err != nil {
		return err
	}
	if err := w.state.commit(w.iter); err != nil {
		return err
	}
	// The view's shares stand (equal or --shares, within the devices'
	// memory) unless the holder brings the models of as many workers.
	if loaded[root].share == 1 {
		if err := w.syncFits(ctx, root); err != nil {
			return err
		}
	}
	w.resumed = Resumed{File: checkpoint.FileName(won.epoch, won.iter), Rank: root, ID: string(vs.ids[root]),
		Epoch: won.epoch, Iter: w.iter}
	w.log.Info().Str("file", w.resumed.File).Int("holder", root).Uint64("epoch", w.resumed.Epoch).Int64("iter", w.iter).
		Ints("shares", vs.shares).Msg("resumed from a checkpoint")
	return nil
}

// newestOwnCheckpoint returns the newest valid checkpoint of this
// worker's directory, logging each newer one that is not valid.
// The snapshot holds no values.
func (w *Worker) newestOwnCheckpoint() (*checkpoint.Snapshot, string) {
	if w.ckpt == nil {
		return nil, ""
	}
	snap, name, bad := w.ckpt.dir.Newest()
	for _, err := range bad {
		w.log.Error().Err(err).Msg("checkpoint unreadable; an older one is tried")
	}
	return snap, name
}

// resumeSettings are the settings a checkpoint must share with the job:
// the ones that decide which samples each iteration takes.
var resumeSettings = []string{"GlobalBatch (--batch)", "RNGSeed (--rng-seed)", "DatasetSize"}

// loadCheckpoint reads the checkpoint name of this worker's directory,
// checks that it fits the registered state and settings, then copies it
// into the registered values, with its iteration and, under LB-BSP, if
// it was taken with as many workers as the view holds, its balance
// models.
func (w *Worker) loadCheckpoint(name string, workers int) error {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%w: checkpoint %s: %s", ErrDiverged, name, fmt.Sprintf(format, args...))
	}
	s, err := w.ckpt.dir.Load(name)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrDiverged, err) // it read as valid a moment ago
	}
	entries := w.state.entries
	if len(s.Entries) != len(entries) {
		return fail("holds %d entries, this worker registered %d", len(s.Entries), len(entries))
	}
	for i, e := range entries {
		ce := s.Entries[i]
		kind, n := checkpoint.Bytes, -1
		switch e.kind {
		case kindF32:
			kind, n = checkpoint.Float32, len(e.f32)
		case kindF64:
			kind, n = checkpoint.Float64, len(e.f64)
		}
		if ce.Name != e.name || ce.Kind != kind || n >= 0 && ce.Len != n {
			return fail("entry %d is %s, this worker registered %s", i, describeEntry(ce.Name, ce.Kind, ce.Len), describeEntry(e.name, kind, n))
		}
	}
	have := map[string]string{}
	for _, st := range s.Settings {
		have[st.Name] = st.Value
	}
	for _, st := range jobSettings(w.cfg, nil) {
		for _, name := range resumeSettings {
			if st.Name == name && have[name] != st.Value {
				return fail("was taken with %s %s, this job runs %s", name, have[name], st.Value)
			}
		}
	}
	for i, e := range entries {
		v := s.Values[i]
		switch e.kind {
		case kindF32:
			copy(e.f32, v.F32)
		case kindF64:
			copy(e.f64, v.F64)
		case kindMeta:
			if err := e.meta.UnmarshalBinary(v.Bytes); err != nil {
				return fail("decode %q: %v", e.name, err)
			}
		}
	}
	w.setIter(s.Iter)
	w.fits = nil
	if w.cfg.Balance == BalanceLBBSP && s.Workers == workers && len(s.Balance) > 0 {
		var fits map[string]balance.Worker
		if err := json.Unmarshal(s.Balance, &fits); err != nil {
			w.log.Warn().Err(err).Str("file", name).Msg("the checkpoint's balance models are unreadable; shares start equal")
			return nil
		}
		w.fits = make(map[transport.PeerID]balance.Worker, len(fits))
		for id, f := range fits {
			w.fits[transport.PeerID(id)] = f
		}
	}
	return nil
}

// describeEntry says what an entry is, for errors: "float32 w[100]".
func describeEntry(name string, kind checkpoint.Kind, n int) string {
	switch kind {
	case checkpoint.Float32:
		return fmt.Sprintf("float32 %q[%d]", name, n)
	case checkpoint.Float64:
		return fmt.Sprintf("float64 %q[%d]", name, n)
	}
	return fmt.Sprintf("metadata %q", name)
}
