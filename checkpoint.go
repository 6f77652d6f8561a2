package gyre

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/checkpoint"
)

// ErrCheckpoint is matched by the error every worker's Boundary returns,
// with Config.CheckpointRequired, after a checkpoint could not be
// written, and by Leave's at the job's end.
var ErrCheckpoint = errors.New("gyre: checkpoint failed")

// checkpointer takes a worker's checkpoints (docs/checkpoints.md): at a
// Commit that falls due it copies the committed state into its snapshot,
// the only stall, and a checkpoint.Writer writes it beside training.
type checkpointer struct {
	dir      checkpoint.Dir
	every    int64
	required bool
	writer   *checkpoint.Writer
	log      zerolog.Logger
	// snap is the writer's while it is busy; due says a checkpoint fell
	// due while it was.
	snap checkpoint.Snapshot
	due  bool

	mu     sync.Mutex
	failed error // a write's failure, until Commit returns it (required)
}

// newCheckpointer returns the checkpointer of cfg, nil without a
// CheckpointDir. It marks the directory as this worker's; a failure to is
// logged, or with CheckpointRequired returned.
func newCheckpointer(cfg Config, log zerolog.Logger) (*checkpointer, error) {
	if cfg.CheckpointDir == "" {
		return nil, nil
	}
	c := &checkpointer{dir: checkpoint.Dir{Path: cfg.CheckpointDir, Owner: cfg.Name}, every: int64(cfg.CheckpointEvery),
		required: cfg.CheckpointRequired, log: log}
	c.writer = checkpoint.NewWriter(c.dir, cfg.CheckpointKeep, c.written)
	if err := c.dir.Mark(cfg.Name); err != nil {
		err = fmt.Errorf("%w: checkpoint directory %s: %w", ErrCheckpoint, cfg.CheckpointDir, err)
		if c.required {
			return nil, err
		}
		c.log.Error().Err(err).Msg("checkpoints will fail; training goes on (--checkpoint-required would end it)")
	}
	return c, nil
}

// written reports a write, from the writer's goroutine: one line per
// checkpoint, an error line if it failed.
func (c *checkpointer) written(r checkpoint.Result) {
	if r.Err != nil {
		err := fmt.Errorf("%w: %s: %w", ErrCheckpoint, r.Name, r.Err)
		c.log.Error().Err(err).Str("dir", c.dir.Path).Msg("checkpoint not written; training goes on")
		if c.required {
			c.mu.Lock()
			c.failed = err
			c.mu.Unlock()
		}
		return
	}
	c.log.Info().Str("file", r.Name).Str("dir", c.dir.Path).Dur("took", r.Took).Msg("checkpoint written")
	if r.PruneErr != nil {
		c.log.Warn().Err(r.PruneErr).Str("dir", c.dir.Path).Msg("removing old checkpoints")
	}
}

// committed is Commit's part: it starts a checkpoint of the state w just
// committed if one is due and the writer is free. It fails only if the
// state cannot be copied (a metadata entry that does not encode), with
// CheckpointRequired.
func (c *checkpointer) committed(w *Worker) error {
	if w.iter > 0 && w.iter%c.every == 0 {
		c.due = true
	}
	if !c.due || c.writer.Busy() {
		return nil
	}
	c.due = false
	if !c.writes(w) {
		return nil
	}
	if err := c.fill(w); err != nil {
		c.written(checkpoint.Result{Name: checkpoint.FileName(w.jobEpoch(), w.iter), Err: err})
		return c.takeFailed()
	}
	c.writer.Start(&c.snap, w.checkpointFailpoint())
	return nil
}

// checkpointFailpoint returns, if the worker's failpoint is
// FailCheckpoint and due at this iteration, the wrap that kills it once
// that many bytes of the file are written; else nil.
func (w *Worker) checkpointFailpoint() func(io.Writer) io.Writer {
	if w.failAt.name != FailCheckpoint || w.iter < w.failAt.iter || w.died.Load() {
		return nil
	}
	iter := w.iter
	return func(f io.Writer) io.Writer {
		return &dieAfter{w: f, n: w.failAt.bytes, die: func() { w.die(FailCheckpoint, iter) }}
	}
}

