package ring

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gyre-ml/gyre/transport"
)

var (
	// ErrMismatch is matched by every error that reports ranks disagreeing
	// about a collective: a *MismatchError found locally, or an *AbortError
	// whose origin found one.
	ErrMismatch = errors.New("ring: collective mismatch")
	// ErrAborted is matched by every *AbortError: another rank failed the
	// collective and told this one.
	ErrAborted = errors.New("ring: collective aborted by a peer")
	// ErrPeerLost is matched by every *PeerLostError: a member died,
	// froze or became unreachable. Package gyre's ErrPeerLost is this
	// same value, so one test covers a Worker's errors and those of
	// collectives run on its Comm.
	ErrPeerLost = errors.New("gyre: worker lost")
	// ErrTimeout is matched by every *TimeoutError: the collective did not
	// finish within its deadline.
	ErrTimeout = errors.New("ring: collective deadline exceeded")
	// ErrClosed is returned by calls on a closed Comm.
	ErrClosed = errors.New("ring: communicator closed")
	// ErrStaleEpoch is matched by every *StaleEpochError, and by an
	// *AbortError whose origin found one: this rank is behind. (A newer
	// rank that a stale one aborts gets Reason AbortBehind, which does not
	// match it.)
	ErrStaleEpoch = errors.New("ring: stale epoch")
	// ErrPeerSilent is the cause in the *transport.PeerError of a member
	// that Liveness has not heard from for PeerTimeout.
	ErrPeerSilent = errors.New("ring: peer silent: no heartbeat within the peer timeout")
)

// Liveness reports when each peer was last heard from on a path apart from
// the collectives' own messages, so that a collective can tell a late peer
// from a dead one. LastHeard must be safe for concurrent use and must not
// block; a peer never heard from reports when watching it began.
// liveness.Monitor implements it with heartbeats.
type Liveness interface {
	LastHeard(peer transport.PeerID) time.Time
}

// PeerLostError reports a collective that failed because a member died,
// froze (silent past the peer timeout) or became unreachable, whether
// this rank saw it or another rank's abort named it. It matches
// ErrPeerLost and transport.ErrPeerGone, and unwraps to the cause.
type PeerLostError struct {
	// Rank is the lost member's rank in the Comm, Peer its ID.
	Rank int
	Peer transport.PeerID
	Err  error
}

// Error says what the collective saw of the member, never that it died:
// a link that fails may be a live member's closing (TCP cannot tell), and
// which member is lost is the caller's to judge from heartbeats.
func (e *PeerLostError) Error() string {
	if errors.Is(e.Err, transport.ErrClosedByPeer) {
		// Alive when it closed: it left the collective, often to recover
		// from another member's loss.
		return fmt.Sprintf("ring: rank %d (%s) closed its side of the collective: %v", e.Rank, e.Peer, e.Err)
	}
	return fmt.Sprintf("ring: the link to rank %d (%s) failed: %v", e.Rank, e.Peer, e.Err)
}

// Is matches ErrPeerLost.
func (e *PeerLostError) Is(target error) bool { return target == ErrPeerLost }

// Unwrap returns the cause, which matches transport.ErrPeerGone.
func (e *PeerLostError) Unwrap() error { return e.Err }

// lostPeer wraps a collective's error in a *PeerLostError if a member
// other than this rank is to blame for it, so that callers match it with
// ErrPeerLost and learn the rank.
func (c *Comm) lostPeer(err error) error {
	if err == nil || !errors.Is(err, transport.ErrPeerGone) {
		return err
	}
	p, ok := transport.PeerOf(err)
	if r := c.rankOf(p); ok && r >= 0 && r != c.cfg.Rank {
		return &PeerLostError{Rank: r, Peer: p, Err: err}
	}
	return err
}

// StaleEpochError reports that a member sent a message from a newer
// membership epoch than this rank's Comm: this rank is the stale one. It
// matches ErrStaleEpoch.
type StaleEpochError struct {
	// Peer sent the message; Rank is its rank in this Comm.
	Peer transport.PeerID
	Rank int
	// Epoch is this rank's epoch, PeerEpoch the peer's.
	Epoch, PeerEpoch uint64
	// Relayed means that the peer is behind too and passed on another
	// stale rank's marker for epoch PeerEpoch.
	Relayed bool
	// peerSeq is the newer epoch's collective, which this rank aborts in
	// turn.
	peerSeq uint64
}

func (e *StaleEpochError) Error() string {
	if e.Relayed {
		return fmt.Sprintf("ring: stale epoch: this rank is in epoch %d, and epoch %d has begun (reported by rank %d, %s, which is behind too)",
			e.Epoch, e.PeerEpoch, e.Rank, e.Peer)
	}
	return fmt.Sprintf("ring: stale epoch: rank %d (%s) is in epoch %d, this rank in epoch %d",
		e.Rank, e.Peer, e.PeerEpoch, e.Epoch)
}

// Is makes every StaleEpochError match ErrStaleEpoch.
func (e *StaleEpochError) Is(target error) bool { return target == ErrStaleEpoch }

// MismatchError reports a message whose header disagrees with what this
// rank's own plan expects: the ranks are not running the same collective.
// It matches ErrMismatch.
type MismatchError struct {
	// Peer sent the message; Rank is its rank.
	Peer transport.PeerID
	Rank int
	// Field names the header field that differs: "epoch", "seq", "algo",
	// "dtype", "op", "total", "chunk size", "step", "chunk", "length" (the
	// payload's byte length) or "kind".
	Field string
	// Want is this rank's value, Got the peer's.
	Want, Got uint64
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("ring: mismatch with rank %d (%s): %s: want %d, got %d", e.Rank, e.Peer, e.Field, e.Want, e.Got)
}

