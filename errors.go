package gyre

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gyre-ml/gyre/internal/engine"
	"github.com/gyre-ml/gyre/internal/errs"
	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/transport"
)

// Errors returned by Worker.
var (
	// ErrDiverged means workers disagree about something that must be the
	// same everywhere: the registered state, the batch settings, the
	// iteration or a boundary decision. Every worker gets it together,
	// since all of them compare the same gathered table.
	ErrDiverged = errs.Diverged
	// ErrPending means Boundary, Commit, Restore, AllGather64 or Leave was
	// called while gradients submitted with AllReduceAsync were still
	// unfinished.
	ErrPending = errs.Pending
	// ErrClosed is returned by a Worker after Close or Leave.
	ErrClosed = errs.Closed
	// ErrNoQuorum means a worker lost touch with a majority of its view
	// and waited QuorumTimeout for it in vain: the job goes on without it
	// if a majority survives elsewhere, and this worker must exit (gyre
	// train exits with status ExitNoQuorum).
	ErrNoQuorum = errs.NoQuorum
)

// ExitNoQuorum is the exit status of a gyre command whose worker failed
// with ErrNoQuorum. gyre launch stops a job when a worker exits with it:
// the job has lost its majority.
const ExitNoQuorum = 75

// ErrCheckpoint is matched by the error every worker's Boundary returns,
// with Config.CheckpointRequired, after a checkpoint could not be
// written, and by Leave's at the job's end.
var ErrCheckpoint = errs.Checkpoint

// Errors returned by Join and Boundary.
var (
	// ErrIterationFailed is matched by every *IterationError.
	ErrIterationFailed = errs.IterationFailed
	// ErrPeerLost is matched by every *PeerLostError, and by the
	// ring.PeerLostError of a collective run on Comm: it is
	// ring.ErrPeerLost.
	ErrPeerLost = ring.ErrPeerLost
)

// IterationError reports an iteration in which at least one worker's
// collective failed while every worker was still reachable. Every worker
// returns it from Boundary with the same Iter, Ranks and Reasons, whether
// its own collectives failed or completed. It matches ErrIterationFailed
// and unwraps to Local.
type IterationError struct {
	// Iter is the iteration that failed.
	Iter int64
	// Ranks are the ranks whose collectives failed, ascending, and Reasons
	// say why, one per rank: "mismatch", "peer gone", "timeout",
	// "canceled", "closed" or "other".
	Ranks   []int
	Reasons []string
	// Local is this worker's own failure, nil if its collectives completed.
	Local error
	// Unresponsive, if not zero, is how long this worker itself could not
	// run during the iteration, longer than PeerTimeout, as in
	// PeerLostError: the failures its peers report are then likely its
	// own doing. SelfRank, Self and PeerTimeout are for the message.
	Unresponsive time.Duration
	SelfRank     int
	Self         transport.PeerID
	PeerTimeout  time.Duration
}

func (e *IterationError) Error() string {
	parts := make([]string, len(e.Ranks))
	for i, r := range e.Ranks {
		parts[i] = fmt.Sprintf("rank %d (%s)", r, e.Reasons[i])
	}
	msg := fmt.Sprintf("gyre: iteration %d failed on %s", e.Iter, strings.Join(parts, ", "))
	if e.Unresponsive > 0 {
		// This worker's stall first: it is the likely cause.
		msg = fmt.Sprintf("gyre: rank %d (%s, this worker) was unresponsive for %v in iteration %d, longer than PeerTimeout %v "+
			"(stopped, as by SIGSTOP, or starved of CPU); the iteration failed on %s",
			e.SelfRank, e.Self, e.Unresponsive.Round(time.Millisecond), e.Iter, e.PeerTimeout, strings.Join(parts, ", "))
	}
	if e.Local != nil {
		msg += ": " + e.Local.Error()
	}
	return msg
}

// Is matches ErrIterationFailed.
func (e *IterationError) Is(target error) bool { return target == ErrIterationFailed }

// Unwrap returns Local.
func (e *IterationError) Unwrap() error { return e.Local }

// PeerLostError reports a worker that died, froze or became unreachable,
// from Wait or from a vote that could not complete. Every surviving worker returns one naming
// the same rank, found from the data plane's own evidence (a broken
// connection, or heartbeats missing for Config.PeerTimeout). It matches
// ErrPeerLost and transport.ErrPeerGone, and unwraps to the cause.
type PeerLostError struct {
	// Iter is the iteration that failed (-1: Join).
	Iter int64
	// Rank is the lost worker's rank in the view, -1 if unknown; Peer is
	// its transport ID (its data address in the static view).
	Rank int
	Peer transport.PeerID
	Err  error
	// Unresponsive, if not zero, is how long this worker itself could not
	// run during the iteration, longer than PeerTimeout: it was stopped
	// (SIGSTOP) or starved of CPU. Its peers will then have declared it
	// lost, and Rank is only the peer it found silent on resuming.
	// SelfRank and Self are this worker's rank and ID, and PeerTimeout
	// its Config.PeerTimeout, for the message.
	Unresponsive time.Duration
	SelfRank     int
	Self         transport.PeerID
	PeerTimeout  time.Duration
}

func (e *PeerLostError) Error() string {
	when := fmt.Sprintf("in iteration %d", e.Iter)
	if e.Iter < 0 {
		when = "during Join"
	}
	cause := e.Err
	if rl := (*ring.PeerLostError)(nil); errors.As(cause, &rl) && rl.Peer == e.Peer {
		cause = rl.Err // the ring named the same rank: say it once
	}
	if e.Unresponsive > 0 {
		// This worker's rank first: it is the one the job lost.
		return fmt.Sprintf("gyre: rank %d (%s, this worker) was unresponsive for %v %s, longer than PeerTimeout %v "+
			"(stopped, as by SIGSTOP, or starved of CPU), so its peers will have declared it lost; "+
			"on resuming it found rank %d (%s) silent: %v",
			e.SelfRank, e.Self, e.Unresponsive.Round(time.Millisecond), when, e.PeerTimeout, e.Rank, e.Peer, cause)
	}
	return fmt.Sprintf("gyre: lost rank %d (%s) %s: %v", e.Rank, e.Peer, when, cause)
}

// Is matches ErrPeerLost.
func (e *PeerLostError) Is(target error) bool { return target == ErrPeerLost }

// Unwrap returns the cause, which matches transport.ErrPeerGone.
func (e *PeerLostError) Unwrap() error { return e.Err }

// newPeerLostError is the engine's lost peer as a *PeerLostError.
func newPeerLostError(p engine.PeerLost) error {
	return &PeerLostError{Iter: p.Iter, Rank: p.Rank, Peer: p.Peer, Err: p.Err, Unresponsive: p.Unresponsive,
		SelfRank: p.SelfRank, Self: p.Self, PeerTimeout: p.PeerTimeout}
}

// newIterationError is the engine's failed iteration as an
// *IterationError.
func newIterationError(f engine.IterationFailed) error {
	return &IterationError{Iter: f.Iter, Ranks: f.Ranks, Reasons: f.Reasons, Local: f.Local,
		Unresponsive: f.Unresponsive, SelfRank: f.SelfRank, Self: f.Self, PeerTimeout: f.PeerTimeout}
}
