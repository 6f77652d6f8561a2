// Package take takes a worker's checkpoints (docs/checkpoints.md): at a
// Commit that falls due it copies the committed state into a snapshot,
// the only stall, and a checkpoint.Writer writes it beside training. It
// also finds and loads the checkpoint a job resumes from. The file format
// and the writer are package checkpoint's.
package take

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/balance"
	"github.com/gyre-ml/gyre/internal/checkpoint"
	"github.com/gyre-ml/gyre/internal/config"
	"github.com/gyre-ml/gyre/internal/errs"
	"github.com/gyre-ml/gyre/internal/state"
	"github.com/gyre-ml/gyre/transport"
)

// Taker takes one worker's checkpoints. Committed, Finish and the
// loaders run on the worker's goroutine; the writer reports from its own.
type Taker struct {
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

// Job is what a checkpoint records of the job at a commit.
type Job struct {
	// State holds the committed values, and their iteration.
	State *state.Set
	// Epoch is the job epoch: the view's, counted on from the checkpoint
	// the job resumed from.
	Epoch uint64
	// Members are the view's members in rank order, and Rank this
	// worker's.
	Members []transport.PeerID
	Rank    int
	// Settings are the job's settings (config.JobSettings), and Fits the
	// members' balance models (nil: none).
	Settings []config.Setting
	Fits     map[transport.PeerID]balance.Worker
	// Wrap, if set, wraps the file as it is written (a test's failpoint).
	Wrap func(io.Writer) io.Writer
}

// New returns the taker of cfg, nil without a CheckpointDir. It marks
// the directory as this worker's; a failure to is logged, or with
// CheckpointRequired returned.
func New(cfg config.Config, log zerolog.Logger) (*Taker, error) {
	if cfg.CheckpointDir == "" {
		return nil, nil
	}
	c := &Taker{dir: checkpoint.Dir{Path: cfg.CheckpointDir, Owner: cfg.Name}, every: int64(cfg.CheckpointEvery),
		required: cfg.CheckpointRequired, log: log}
	c.writer = checkpoint.NewWriter(c.dir, cfg.CheckpointKeep, c.written)
	if err := c.dir.Mark(cfg.Name); err != nil {
		err = fmt.Errorf("%w: checkpoint directory %s: %w", errs.Checkpoint, cfg.CheckpointDir, err)
		if c.required {
			return nil, err
		}
		c.log.Error().Err(err).Msg("checkpoints will fail; training goes on (--checkpoint-required would end it)")
	}
	return c, nil
}

// written reports a write, from the writer's goroutine: one line per
// checkpoint, an error line if it failed.
func (c *Taker) written(r checkpoint.Result) {
	if r.Err != nil {
		err := fmt.Errorf("%w: %s: %w", errs.Checkpoint, r.Name, r.Err)
		if c.required {
			c.log.Error().Err(err).Str("dir", c.dir.Path).
				Msg("checkpoint not written; --checkpoint-required ends the job at the next boundary")
			c.mu.Lock()
			c.failed = err
			c.mu.Unlock()
			return
		}
		c.log.Error().Err(err).Str("dir", c.dir.Path).Msg("checkpoint not written; training goes on")
		return
	}
	c.log.Info().Str("file", r.Name).Str("dir", c.dir.Path).Dur("took", r.Took).Msg("checkpoint written")
	if r.PruneErr != nil {
		c.log.Warn().Err(r.PruneErr).Str("dir", c.dir.Path).Msg("removing old checkpoints")
	}
}

// Committed is Commit's part: it starts a checkpoint of the state just
// committed at iter if one is due and the writer is free; job describes
// it, called only then. It fails only if the state cannot be copied (a
// metadata entry that does not encode), with CheckpointRequired.
func (c *Taker) Committed(iter int64, job func() Job) error {
	if iter > 0 && iter%c.every == 0 {
		c.due = true
	}
	if !c.due || c.writer.Busy() {
		return nil
	}
	c.due = false
	j := job()
	if !c.writes(j) {
		return nil
	}
	if err := c.fill(j); err != nil {
		c.written(checkpoint.Result{Name: checkpoint.FileName(j.Epoch, j.State.CommittedIter()), Err: err})
		return c.TakeFailed()
	}
	c.writer.Start(&c.snap, j.Wrap)
	return nil
}

// RequiredFailed reports whether a write failed with CheckpointRequired:
// the next boundary's record says so, and the job ends there.
func (c *Taker) RequiredFailed() bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failed != nil
}

