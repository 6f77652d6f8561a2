package gyre

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Failpoints make a worker die at a named step of its protocols, for the
// tests of recovery: a kill from outside cannot aim at a step that lasts
// milliseconds. Config.Failpoint (GYRE_FAILPOINT) is NAME or NAME@ITER:
// the worker dies the first time it reaches step NAME at iteration ITER
// or later (default 0). A process dies as kill -9 kills it, with no word
// to its peers.
const (
	// FailVote: in Boundary, as the vote begins; its peers are in the
	// vote's allgather.
	FailVote = "vote"
	// FailSendState: the sender of a state broadcast (the root that
	// brings a joiner the state, or the winning commit's holder in a
	// recovery), after the first tensor.
	FailSendState = "send-state"
	// FailRecvState: a receiver of a state broadcast (a joiner, or a
	// member behind in a recovery), after the first tensor.
	FailRecvState = "recv-state"
	// FailPropose: a recovery's coordinator, as soon as it has sent its
	// proposal.
	FailPropose = "propose"
	// FailInstall: a member of the view a recovery decided, as it starts
	// that view: its peers have agreed on a view that holds it.
	FailInstall = "install"
	// FailProbe: at a boundary that measures the links again, as the
	// probes begin; its peers are probing it.
	FailProbe = "probe"
	// FailCheckpoint: the writer of a checkpoint, in the middle of its
	// file, once BYTES of it are written. Spelled checkpoint@ITER:BYTES
	// (BYTES default 0); the checkpoint is the first taken at iteration
	// ITER or later.
	FailCheckpoint = "checkpoint"
)

var failpointNames = []string{FailVote, FailSendState, FailRecvState, FailPropose, FailInstall, FailProbe, FailCheckpoint}

// failpoint is a parsed Config.Failpoint.
type failpoint struct {
	name  string
	iter  int64
	bytes int64 // FailCheckpoint: how much of the file is written
}

// parseFailpoint parses NAME, NAME@ITER, or checkpoint@ITER:BYTES; "" is
// no failpoint.
func parseFailpoint(s string) (failpoint, error) {
	if s == "" {
		return failpoint{}, nil
	}
	name, at, found := strings.Cut(s, "@")
	fp := failpoint{name: name}
	if found {
		at, bytes, hasBytes := strings.Cut(at, ":")
		n, err := strconv.ParseInt(at, 10, 64)
		if err != nil || n < 0 {
			return failpoint{}, fmt.Errorf("Failpoint %q: want NAME or NAME@ITER with ITER a non-negative integer", s)
		}
		fp.iter = n
		if hasBytes {
			b, err := strconv.ParseInt(bytes, 10, 64)
			if err != nil || b < 0 || name != FailCheckpoint {
				return failpoint{}, fmt.Errorf("Failpoint %q: only %s takes :BYTES, a non-negative integer", s, FailCheckpoint)
			}
			fp.bytes = b
		}
	}
	for _, known := range failpointNames {
		if name == known {
			return fp, nil
		}
	}
	return failpoint{}, fmt.Errorf("Failpoint %q: unknown step %q; the steps are %s", s, name, strings.Join(failpointNames, ", "))
}

// fail kills the worker if its failpoint is name and the iteration has
// come: the process by SIGKILL, or a test's worker by its failAction.
func (w *Worker) fail(name string) {
	if w.failAt.name != name || w.iter < w.failAt.iter || w.died.Load() {
		return
	}
	w.die(name, w.iter)
}

// die kills the worker at failpoint name, reached at iteration iter, as
// fail does once it is due; from any goroutine.
func (w *Worker) die(name string, iter int64) {
	if w.died.Swap(true) {
		return
	}
	w.log.Warn().Str("failpoint", name).Int64("iter", iter).Msg("failpoint reached: dying as kill -9 would")
	if w.failAction != nil {
		w.failAction()
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
