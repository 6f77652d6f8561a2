package engine

import (
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
	p := liveness.Progress{Iter: e.it.now.Load(), Left: e.it.left.Load()}
	if v != nil {
		p.Epoch, p.Begun = v.Epoch, v.Begun()
	}
	return p
}

// abandon closes v, a view this worker saw fail, and says so in its
// heartbeats (liveness.Progress.Left): members still in a step of v that
// no collective guards end it at once (recoverer.Watch) rather than wait
// on this worker, alive but gone from v.
func (e *Engine) abandon(v *view.View) {
	if v == nil {
		return
	}
	v.Close()
	for {
		left := e.it.left.Load()
		if v.Epoch <= left || e.it.left.CompareAndSwap(left, v.Epoch) {
			return
		}
	}
}

// onStall returns the stall report of v's communicator on channel.
func (e *Engine) onStall(v *view.View, channel string) func(ring.Stall) {
	sv := obs.StalledView{Epoch: v.Epoch, IDs: v.IDs, Rank: v.Rank, Begun: v.Begun}
	if channel == view.DataChannel {
		sv.Pending = func() []string { return append(v.F32.Pending(), v.F64.Pending()...) }
	}
	return obs.Stalls{Live: e.live, Log: e.log, Observer: e.rep.Observer, Iter: e.it.now.Load,
		Step: func() string { return ctrlStepNames[e.it.ctrlStep.Load()] }}.For(sv)
}
