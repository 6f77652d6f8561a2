package vote

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/gyre-ml/gyre/internal/errs"
)

// A vote's verdict. When it is an error the workers settle before
// returning it: a barrier proves that every worker holds the table, so a
// worker that exits at once on the error (log.Fatal) cannot take with it
// the last messages another worker still needed to reach the same verdict.
// The functions here decide; the engine gathers, settles and returns.

// CheckTable names the ranks whose record has another layout version or
// is of another kind than kind: workers at different steps of the
// protocol, or of different versions.
func CheckTable(recs []Record, versions []int64, kind int64) error {
	var out []error
	for r := range recs {
		switch {
		case versions[r] != Version:
			out = append(out, fmt.Errorf("%w: rank %d sent a version %d record, this worker speaks version %d",
				errs.Diverged, r, versions[r], Version))
		case recs[r].Kind != kind:
			out = append(out, fmt.Errorf("%w: rank %d is at a different step of the protocol (record kind %d, this worker %d)",
				errs.Diverged, r, recs[r].Kind, kind))
		}
	}
	return errors.Join(out...)
}

// Failed lists the ranks whose record reports a failed collective, and
// why (StatusName), in rank order; nil if none did.
func Failed(recs []Record) (ranks []int, reasons []string) {
	for r, rec := range recs {
		if rec.Status != StatusOK {
			ranks = append(ranks, r)
			reasons = append(reasons, StatusName(rec.Status))
		}
	}
	return ranks, reasons
}

// Diverged names the ranks of a table with no failure whose iteration,
// share or decision differs from own (this worker's record) and shares
// (the view's), or else whose state digest differs from rank 0's.
func Diverged(recs []Record, own Record, shares []int) error {
	var out []error
	for r, rec := range recs {
		switch {
		case rec.Iter != own.Iter:
			out = append(out, fmt.Errorf("%w: rank %d ended iteration %d, this worker %d", errs.Diverged, r, rec.Iter, own.Iter))
		case rec.Share != int64(shares[r]):
			out = append(out, fmt.Errorf("%w: rank %d used share %d, expected %d", errs.Diverged, r, rec.Share, shares[r]))
		case rec.Decision != own.Decision:
			out = append(out, fmt.Errorf("%w: rank %d decided a different view or shares", errs.Diverged, r))
		}
	}
	if len(out) == 0 {
		out = DivergedStates(recs)
	}
	return errors.Join(out...)
}

// DivergedStates names the ranks whose state digest differs from rank 0's,
// or whose decision to check differs.
func DivergedStates(recs []Record) []error {
	var out []error
	for r, rec := range recs[1:] {
		switch {
		case (rec.Digest == 0) != (recs[0].Digest == 0):
			out = append(out, fmt.Errorf("%w: rank %d and rank 0 disagree about checking the state at this boundary", errs.Diverged, r+1))
		case rec.Digest != recs[0].Digest:
			out = append(out, fmt.Errorf("%w: rank %d holds a different state from rank 0 (digest %016x, rank 0 %016x)",
				errs.Diverged, r+1, rec.Digest, recs[0].Digest))
		}
	}
	return out
}

// PeerGoneIn reports whether a record of the table says that its
// worker's collective lost a peer.
func PeerGoneIn(recs []Record) bool {
	for _, rec := range recs {
		if rec.Status == StatusPeerGone {
			return true
		}
	}
	return false
}

// LateRanks returns the ranks that a table whose only failures are
// timeouts shows late: their compute time (Batch to Wait) exceeds the
// quickest rank's by at least half of timeout, the others having given up
// on them after timeout. Nil if there are none, or the table failed
// otherwise. It depends on the table alone, so every member finds the
// same ranks.
func LateRanks(recs []Record, timeout time.Duration) []int {
	quickest, timedOut := int64(math.MaxInt64), false
	for _, rec := range recs {
		switch rec.Status {
		case StatusOK:
		case StatusTimeout:
			timedOut = true
		default:
			return nil
		}
		quickest = min(quickest, rec.Compute)
	}
	if !timedOut {
		return nil
	}
	var late []int
	for r, rec := range recs {
		if rec.Compute-quickest >= int64(timeout/2) {
			late = append(late, r)
		}
	}
	if len(late) == len(recs) {
		return nil // everyone: nobody to leave out
	}
	return late
}

// RedoMismatch reports whether a failed table at iteration iter is a
// mismatch to redo: the only failures are mismatches, and the last one
// redone (redone; -1 for none) was at another iteration. A second one at
// the same iteration is a trainer's bug, and terminal. Every member
// judges the same table at the same iteration with the same history, so
// all decide alike; the caller records the redo.
func RedoMismatch(recs []Record, iter, redone int64) bool {
	seen := false
	for _, rec := range recs {
		switch rec.Status {
		case StatusOK:
		case StatusMismatch:
			seen = true
		default:
			return false
		}
	}
	return seen && redone != iter
}

// MaxCheckInterval bounds how many iterations may pass between state
// checks however costly hashing is.
const MaxCheckInterval = 1000

// CheckInterval returns how many iterations to wait before the next state
// check so that hashing costs at most 1% of the iteration time, judged
// from the table, so every worker derives the same interval. Hashing a
// small model costs nothing and is done at every boundary; a large one is
// checked every K iterations. The iteration time is the longest wall time
// between boundaries in the table.
func CheckInterval(recs []Record) int64 {
	var hash, iter int64
	for _, r := range recs {
		hash, iter = max(hash, r.HashNs), max(iter, r.Wall)
	}
	if hash == 0 || hash*100 <= iter {
		return 1
	}
	if iter == 0 {
		return MaxCheckInterval
	}
	return min((hash*100+iter-1)/iter, MaxCheckInterval)
}

// NewestCheckpoint returns the rank whose resume record names the newest
// checkpoint, the highest (epoch, iteration), the lowest rank on a tie;
// -1 if no record names one.
func NewestCheckpoint(recs []Record) int {
	best := -1
	for r, rec := range recs {
		if rec.Iter < 0 {
			continue
		}
		if best < 0 || rec.Epoch > recs[best].Epoch || rec.Epoch == recs[best].Epoch && rec.Iter > recs[best].Iter {
			best = r
		}
	}
	return best
}
