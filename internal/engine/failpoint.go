package engine

import (
	"io"
	"os"
	"sync/atomic"
	"syscall"

	"github.com/gyre-ml/gyre/internal/checkpoint/take"
	"github.com/gyre-ml/gyre/internal/config"
)

// Failpoints make a worker die at a named step of its protocols, for the
// tests of recovery (gyre.FailVote and the others; config.ParseFailpoint
// reads them).

// failpoints is the worker's failpoint: where it dies (at), how a test's
// worker dies instead of its process (action), and whether it has.
type failpoints struct {
	at     config.Failpoint
	action func()
	died   atomic.Bool
}

// fail kills the worker if its failpoint is name and the iteration has
// come: the process by SIGKILL, or a test's worker by its action.
func (e *Engine) fail(name string) { e.failAt(name, e.it.iter) }

// failAt is fail for a step that belongs to iteration iter.
func (e *Engine) failAt(name string, iter int64) {
	if e.fp.at.Name != name || iter < e.fp.at.Iter || e.fp.died.Load() {
		return
	}
	e.die(name, iter)
}

// die kills the worker at failpoint name, reached at iteration iter, as
// fail does once it is due; from any goroutine.
func (e *Engine) die(name string, iter int64) {
	if e.fp.died.Swap(true) {
		return
	}
	e.log.Warn().Str("failpoint", name).Int64("iter", iter).Msg("failpoint reached: dying as kill -9 would")
	if e.fp.action != nil {
		e.fp.action()
		return
	}
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL cannot be caught; this only waits for it
}

// dieAfter passes the first n bytes written through to w, then kills
// the worker (FailCheckpoint).
type dieAfter struct {
	w       io.Writer
	n       int64
	written int64
	die     func()
}

func (d *dieAfter) Write(p []byte) (int, error) {
	if left := d.n - d.written; int64(len(p)) > left {
		k, err := d.w.Write(p[:left])
		d.written += int64(k)
		if err == nil {
			d.die()
		}
		return k, err
	}
	k, err := d.w.Write(p)
	d.written += int64(k)
	return k, err
}

// checkpointJob describes the commit just made, for a checkpoint: with
// the wrap that kills the worker mid-file if its failpoint is
// FailCheckpoint and due at this iteration.
func (e *Engine) checkpointJob() take.Job {
	v := e.cur
	j := take.Job{State: e.state, Epoch: e.jobEpoch(), Members: v.IDs, Rank: v.Rank,
		Settings: config.JobSettings(e.cfg, nil), Fits: e.bal.Fits()}
	if e.fp.at.Name == config.FailCheckpoint && e.it.iter >= e.fp.at.Iter && !e.fp.died.Load() {
		iter := e.it.iter
		j.Wrap = func(f io.Writer) io.Writer {
			return &dieAfter{w: f, n: e.fp.at.Bytes, die: func() { e.die(config.FailCheckpoint, iter) }}
		}
	}
	return j
}

// jobEpoch is the epoch checkpoints carry: the view's, counted on from
// the epoch of the checkpoint the job resumed from, so that a resumed
// job's checkpoints are newer than the one it resumed from.
func (e *Engine) jobEpoch() uint64 { return e.ckpt.epochBase + e.cur.Epoch }
