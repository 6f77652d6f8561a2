package gyre

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/gyre-ml/gyre/balance"
	"github.com/gyre-ml/gyre/kernels"
	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/transport"
)

// balanceRecord feeds the iteration's compute time to this worker's
// estimator and puts its model and share bounds in rec. A failed
// iteration, or one with no samples, teaches nothing.
func (w *Worker) balanceRecord(rec *record) {
	rec.minShare = int64(w.minShare())
	if w.cfg.Balance != BalanceLBBSP {
		return
	}
	w.held = int(rec.share)
	rec.headroom, rec.maxShare = w.shareCap()
	if w.failed == nil && w.compute > 0 {
		rec.speedChanged = w.est.Add(balance.Obs{Samples: int(rec.share), Seconds: w.compute.Seconds()})
	}
	rec.model, _ = w.est.Fit()
}

// shareCap returns this worker's device headroom in bytes and the share
// it allows (b_max = headroom / BytesPerSample, at least the minimum
// share), both 0 without BytesPerSample or a device that reports its
// memory. The headroom is the free memory plus what the share of the
// worker's last iteration holds (w.held): a caching allocator keeps it
// between iterations.
func (w *Worker) shareCap() (headroom, maxShare int64) {
	bps := w.cfg.BytesPerSample
	if bps == 0 {
		return 0, 0
	}
	d, ok := w.device()
	if !ok || d.MemoryBytes == 0 {
		return 0, 0
	}
	headroom = int64(min(d.FreeBytes, math.MaxInt64/2)) + int64(w.held)*bps
	maxShare = max(headroom/bps, int64(max(w.minShare(), 1)))
	return headroom, maxShare
}

// localGPU returns a device probe for the GPU at localRank (modulo their
// number), reporting none on a host without GPUs.
func localGPU(localRank int) func() (kernels.Device, bool) {
	return func() (kernels.Device, bool) {
		gpus := kernels.GPUs()
		if len(gpus) == 0 {
			return kernels.Device{}, false
		}
		return gpus[localRank%len(gpus)], true
	}
}

// capShares lowers the shares of a new view's workers to their memory
// caps from the table of its settings vote, spreading the rest evenly
// over the others, the same on every member. Shares within every cap are
// kept; caps that cannot hold the global batch keep them too, with a
// warning.
func (w *Worker) capShares(recs []record) {
	vs := w.cur
	ws := make([]balance.Worker, len(recs))
	over := false
	for r, rec := range recs {
		ws[r] = balance.Worker{Model: balance.Model{RateMicro: 1e6}, Min: int(rec.minShare), Max: int(rec.maxShare)}
		over = over || rec.maxShare > 0 && int64(vs.shares[r]) > rec.maxShare
	}
	if !over {
		return
	}
	next, err := balance.Solve(ws, w.cfg.GlobalBatch)
	if err != nil {
		w.log.Warn().Err(err).Ints("shares", vs.shares).Msg("the workers' device memory cannot hold the global batch; shares kept")
		return
	}
	w.log.Info().Ints("from", vs.shares).Ints("to", next).Msg("shares capped at device memory")
	vs.shares = next
}

// keepFits keeps the models and share bounds of a boundary table that
// every member of vs judged.
func (w *Worker) keepFits(vs *viewState, recs []record) {
	if w.cfg.Balance != BalanceLBBSP {
		return
	}
	w.fits = make(map[transport.PeerID]balance.Worker, len(recs))
	for r, rec := range recs {
		w.fits[vs.ids[r]] = balance.Worker{Model: rec.model, Min: int(rec.minShare), Max: int(rec.maxShare)}
	}
}

// startShares returns the shares a view of members starts from: under
// LB-BSP those balance.Start gives from fits (a member with none counts
// as a joiner), else, or if no shares meet the bounds, equal shares.
// Every member that holds the same fits computes the same shares.
func (w *Worker) startShares(members []transport.PeerID, fits map[transport.PeerID]balance.Worker) []int {
	equal := EqualShares(w.cfg.GlobalBatch, len(members))
	if w.cfg.Balance != BalanceLBBSP {
		return equal
	}
	ws := make([]balance.Worker, len(members))
	for r, id := range members {
		f, ok := fits[id]
		if !ok {
			f = balance.Worker{Min: w.minShare()}
		}
		ws[r] = f
	}
	shares, err := balance.Start(ws, w.cfg.GlobalBatch)
	if err != nil {
		w.log.Warn().Err(err).Msg("the members' models give no shares for the new view; it starts from equal shares")
		return equal
	}
	return shares
}

