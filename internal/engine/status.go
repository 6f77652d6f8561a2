package engine

import (
	"math"
	"time"

	"github.com/gyre-ml/gyre/internal/gossip"
	"github.com/gyre-ml/gyre/internal/vote"
)

// ReportLoss records the trainer's latest loss, which this worker's
// gossip metadata carries for gyre status; safe from any goroutine.
func (e *Engine) ReportLoss(loss float64) {
	e.loss.Store(math.Float64bits(loss))
	e.lossSet.Store(true)
}

// jobStatus is this worker's status of the job at a boundary whose table
// is recs, iters iterations after its view last published one: its share
// of the global batch, and its samples/s over its compute time, the job's
// over rank 0's time between boundaries, both since that publication;
// and the last loss reported.
func (e *Engine) jobStatus(recs []vote.Record, iters int64) gossip.Status {
	var st gossip.Status
	for _, r := range recs {
		st.Global += int32(r.Share)
	}
	if self := e.cur.Rank; self >= 0 && self < len(recs) {
		st.Share = int32(recs[self].Share)
	}
	st.Rate = perSecond(e.merge.samples, e.merge.computeNs)
	st.JobRate = perSecond(iters*int64(st.Global), int64(e.merge.sincePub))
	if e.lossSet.Load() {
		st.Loss, st.HasLoss = float32(math.Float64frombits(e.loss.Load())), true
	}
	return st
}

// perSecond is n per ns nanoseconds, 0 if ns is not positive.
func perSecond(n, ns int64) float32 {
	if ns <= 0 {
		return 0
	}
	return float32(float64(n) / time.Duration(ns).Seconds())
}
