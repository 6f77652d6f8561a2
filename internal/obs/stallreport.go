package obs

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/liveness"
	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/transport"
)

// Stall reports (Config.StallThreshold), as Horovod's stall inspector
// makes them. A ring rank knows only whose message it waits for, and that
// neighbour may itself be waiting. So every worker's heartbeats carry its
// progress (liveness.Progress: epoch, iteration, collectives begun), and a
// worker stalled in a collective names the ranks whose last progress is
// behind its own: they have not reached the collective. Every rank begins
// the same collectives in the same order, so the counts compare.

// What a stalled collective was, for reports and the metric's label.
const (
	StallGradients = "gradients" // on the data channel, with gradient buckets pending
	StallData      = "data"      // on the data channel otherwise: Worker.Comm, AllGather64, Reduce, state broadcasts
	StallControl   = "control"   // on the control channel: votes and barriers
)

// PeerProgress is what a peer's latest heartbeat said of its progress;
// known is false if none has since the stalled collective began.
type PeerProgress struct {
	Rank  int
	At    liveness.Progress
	Known bool
}

// NotArrived returns the ranks of peers whose progress is behind mine, and
// those whose progress is not known. It is the report's decision, kept
// apart from the I/O.
func NotArrived(mine liveness.Progress, peers []PeerProgress) (behind, unknown []int) {
	for _, p := range peers {
		switch {
		case !p.Known:
			unknown = append(unknown, p.Rank)
		case p.At.Before(mine):
			behind = append(behind, p.Rank)
		}
	}
	return behind, unknown
}

// NonNil makes an empty list log as [] rather than null.
func NonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// StallMessage says in words who the stalled collective waits for.
func StallMessage(st Stall, awaiting int, ids []transport.PeerID, peers []PeerProgress) string {
	var b strings.Builder
	fmt.Fprintf(&b, "stall: waited %s in %s of iteration %d; ", st.Waited.Round(time.Millisecond), describeStalled(st), st.Iter)
	switch {
	case len(st.Behind) > 0:
		b.WriteString("not yet arrived:")
		for _, r := range st.Behind {
			i := slices.IndexFunc(peers, func(p PeerProgress) bool { return p.Rank == r })
			at := peers[i].At
			if at.Epoch == st.Epoch {
				fmt.Fprintf(&b, " rank %d (%s, at iteration %d, %d collective(s) behind)", r, ids[r], at.Iter, st.Begun-at.Begun)
			} else {
				fmt.Fprintf(&b, " rank %d (%s, at iteration %d of epoch %d)", r, ids[r], at.Iter, at.Epoch)
			}
		}
	case len(st.Unknown) > 0:
		fmt.Fprintf(&b, "no heartbeat since it began has said where ranks %v are", st.Unknown)
	case awaiting >= 0:
		fmt.Fprintf(&b, "every rank has arrived; this rank waits on rank %d (%s), for a message or for it to read one", awaiting, ids[awaiting])
	default:
		b.WriteString("every rank has arrived")
	}
	if len(st.Pending) > 0 {
		fmt.Fprintf(&b, "; pending tensors: %s", strings.Join(st.Pending, ", "))
	}
	return b.String()
}

// describeStalled names the stalled collective in words.
func describeStalled(st Stall) string {
	switch st.Collective {
	case StallGradients:
		return fmt.Sprintf("the gradients' %s (%d bytes)", st.Op, st.Bytes)
	case StallControl:
		return fmt.Sprintf("the %s's %s on the control channel", st.Step, st.Op)
	}
	return fmt.Sprintf("a data-channel %s (%d bytes)", st.Op, st.Bytes)
}

// Stalls makes the stall reports of a worker's collectives.
type Stalls struct {
	Live *liveness.Monitor
	Log  zerolog.Logger
	// Observer hears of each report, if it has a Stall method.
	Observer Observer
	// Iter is the worker's iteration; Step says what the control channel's
	// collectives belong to (join, boundary or leave).
	Iter func() int64
	Step func() string
}

// StalledView is the view whose communicator stalls: its epoch, members
// and this worker's rank, how many collectives it has begun, and, on
// the data channel, the gradient tensors pending (nil on the control
// channel).
type StalledView struct {
	Epoch   uint64
	IDs     []transport.PeerID
	Rank    int
	Begun   func() uint64
	Pending func() []string
}

// For returns the stall report of v's communicator: it logs the ranks
// whose heartbeats say they have not reached the collective, and the
// tensors pending, and tells the observer.
func (st Stalls) For(v StalledView) func(ring.Stall) {
	return func(s ring.Stall) {
		mine := liveness.Progress{Epoch: v.Epoch, Iter: st.Iter(), Begun: v.Begun()}
		// Only a heartbeat that came after the collective began says
		// whether its sender has reached it.
		began := time.Now().Add(-s.Waited)
		peers := make([]PeerProgress, 0, len(v.IDs)-1)
		for r, id := range v.IDs {
			if r != v.Rank {
				at, heard, ok := st.Live.Progress(id)
				peers = append(peers, PeerProgress{Rank: r, At: at, Known: ok && heard.After(began)})
			}
		}
		behind, unknown := NotArrived(mine, peers)
		var pending []string
		collective, step := StallData, ""
		if v.Pending != nil {
			if pending = v.Pending(); len(pending) > 0 {
				collective = StallGradients
			}
		} else {
			collective, step = StallControl, st.Step()
		}
		report := Stall{Collective: collective, Step: step, Op: s.Algo.Op(), Bytes: s.Bytes, Epoch: s.Epoch, Iter: mine.Iter,
			Begun: mine.Begun, Waited: s.Waited, Rank: v.Rank, Behind: behind, Unknown: unknown, Pending: pending}
		ev := st.Log.Warn().Str("collective", collective)
		if step != "" {
			ev = ev.Str("step", step)
		}
		ev.Str("op", report.Op).Int("bytes", s.Bytes).Uint64("epoch", s.Epoch).
			Int64("iter", mine.Iter).Dur("waited", s.Waited).Ints("behind", NonNil(behind)).Ints("no_progress", unknown).
			Int("awaiting_rank", s.Peer).Strs("pending", NonNil(pending)).
			Msg(StallMessage(report, s.Peer, v.IDs, peers))
		if so, ok := st.Observer.(StallObserver); ok {
			so.Stall(report)
		}
	}
}