// fitWords is how many int64 one member's fit takes in syncFits: the
// model's fixed time, rate and noise, flags (fitKept, fitFlat), Min and
// Max.
const fitWords = 6

const (
	fitKept = 1 << iota // the holder's table has the member
	fitFlat             // its model is flat-then-linear
)

// encodeFit writes f in the first fitWords of words.
func encodeFit(words []int64, f balance.Worker) {
	flags := int64(fitKept)
	if f.Model.Flat {
		flags |= fitFlat
	}
	copy(words, []int64{f.Model.FixedNs, f.Model.RateMicro, f.Model.NoisePpm, flags, int64(f.Min), int64(f.Max)})
}

// decodeFit reads what encodeFit wrote, false for words of no fit.
// A fit comes with its bounds, even without a model yet.
func decodeFit(words []int64) (balance.Worker, bool) {
	x := words[:fitWords]
	if x[3]&fitKept == 0 {
		return balance.Worker{}, false
	}
	return balance.Worker{Model: balance.Model{FixedNs: x[0], RateMicro: x[1], NoisePpm: x[2], Flat: x[3]&fitFlat != 0},
		Min: int(x[4]), Max: int(x[5])}, true
}

// syncFits brings every member of the current view the fits of root's
// last table, root being the holder of a recovery's winning commit, and
// sets the shares the view starts from by them: the members' own tables
// may differ, as a failed boundary ends differently on each.
func (w *Worker) syncFits(ctx context.Context, root int) error {
	vs := w.cur
	words := make([]int64, fitWords*len(vs.ids))
	if vs.rank == root {
		for r, id := range vs.ids {
			if f, ok := w.fits[id]; ok { // else not in the table: zeros
				encodeFit(words[fitWords*r:], f)
			}
		}
	}
	if err := ring.Broadcast(ctx, vs.data, root, words); err != nil {
		return fmt.Errorf("gyre: broadcast of the balance models from rank %d: %w", root, err)
	}
	fits := make(map[transport.PeerID]balance.Worker, len(vs.ids))
	for r, id := range vs.ids {
		if f, ok := decodeFit(words[fitWords*r:]); ok {
			fits[id] = f
		}
	}
	w.fits = fits
	vs.shares = w.startShares(vs.ids, fits)
	return nil
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
// on every member: nil if they stay, with the balance state that chose
// them. It waits until every worker has a model (a joiner's first
// iteration gives it one). A table no shares can satisfy keeps the shares
// and says why, on every member.
func (w *Worker) rebalance(vs *viewState, recs []record) ([]int, balance.State) {
	ws := make([]balance.Worker, len(recs))
	changed := false
	for r, rec := range recs {
		if !rec.model.Known() {
			return nil, w.bst
		}
		ws[r] = balance.Worker{Model: rec.model, Min: int(rec.minShare), Max: int(rec.maxShare)}
		changed = changed || rec.speedChanged
	}
	next, st, err := balance.Step(balance.Params{}, w.bst, ws, vs.shares, w.cfg.GlobalBatch, changed)
	if err != nil {
		w.log.Warn().Err(err).Ints("shares", vs.shares).Msg("shares kept")
		return nil, w.bst
	}
	if slices.Equal(next, vs.shares) {
		return nil, st
	}
	if e := w.log.Debug(); e.Enabled() {
		models := make([]string, len(ws))
		for i, x := range ws {
			models[i] = x.Model.String()
		}
		e.Ints("from", vs.shares).Ints("to", next).Bool("speed_changed", changed).Strs("models", models).
			Float64("predicted_s", balance.Predict(ws, next)).Msg("shares rebalanced")
	}
	return next, st
}