// requiredFailed reports whether a write failed with CheckpointRequired:
// the next boundary's record says so, and the job ends there.
func (c *checkpointer) requiredFailed() bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failed != nil
}

// takeFailed returns and clears a recorded failure.
func (c *checkpointer) takeFailed() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	err := c.failed
	c.failed = nil
	return err
}

// writes reports whether this worker writes the checkpoint: of the
// current view's members that marked its directory, it has the lowest
// rank. A worker alone in its directory always writes.
func (c *checkpointer) writes(w *Worker) bool {
	marked, err := c.dir.Marked()
	if err != nil {
		return true // the write will say what is wrong
	}
	vs := w.cur
	for r, id := range vs.ids {
		if r < vs.rank && marked[string(id)] {
			return false
		}
	}
	return true
}

// fill copies w's committed state into the snapshot, reusing its buffers.
func (c *checkpointer) fill(w *Worker) error {
	s := &c.snap
	vs := w.cur
	s.Header = checkpoint.Header{Epoch: w.jobEpoch(), Iter: w.state.iter, Workers: len(vs.ids), Written: time.Now().UTC()}
	for _, st := range jobSettings(w.cfg, nil) {
		s.Settings = append(s.Settings, checkpoint.Setting{Name: st.Name, Value: st.Value})
	}
	if len(w.fits) > 0 {
		fits := make(map[string]any, len(w.fits))
		for id, f := range w.fits {
			fits[string(id)] = f
		}
		b, err := json.Marshal(fits)
		if err != nil {
			return fmt.Errorf("encode the balance models: %w", err)
		}
		s.Balance = b
	}
	s.Entries = s.Entries[:0]
	s.Values = slices.Grow(s.Values[:0], len(w.state.entries))[:len(w.state.entries)]
	for i, e := range w.state.entries {
		v := &s.Values[i]
		switch e.kind {
		case kindF32:
			s.Entries = append(s.Entries, checkpoint.Entry{Name: e.name, Kind: checkpoint.Float32, Len: len(e.c32)})
			v.F32, v.F64, v.Bytes = append(v.F32[:0], e.c32...), nil, nil
		case kindF64:
			s.Entries = append(s.Entries, checkpoint.Entry{Name: e.name, Kind: checkpoint.Float64, Len: len(e.c64)})
			v.F32, v.F64, v.Bytes = nil, append(v.F64[:0], e.c64...), nil
		case kindMeta:
			s.Entries = append(s.Entries, checkpoint.Entry{Name: e.name, Kind: checkpoint.Bytes, Len: len(e.cmeta)})
			v.F32, v.F64, v.Bytes = nil, nil, append(v.Bytes[:0], e.cmeta...)
		}
	}
	return nil
}

// finish writes, at the job's end (Leave), a checkpoint that fell due
// while the writer was busy, and waits for it: the job's last checkpoint
// is not lost to a slow disk. With CheckpointRequired it returns a
// failed write's error. A disk that hangs (a dead network mount) holds it
// only until ctx ends.
func (c *checkpointer) finish(ctx context.Context, w *Worker) error {
	if c == nil {
		return nil
	}
	if err := c.waitWriter(ctx); err != nil {
		return err
	}
	if c.due {
		if err := c.committed(w); err != nil {
			return err
		}
		if err := c.waitWriter(ctx); err != nil {
			return err
		}
	}
	return c.takeFailed()
}

// waitWriter waits for the write under way, or until ctx ends.
func (c *checkpointer) waitWriter(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		c.writer.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: waiting for the checkpoint under way in %s: %w", ErrCheckpoint, c.dir.Path, ctx.Err())
	}
}

// jobEpoch is the epoch checkpoints carry: the view's, counted on from
// the epoch of the checkpoint the job resumed from, so that a resumed
// job's checkpoints are newer than the one it resumed from.
func (w *Worker) jobEpoch() uint64 { return w.epochBase + w.cur.view.Epoch }

// wait waits for the write under way, if any.
func (c *checkpointer) wait() {
	if c != nil {
		c.writer.Wait()
	}
}