// Is makes every MismatchError match ErrMismatch.
func (e *MismatchError) Is(target error) bool { return target == ErrMismatch }

// AbortReason says why the rank that started an abort failed. It travels in
// the abort marker: an empty message on the data channel with the failed
// collective's header but for Kind wire.KindControl, Flags the reason, Step
// the origin's rank and Chunk the culprit's.
type AbortReason uint8

// Abort reasons.
const (
	AbortOther      AbortReason = iota // a local error of another kind
	AbortMismatch                      // a header mismatch (ErrMismatch)
	AbortPeerGone                      // a transport error with a peer (transport.ErrPeerGone)
	AbortTimeout                       // the deadline passed (ErrTimeout)
	AbortCanceled                      // the caller's context ended
	AbortStaleEpoch                    // a member is in a newer epoch (ErrStaleEpoch)
	AbortBehind                        // the culprit is in an older epoch: it is the stale one
	abortReasonEnd
)

func (r AbortReason) String() string {
	switch r {
	case AbortMismatch:
		return "mismatch"
	case AbortPeerGone:
		return "peer gone"
	case AbortTimeout:
		return "timeout"
	case AbortCanceled:
		return "canceled"
	case AbortStaleEpoch:
		return "stale epoch"
	case AbortBehind:
		return "an older epoch"
	}
	return "other"
}

// AbortError reports that a peer failed the collective and sent an abort
// marker, which this rank received (and forwarded to the other members).
// It matches ErrAborted, and also the class of the origin's
// failure: ErrMismatch for AbortMismatch, transport.ErrPeerGone for
// AbortPeerGone (transport.PeerOf then names Culprit) and ErrTimeout for
// AbortTimeout. AbortCanceled matches only ErrAborted: another rank's
// cancelled context is not this caller's.
type AbortError struct {
	// From is the peer the marker came from.
	From transport.PeerID
	// Origin is the peer that failed first, OriginRank its rank.
	Origin     transport.PeerID
	OriginRank int
	// Culprit is the peer the origin's failure was about: the peer that
	// sent it a mismatching message or whose connection failed. It equals
	// Origin when the origin does not know one. CulpritRank is its rank.
	Culprit     transport.PeerID
	CulpritRank int
	Reason      AbortReason
}

func (e *AbortError) Error() string {
	if e.Reason == AbortBehind {
		return fmt.Sprintf("ring: collective aborted (marker from %s): rank %d (%s) is in an older epoch than this rank",
			e.From, e.CulpritRank, e.Culprit)
	}
	return fmt.Sprintf("ring: collective aborted (marker from %s): rank %d (%s) failed with %s involving rank %d (%s)",
		e.From, e.OriginRank, e.Origin, e.Reason, e.CulpritRank, e.Culprit)
}

// Is matches ErrAborted and the error class of Reason.
func (e *AbortError) Is(target error) bool {
	switch target {
	case ErrAborted:
		return true
	case ErrMismatch:
		return e.Reason == AbortMismatch
	case ErrTimeout:
		return e.Reason == AbortTimeout
	case ErrStaleEpoch:
		return e.Reason == AbortStaleEpoch
	}
	return false
}

// Unwrap returns, for AbortPeerGone, a *transport.PeerError naming Culprit,
// so that errors.Is(err, transport.ErrPeerGone) and transport.PeerOf work
// through an abort as they do on the rank that saw the failure itself.
func (e *AbortError) Unwrap() error {
	if e.Reason == AbortPeerGone {
		return &transport.PeerError{Peer: e.Culprit, Op: "abort", Err: errRemoteFailure}
	}
	return nil
}

var errRemoteFailure = errors.New("reported by another rank's abort")

// TimeoutError reports a collective that did not finish within
// Config.CollectiveTimeout although every member was alive: a peer that is
// late beyond reason, or a link that black-holes traffic while heartbeats
// pass.
// It matches ErrTimeout and context.DeadlineExceeded.
type TimeoutError struct {
	// Peer is the peer this rank was waiting for when the deadline passed,
	// if it was waiting on a receive; empty otherwise. Rank is its rank,
	// -1 without one.
	Peer transport.PeerID
	Rank int
	// Deadline is the time the collective was allowed.
	Deadline time.Duration
}

func (e *TimeoutError) Error() string {
	if e.Peer == "" {
		return fmt.Sprintf("ring: collective did not finish within %v", e.Deadline)
	}
	return fmt.Sprintf("ring: collective did not finish within %v (waiting for rank %d, %s, which is alive but late)",
		e.Deadline, e.Rank, e.Peer)
}

// Is matches ErrTimeout and context.DeadlineExceeded.
func (e *TimeoutError) Is(target error) bool {
	return target == ErrTimeout || target == context.DeadlineExceeded
}

// reasonOf classifies a local failure for the abort marker.
func reasonOf(err error) AbortReason {
	switch {
	case errors.Is(err, ErrMismatch):
		return AbortMismatch
	case errors.Is(err, transport.ErrPeerGone):
		return AbortPeerGone
	case errors.Is(err, ErrTimeout):
		return AbortTimeout
	case errors.Is(err, ErrStaleEpoch):
		return AbortStaleEpoch
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return AbortCanceled
	}
	return AbortOther
}
