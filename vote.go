package gyre

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/gyre-ml/gyre/balance"
	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/transport"
)

// A vote is one allgather of a fixed-size record per worker on the view's
// control Comm. Every worker then holds the identical table and judges it
// with the same deterministic code, so all reach the same verdict with no
// coordinator. When the verdict is an error, the workers settle before
// returning it: a barrier proves that every worker holds the table, so a
// worker that exits at once on the error (log.Fatal) cannot take with it
// the last messages another worker still needed to reach the same verdict.

// Errors returned by Join and Boundary.
var (
	// ErrIterationFailed is matched by every *IterationError.
	ErrIterationFailed = errors.New("gyre: iteration failed")
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
}

func (e *IterationError) Error() string {
	parts := make([]string, len(e.Ranks))
	for i, r := range e.Ranks {
		parts[i] = fmt.Sprintf("rank %d (%s)", r, e.Reasons[i])
	}
	msg := fmt.Sprintf("gyre: iteration %d failed on %s", e.Iter, strings.Join(parts, ", "))
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

// Record kinds: a table mixing kinds means workers are at different points
// of the protocol.
const (
	kindSettings = 1 + iota // Join: state layout and batch settings
	kindSynced              // Join: the state broadcast's outcome
	kindBoundary            // Boundary
	kindAdmit               // Join: admitting workers before iteration 0
	kindResume              // Join: the newest checkpoint each worker holds, and loading it
)

// recordVersion is the boundary record's layout version. It grows when
// fields are added, which also changes recordLen.
const recordVersion = 7

// Sizes of the record's fixed arrays.
const (
	joinerSlots = 8 // pending joiners listed per boundary
	spareWords  = 0 // room for further fields (grow recordLen and the version)
)

// record is one worker's row of a vote. Every worker sends the same
// fixed-size encoding, as the ring allgather needs equal contributions.
type record struct {
	kind  int64
	iter  int64
	share int64
	// compute is the iteration's compute time in ns (Batch to Wait).
	compute int64
	// decision digests the view and shares this worker will use next;
	// settings digests the settings that must never differ.
	decision uint64
	// status is statusOK if every collective of the iteration completed,
	// else the failure's class (see statusOf).
	status int64
	// digest is the state digest (0: not checked at this vote), hashNs the
	// time it took.
	digest uint64
	hashNs int64
	// layout is the state layout (Join only).
	layout uint64
	// wall is the wall time in ns since the previous boundary (or Join):
	// the iteration time that the state check's budget is a share of.
	wall int64
	// leave says this worker asked to leave at this boundary.
	leave bool
	// minWorkers and maxWorkers are this worker's Config bounds.
	minWorkers, maxWorkers int64
	// joiners are hashes (joinerHash) of the pending workers this worker
	// may list: its admission handshake with each is done (admissions.ready);
	// 0 marks an empty slot.
	joiners [joinerSlots]uint64
	// model is this worker's fitted compute model (zero: none yet), and
	// speedChanged says its estimator saw its speed change.
	model        balance.Model
	speedChanged bool
	// minShare and maxShare bound this worker's share (maxShare 0: no cap
	// of its own). maxShare comes from headroom, the device memory in
	// bytes this worker's batch may take (0: unknown; see shareCap).
	minShare, maxShare int64
	headroom           int64
	// epoch is the job epoch of the newest checkpoint this worker holds
	// (kindResume; its iteration is in iter, its checksum in digest), and
	// dirEpoch the highest any file of its directory names, valid or not.
	epoch, dirEpoch uint64
	// ckptFailed says a checkpoint of this worker's could not be written
	// and it runs with CheckpointRequired (kindBoundary): the job ends.
	ckptFailed bool
}

const recordLen = 24 + joinerSlots + spareWords

func (r *record) encode() []int64 {
	row := make([]int64, 0, recordLen)
	row = append(row, recordVersion<<8|r.kind, r.iter, r.share, r.compute, int64(r.decision),
		r.status, int64(r.digest), r.hashNs, int64(r.layout), r.wall, boolInt(r.leave), r.minWorkers, r.maxWorkers,
		r.model.FixedNs, r.model.RateMicro, boolInt(r.speedChanged), r.minShare, r.maxShare)
	for _, j := range r.joiners {
		row = append(row, int64(j))
	}
	row = append(row, r.headroom, boolInt(r.model.Flat), int64(r.epoch), int64(r.dirEpoch), boolInt(r.ckptFailed), r.model.NoisePpm)
	return row[:recordLen]
}

func decodeRecord(row []int64) (record, int64) {
	r := record{kind: row[0] & 0xff, iter: row[1], share: row[2], compute: row[3], decision: uint64(row[4]),
		status: row[5], digest: uint64(row[6]), hashNs: row[7], layout: uint64(row[8]), wall: row[9],
		leave: row[10] != 0, minWorkers: row[11], maxWorkers: row[12],
		model: balance.Model{FixedNs: row[13], RateMicro: row[14]}, speedChanged: row[15] != 0,
		minShare: row[16], maxShare: row[17]}
	for i := range r.joiners {
		r.joiners[i] = uint64(row[18+i])
	}
	r.headroom = row[18+joinerSlots]
	r.model.Flat = row[19+joinerSlots] != 0
	r.epoch, r.dirEpoch = uint64(row[20+joinerSlots]), uint64(row[21+joinerSlots])
	r.ckptFailed = row[22+joinerSlots] != 0
	r.model.NoisePpm = row[23+joinerSlots]
	return r, row[0] >> 8
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// vote allgathers rec among the view's workers on the control Comm and
// returns every worker's record in rank order. A failed allgather means a
// worker is lost or the caller's ctx ended.
func (w *Worker) vote(ctx context.Context, vs *viewState, rec record) ([]record, error) {
	n := len(vs.ids)
	table := make([]int64, n*recordLen)
	copy(table[vs.rank*recordLen:], rec.encode())
	if err := ring.AllGather(ctx, vs.ctrl, table); err != nil {
		return nil, w.lost(vs, rec.iter, err)
	}
	recs := make([]record, n)
	var errs []error
	for r := range recs {
		var version int64
		recs[r], version = decodeRecord(table[r*recordLen:])
		switch {
		case version != recordVersion:
			errs = append(errs, fmt.Errorf("%w: rank %d sent a version %d record, this worker speaks version %d",
				ErrDiverged, r, version, recordVersion))
		case recs[r].kind != rec.kind:
			errs = append(errs, fmt.Errorf("%w: rank %d is at a different step of the protocol (record kind %d, this worker %d)",
				ErrDiverged, r, recs[r].kind, rec.kind))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, w.settle(ctx, vs, err)
	}
	return recs, nil
}

// lost turns a failed vote into the error every survivor reports: a
// *PeerLostError naming the peer the data plane blamed, if it named one.
func (w *Worker) lost(vs *viewState, iter int64, err error) error {
	if errors.Is(err, ring.ErrClosed) {
		return ErrClosed
	}
	if lostPeer(err) { // ErrNotConnected: a failed send abandoned the link
		if r, p, ok := w.blame(vs, err); ok {
			return w.peerLostError(iter, r, p, err)
		}
	}
	if iter < 0 {
		return fmt.Errorf("gyre: join: vote: %w", err)
	}
	return fmt.Errorf("gyre: boundary of iteration %d: vote: %w", iter, err)
}

// blame names the member lost when err, a peer-gone failure, ended a
// collective: the member unheard for longest, if any has been silent past
// PeerTimeout; else, after blameGrace, the member whose heartbeat
// connection broke first; else the peer err names. Liveness comes first
// because a crash is often seen through its consequences: a survivor that
// learned of it first and gave up closes its connections at once, so the
// peer err names may be that survivor, while the crashed member's silence
// takes PeerTimeout to show and its broken connections (a killed process's
// reset) came first. Every survivor blames the crashed one all the same.
func (w *Worker) blame(vs *viewState, err error) (int, transport.PeerID, bool) {
	now, best, longest := time.Now(), -1, w.cfg.PeerTimeout
	for r, id := range vs.ids {
		if r == vs.rank {
			continue
		}
		if silent := now.Sub(w.live.LastHeard(id)); silent > longest {
			best, longest = r, silent
		}
	}
	if best >= 0 {
		return best, vs.ids[best], true
	}
	time.Sleep(blameGrace) // every break of the moment has been seen
	var first time.Time
	for r, id := range vs.ids {
		if at, ok := w.live.Broken(id); ok && r != vs.rank && (best < 0 || at.Before(first)) {
			best, first = r, at
		}
	}
	if best >= 0 {
		return best, vs.ids[best], true
	}
	if p, ok := transport.PeerOf(err); ok {
		return vs.rankOf(p), p, true
	}
	return -1, "", false
}

// blameGrace is how long blame waits for the heartbeat connections to
// report breaks that happened at the same moment as the one that ended the
// collective.
const blameGrace = 100 * time.Millisecond

// settle returns verdict once every worker holds the table it came from.
// All workers judge the same table, so when one settles all do; the
// barrier's own failure (a worker that died after sending its record) does
// not change the verdict. A nil verdict needs no settling: no worker stops.
func (w *Worker) settle(ctx context.Context, vs *viewState, verdict error) error {
	if verdict == nil {
		return nil
	}
	if err := vs.ctrl.Barrier(ctx); err != nil {
		w.log.Debug().Err(err).Msg("settling a failed vote: barrier failed; the verdict stands")
	}
	return verdict
}

// peerGoneIn reports whether a record of the table says that its
// worker's collective lost a peer.
func peerGoneIn(recs []record) bool {
	for _, rec := range recs {
		if rec.status == statusPeerGone {
			return true
		}
	}
	return false
}

// lateRanks returns the ranks that a table whose only failures are
// timeouts shows late: their compute time (Batch to Wait) exceeds the
// quickest rank's by at least half of timeout, the others having given up
// on them after timeout. Nil if there are none, or the table failed
// otherwise. It depends on the table alone, so every member finds the
// same ranks.
func lateRanks(recs []record, timeout time.Duration) []int {
	quickest, timedOut := int64(math.MaxInt64), false
	for _, rec := range recs {
		switch rec.status {
		case statusOK:
		case statusTimeout:
			timedOut = true
		default:
			return nil
		}
		quickest = min(quickest, rec.compute)
	}
	if !timedOut {
		return nil
	}
	var late []int
	for r, rec := range recs {
		if rec.compute-quickest >= int64(timeout/2) {
			late = append(late, r)
		}
	}
	if len(late) == len(recs) {
		return nil // everyone: nobody to leave out
	}
	return late
}

// redoMismatch reports whether a failed table is a mismatch to redo: the
// only failures are mismatches, and none was redone at this iteration
// before. A second one at the same iteration is a trainer's bug, and
// terminal. Every member judges the same table at the same iteration with
// the same history, so all decide alike.
func (w *Worker) redoMismatch(recs []record) bool {
	seen := false
	for _, rec := range recs {
		switch rec.status {
		case statusOK:
		case statusMismatch:
			seen = true
		default:
			return false
		}
	}
	if !seen || w.redoneMismatch == w.iter {
		return false
	}
	w.redoneMismatch = w.iter
	return true
}

// failures lists the ranks whose record reports a failed collective, as an
// *IterationError, or nil if none did.
func failures(recs []record, iter int64, local error) error {
	e := &IterationError{Iter: iter, Local: local}
	for r, rec := range recs {
		if rec.status != statusOK {
			e.Ranks = append(e.Ranks, r)
			e.Reasons = append(e.Reasons, statusName(rec.status))
		}
	}
	if len(e.Ranks) == 0 {
		return nil
	}
	return e
}

// Statuses in a record: how the iteration's collectives ended on a rank.
const (
	statusOK = iota
	statusOther
	statusMismatch
	statusPeerGone
	statusTimeout
	statusCanceled
	statusClosed
)

var statusNames = [...]string{statusOK: "ok", statusOther: "other", statusMismatch: "mismatch",
	statusPeerGone: "peer gone", statusTimeout: "timeout", statusCanceled: "canceled", statusClosed: "closed"}

// statusOf classifies a local failure for the record.
func statusOf(err error) int64 {
	switch {
	case err == nil:
		return statusOK
	case errors.Is(err, ring.ErrMismatch):
		return statusMismatch
	case errors.Is(err, transport.ErrPeerGone):
		return statusPeerGone
	case errors.Is(err, ring.ErrTimeout):
		return statusTimeout
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return statusCanceled
	case errors.Is(err, ring.ErrClosed), errors.Is(err, ErrClosed):
		return statusClosed
	}
	return statusOther
}

func statusName(s int64) string {
	if s > statusOK && int(s) < len(statusNames) {
		return statusNames[s]
	}
	return "other"
}

// digestState hashes the state if this vote checks it, and says how long
// that took.
func (w *Worker) digestState(check bool) (uint64, int64, error) {
	if !check {
		return 0, 0, nil
	}
	start := time.Now()
	d, err := w.state.Digest()
	// 0 means "not checked" in a record; a real digest of 0 becomes 1.
	return max(d, 1), max(time.Since(start).Nanoseconds(), 1), err
}

// divergedStates names the ranks whose state digest differs from rank 0's,
// or whose decision to check differs.
func divergedStates(recs []record) []error {
	var errs []error
	for r, rec := range recs[1:] {
		switch {
		case (rec.digest == 0) != (recs[0].digest == 0):
			errs = append(errs, fmt.Errorf("%w: rank %d and rank 0 disagree about checking the state at this boundary", ErrDiverged, r+1))
		case rec.digest != recs[0].digest:
			errs = append(errs, fmt.Errorf("%w: rank %d holds a different state from rank 0 (digest %016x, rank 0 %016x)",
				ErrDiverged, r+1, rec.digest, recs[0].digest))
		}
	}
	return errs
}

// maxCheckInterval bounds how many iterations may pass between state
// checks however costly hashing is.
const maxCheckInterval = 1000

// checkInterval returns how many iterations to wait before the next state
// check so that hashing costs at most 1% of the iteration time, judged
// from the table, so every worker derives the same interval. Hashing a
// small model costs nothing and is done at every boundary; a large one is
// checked every K iterations. The iteration time is the longest wall time
// between boundaries in the table.
func checkInterval(recs []record) int64 {
	var hash, iter int64
	for _, r := range recs {
		hash, iter = max(hash, r.hashNs), max(iter, r.wall)
	}
	if hash == 0 || hash*100 <= iter {
		return 1
	}
	if iter == 0 {
		return maxCheckInterval
	}
	return min((hash*100+iter-1)/iter, maxCheckInterval)
}
