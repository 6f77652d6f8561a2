package gyre

import (
	"slices"

	"github.com/gyre-ml/gyre/balance"
)

// balanceRecord feeds the iteration's compute time to this worker's
// estimator and puts its model and share bounds in rec. A failed
// iteration, or one with no samples, teaches nothing.
func (w *Worker) balanceRecord(rec *record) {
	rec.minShare = int64(w.minShare())
	if w.cfg.Balance != BalanceLBBSP {
		return
	}
	if w.failed == nil && w.compute > 0 {
		rec.speedChanged = w.est.Add(balance.Obs{Samples: int(rec.share), Seconds: w.compute.Seconds()})
	}
	rec.model, _ = w.est.Fit()
}

// minShare is the smallest share a worker may get: 1, or 0 with
// BalanceAllowZero.
func (w *Worker) minShare() int {
	if w.cfg.BalanceAllowZero {
		return 0
	}
	return 1
}

// batchFit is the most workers the global batch can give their minimum
// share (0: no limit): a joiner beyond it is not admitted.
func (w *Worker) batchFit() int {
	if w.minShare() == 0 {
		return 0
	}
	return w.cfg.GlobalBatch / w.minShare()
}

// rebalance decides the next shares from the boundary's table, the same
// on every member, and reports whether they changed. It waits until every
// worker has a model (a joiner's first iteration gives it one). A table
// no shares can satisfy keeps the shares and says why, on every member.
func (w *Worker) rebalance(recs []record) bool {
	vs := w.cur
	ws := make([]balance.Worker, len(recs))
	changed := false
	for r, rec := range recs {
		if !rec.model.Known() {
			return false
		}
		ws[r] = balance.Worker{Model: rec.model, Min: int(rec.minShare), Max: int(rec.maxShare)}
		changed = changed || rec.speedChanged
	}
	next, st, err := balance.Step(balance.Params{}, w.bst, ws, vs.shares, w.cfg.GlobalBatch, changed)
	if err != nil {
		w.log.Warn().Err(err).Ints("shares", vs.shares).Msg("shares kept")
		return false
	}
	w.bst = st
	if slices.Equal(next, vs.shares) {
		return false
	}
	if e := w.log.Debug(); e.Enabled() {
		models := make([]string, len(ws))
		for i, x := range ws {
			models[i] = x.Model.String()
		}
		e.Ints("from", vs.shares).Ints("to", next).Bool("speed_changed", changed).Strs("models", models).
			Float64("predicted_s", balance.Predict(ws, next)).Msg("shares rebalanced")
	}
	vs.shares = next
	return true
}
