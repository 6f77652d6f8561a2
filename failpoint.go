package gyre

import (
	"fmt"
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
)

var failpointNames = []string{FailVote, FailSendState, FailRecvState, FailPropose, FailInstall, FailProbe}

// failpoint is a parsed Config.Failpoint.
type failpoint struct {
	name string
	iter int64
}

// parseFailpoint parses NAME or NAME@ITER; "" is no failpoint.
func parseFailpoint(s string) (failpoint, error) {
	if s == "" {
		return failpoint{}, nil
	}
	name, at, found := strings.Cut(s, "@")
	fp := failpoint{name: name}
	if found {
		n, err := strconv.ParseInt(at, 10, 64)
		if err != nil || n < 0 {
			return failpoint{}, fmt.Errorf("Failpoint %q: want NAME or NAME@ITER with ITER a non-negative integer", s)
		}
		fp.iter = n
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
	w.died.Store(true)
	w.log.Warn().Str("failpoint", name).Int64("iter", w.iter).Msg("failpoint reached: dying as kill -9 would")
	if w.failAction != nil {
		w.failAction()
		return
	}
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL cannot be caught; this only waits for it
}
