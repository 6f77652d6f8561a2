package engine

import (
	"time"

	"github.com/gyre-ml/gyre/internal/obs"
	"github.com/gyre-ml/gyre/internal/view"
	"github.com/gyre-ml/gyre/liveness"
	"github.com/gyre-ml/gyre/ring"
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
func (e *Engine) progress() liveness.Progress {
	v := e.shared.Load()
	p := liveness.Progress{Iter: e.it.now.Load()}
	if v != nil {
		p.Epoch, p.Begun = v.Epoch, v.Begun()
	}
	return p
}

// onStall returns the stall report of v's communicator on channel
// (view.DataChannel or view.ControlChannel): it logs the ranks whose
// heartbeats say they have not reached the collective, and the tensors
// pending, and tells the observer.
func (e *Engine) onStall(v *view.View, channel string) func(ring.Stall) {
	return func(s ring.Stall) {
		mine := liveness.Progress{Epoch: v.Epoch, Iter: e.it.now.Load(), Begun: v.Begun()}
		// Only a heartbeat that came after the collective began says
		// whether its sender has reached it.
		began := time.Now().Add(-s.Waited)
		peers := make([]obs.PeerProgress, 0, len(v.IDs)-1)
		for r, id := range v.IDs {
			if r != v.Rank {
				at, heard, ok := e.live.Progress(id)
				peers = append(peers, obs.PeerProgress{Rank: r, At: at, Known: ok && heard.After(began)})
			}
		}
		behind, unknown := obs.NotArrived(mine, peers)
		var pending []string
		collective, step := obs.StallData, ""
		switch channel {
		case view.DataChannel:
			pending = append(v.F32.Pending(), v.F64.Pending()...)
			if len(pending) > 0 {
				collective = obs.StallGradients
			}
		case view.ControlChannel:
			collective, step = obs.StallControl, ctrlStepNames[e.it.ctrlStep.Load()]
		}
		st := obs.Stall{Collective: collective, Step: step, Op: s.Algo.Op(), Bytes: s.Bytes, Epoch: s.Epoch, Iter: mine.Iter,
			Begun: mine.Begun, Waited: s.Waited, Rank: v.Rank, Behind: behind, Unknown: unknown, Pending: pending}
		ev := e.log.Warn().Str("collective", collective)
		if step != "" {
			ev = ev.Str("step", step)
		}
		ev.Str("op", st.Op).Int("bytes", s.Bytes).Uint64("epoch", s.Epoch).
			Int64("iter", mine.Iter).Dur("waited", s.Waited).Ints("behind", obs.NonNil(behind)).Ints("no_progress", unknown).
			Int("awaiting_rank", s.Peer).Strs("pending", obs.NonNil(pending)).
			Msg(obs.StallMessage(st, s.Peer, v.IDs, peers))
		if so, ok := e.rep.Observer.(obs.StallObserver); ok {
			so.Stall(st)
		}
	}
}
