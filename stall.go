package gyre

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gyre-ml/gyre/internal/obs"
	"github.com/gyre-ml/gyre/liveness"
	"github.com/gyre-ml/gyre/ring"
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
	stallGradients = "gradients" // on the data channel, with gradient buckets pending
	stallData      = "data"      // on the data channel otherwise: Worker.Comm, AllGather64, Reduce, state broadcasts
	stallControl   = "control"   // on the control channel: votes and barriers
)

// ctrlStep says what the control channel's collectives belong to: Join,
// the boundaries, or Leave. The trainer's goroutine sets it; stall reports
// read it.
type ctrlStep int32

const (
	stepJoin ctrlStep = iota
	stepBoundary
	stepLeave
)

var ctrlStepNames = [...]string{stepJoin: "join", stepBoundary: "boundary", stepLeave: "leave"}

// progress is this worker's progress, for its heartbeats.
func (w *Worker) progress() liveness.Progress {
	vs := w.view.Load()
	p := liveness.Progress{Iter: w.iterNow.Load()}
	if vs != nil {
		p.Epoch, p.Begun = vs.view.Epoch, vs.begun()
	}
	return p
}

// setIter sets the iteration, and the copy the heartbeats read.
func (w *Worker) setIter(iter int64) {
	w.iter = iter
	w.iterNow.Store(iter)
}

// begun counts the collectives begun on the view's two communicators.
// Every rank runs the gradient buckets of an iteration and then its vote,
// in the same order, so the sum is a position in the epoch every rank
// passes through.
func (vs *viewState) begun() uint64 {
	var n uint64
	if vs.data != nil {
		n += vs.data.Started()
	}
	if vs.ctrl != nil {
		n += vs.ctrl.Started()
	}
	return n
}

// peerProgress is what a peer's latest heartbeat said of its progress;
// known is false if none has since the stalled collective began.
type peerProgress struct {
	rank  int
	at    liveness.Progress
	known bool
}

// notArrived returns the ranks of peers whose progress is behind mine, and
// those whose progress is not known. It is the report's decision, kept
// apart from the I/O.
func notArrived(mine liveness.Progress, peers []peerProgress) (behind, unknown []int) {
	for _, p := range peers {
		switch {
		case !p.known:
			unknown = append(unknown, p.rank)
		case p.at.Before(mine):
			behind = append(behind, p.rank)
		}
	}
	return behind, unknown
}

// onStall returns the stall report of vs's communicator on channel what
// (stallData or stallControl).
func (w *Worker) onStall(vs *viewState, what string) func(ring.Stall) {
	return func(s ring.Stall) {
		mine := liveness.Progress{Epoch: vs.view.Epoch, Iter: w.iterNow.Load(), Begun: vs.begun()}
		// Only a heartbeat that came after the collective began says
		// whether its sender has reached it.
		began := time.Now().Add(-s.Waited)
		peers := make([]peerProgress, 0, len(vs.ids)-1)
		for r, id := range vs.ids {
			if r != vs.rank {
				at, heard, ok := w.live.Progress(id)
				peers = append(peers, peerProgress{rank: r, at: at, known: ok && heard.After(began)})
			}
		}
		behind, unknown := notArrived(mine, peers)
		var pending []string
		collective, step := what, ""
		switch what {
		case stallData:
			pending = append(vs.f32.Pending(), vs.f64.Pending()...)
			if len(pending) > 0 {
				collective = stallGradients
			}
		case stallControl:
			step = ctrlStepNames[w.ctrlStep.Load()]
		}
		st := obs.Stall{Collective: collective, Step: step, Op: s.Algo.Op(), Bytes: s.Bytes, Epoch: s.Epoch, Iter: mine.Iter,
			Begun: mine.Begun, Waited: s.Waited, Rank: vs.rank, Behind: behind, Unknown: unknown, Pending: pending}
		ev := w.log.Warn().Str("collective", collective)
		if step != "" {
			ev = ev.Str("step", step)
		}
		ev.Str("op", st.Op).Int("bytes", s.Bytes).Uint64("epoch", s.Epoch).
			Int64("iter", mine.Iter).Dur("waited", s.Waited).Ints("behind", nonNil(behind)).Ints("no_progress", unknown).
			Int("awaiting_rank", s.Peer).Strs("pending", nonNil(pending)).
			Msg(stallMessage(st, s.Peer, vs, peers))
		if so, ok := w.observer.(obs.StallObserver); ok {
			so.Stall(st)
		}
	}
}

// nonNil makes an empty list log as [] rather than null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// stallMessage says in words who the stalled collective waits for.
func stallMessage(st obs.Stall, awaiting int, vs *viewState, peers []peerProgress) string {
	var b strings.Builder
	fmt.Fprintf(&b, "stall: waited %s in %s of iteration %d; ", st.Waited.Round(time.Millisecond), describeStalled(st), st.Iter)
	switch {
	case len(st.Behind) > 0:
		b.WriteString("not yet arrived:")
		for _, r := range st.Behind {
			i := slices.IndexFunc(peers, func(p peerProgress) bool { return p.rank == r })
			at := peers[i].at
			if at.Epoch == st.Epoch {
				fmt.Fprintf(&b, " rank %d (%s, at iteration %d, %d collective(s) behind)", r, vs.ids[r], at.Iter, st.Begun-at.Begun)
			} else {
				fmt.Fprintf(&b, " rank %d (%s, at iteration %d of epoch %d)", r, vs.ids[r], at.Iter, at.Epoch)
			}
		}
	case len(st.Unknown) > 0:
		fmt.Fprintf(&b, "no heartbeat since it began has said where ranks %v are", st.Unknown)
	case awaiting >= 0:
		fmt.Fprintf(&b, "every rank has arrived; this rank waits on rank %d (%s), for a message or for it to read one", awaiting, vs.ids[awaiting])
	default:
		b.WriteString("every rank has arrived")
	}
	if len(st.Pending) > 0 {
		fmt.Fprintf(&b, "; pending tensors: %s", strings.Join(st.Pending, ", "))
	}
	return b.String()
}

// describeStalled names the stalled collective in words.
func describeStalled(st obs.Stall) string {
	switch st.Collective {
	case stallGradients:
		return fmt.Sprintf("the gradients' %s (%d bytes)", st.Op, st.Bytes)
	case stallControl:
		return fmt.Sprintf("the %s's %s on the control channel", st.Step, st.Op)
	}
	return fmt.Sprintf("a data-channel %s (%d bytes)", st.Op, st.Bytes)
}