// TakeFailed returns and clears a recorded failure.
func (c *Taker) TakeFailed() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	err := c.failed
	c.failed = nil
	return err
}

// writes reports whether this worker writes the checkpoint: of the
// view's members that marked its directory, it has the lowest rank. A
// worker alone in its directory always writes.
func (c *Taker) writes(j Job) bool {
	marked, err := c.dir.Marked()
	if err != nil {
		return true // the write will say what is wrong
	}
	for r, id := range j.Members {
		if r < j.Rank && marked[string(id)] {
			return false
		}
	}
	return true
}

// fill copies the job's committed state into the snapshot, reusing its
// buffers.
func (c *Taker) fill(j Job) error {
	s := &c.snap
	entries := j.State.Entries()
	s.Header = checkpoint.Header{Epoch: j.Epoch, Iter: j.State.CommittedIter(), Workers: len(j.Members), Written: time.Now().UTC()}
	s.Settings = s.Settings[:0]
	for _, st := range j.Settings {
		s.Settings = append(s.Settings, checkpoint.Setting{Name: st.Name, Value: st.Value})
	}
	s.Balance = nil
	if len(j.Fits) > 0 {
		fits := make(map[string]any, len(j.Fits))
		for id, f := range j.Fits {
			fits[string(id)] = f
		}
		b, err := json.Marshal(fits)
		if err != nil {
			return fmt.Errorf("encode the balance models: %w", err)
		}
		s.Balance = b
	}
	s.Entries = s.Entries[:0]
	s.Values = slices.Grow(s.Values[:0], len(entries))[:len(entries)]
	for i, e := range entries {
		v := &s.Values[i]
		switch e.Kind {
		case state.F32:
			s.Entries = append(s.Entries, checkpoint.Entry{Name: e.Name, Kind: checkpoint.Float32, Len: len(e.C32)})
			v.F32, v.F64, v.Bytes = append(v.F32[:0], e.C32...), nil, nil
		case state.F64:
			s.Entries = append(s.Entries, checkpoint.Entry{Name: e.Name, Kind: checkpoint.Float64, Len: len(e.C64)})
			v.F32, v.F64, v.Bytes = nil, append(v.F64[:0], e.C64...), nil
		case state.Meta:
			s.Entries = append(s.Entries, checkpoint.Entry{Name: e.Name, Kind: checkpoint.Bytes, Len: len(e.CMeta)})
			v.F32, v.F64, v.Bytes = nil, nil, append(v.Bytes[:0], e.CMeta...)
		}
	}
	return nil
}

// Finish writes, at the job's end (Leave), a checkpoint that fell due
// while the writer was busy, and waits for it: the job's last checkpoint
// is not lost to a slow disk. With CheckpointRequired it returns a
// failed write's error. A disk that hangs (a dead network mount) holds it
// only until ctx ends. A nil Taker does nothing.
func (c *Taker) Finish(ctx context.Context, iter int64, job func() Job) error {
	if c == nil {
		return nil
	}
	if err := c.waitWriter(ctx); err != nil {
		return err
	}
	if c.due {
		if err := c.Committed(iter, job); err != nil {
			return err
		}
		if err := c.waitWriter(ctx); err != nil {
			return err
		}
	}
	return c.TakeFailed()
}

// waitWriter waits for the write under way, or until ctx ends.
func (c *Taker) waitWriter(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		c.writer.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: waiting for the checkpoint under way in %s: %w", errs.Checkpoint, c.dir.Path, ctx.Err())
	}
}

// Wait waits for the write under way, if any.
func (c *Taker) Wait() {
	if c != nil {
		c.writer.Wait()
	}
}
