// Package shares is LB-BSP's side in a worker: it feeds the worker's
// compute times to its estimator and puts the model in the boundary
// record, caps a share at the device's memory, keeps the members' fitted
// models that a new view's shares start from, and brings them to every
// member after a recovery. The decisions themselves are package
// balance's, and the boundary's plan is package vote's.
package shares

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/balance"
	"github.com/gyre-ml/gyre/internal/sampler"
	"github.com/gyre-ml/gyre/internal/view"
	"github.com/gyre-ml/gyre/internal/vote"
	"github.com/gyre-ml/gyre/kernels"
	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/transport"
)

// Config is what balancing needs of the worker's configuration.
type Config struct {
	// LBBSP says shares follow the measured models; without it they are
	// equal, or fixed.
	LBBSP bool
	// Global is the global batch; AllowZero lets a worker's share be 0.
	Global    int
	AllowZero bool
	// BytesPerSample, if not 0, caps the share at the device's headroom
	// over it.
	BytesPerSample int64
	// Device reports the worker's compute device: false for none.
	Device func() (kernels.Device, bool)
	Log    zerolog.Logger
}

// Balancer is one worker's side of balancing. It is used from the
// worker's goroutine only.
type Balancer struct {
	cfg Config
	// est fits this worker's compute model from its own iterations;
	// state is the share decision's, the same on every member.
	est   balance.Estimator
	state balance.State
	// fits are the models and share bounds of the members in the last
	// boundary table every member judged: a new view's shares start from
	// them.
	fits map[transport.PeerID]balance.Worker
	// held is the share of the last iteration this worker computed, whose
	// memory its allocator may still hold (0 before its first).
	held int
}

// New returns a worker's Balancer. A worker on a device (a GPU) fits the
// device's flat-then-linear time model.
func New(cfg Config) *Balancer {
	b := &Balancer{cfg: cfg}
	_, b.est.Flat = cfg.Device()
	return b
}

// LocalGPU returns a device probe for the GPU at localRank (modulo their
// number), reporting none on a host without GPUs.
func LocalGPU(localRank int) func() (kernels.Device, bool) {
	return func() (kernels.Device, bool) {
		gpus := kernels.GPUs()
		if len(gpus) == 0 {
			return kernels.Device{}, false
		}
		return gpus[localRank%len(gpus)], true
	}
}

// MinShare is the smallest share a worker may get: 1, or 0 with
// AllowZero.
func (b *Balancer) MinShare() int {
	if b.cfg.AllowZero {
		return 0
	}
	return 1
}

// BatchFit is the most workers the global batch can give their minimum
// share (0: no limit): a joiner beyond it is not admitted.
func (b *Balancer) BatchFit() int {
	if b.MinShare() == 0 {
		return 0
	}
	return b.cfg.Global / b.MinShare()
}

// Record feeds the iteration's compute time to the estimator and puts
// the model and the share bounds in rec, whose Share is the share the
// iteration ran with. A failed iteration, or one with no samples,
// teaches nothing.
func (b *Balancer) Record(rec *vote.Record, failed bool, compute time.Duration) {
	rec.MinShare = int64(b.MinShare())
	if !b.cfg.LBBSP {
		return
	}
	b.held = int(rec.Share)
	rec.Headroom, rec.MaxShare = b.Cap()
	if !failed && compute > 0 {
		rec.SpeedChanged = b.est.Add(balance.Obs{Samples: int(rec.Share), Seconds: compute.Seconds()})
	}
	rec.Model, _ = b.est.Fit()
}

// Cap returns this worker's device headroom in bytes and the share it
// allows (b_max = headroom / BytesPerSample, at least the minimum share),
// both 0 without BytesPerSample or a device that reports its memory. The
// headroom is the free memory plus what the share of the worker's last
// iteration holds: a caching allocator keeps it between iterations.
func (b *Balancer) Cap() (headroom, maxShare int64) {
	bps := b.cfg.BytesPerSample
	if bps == 0 {
		return 0, 0
	}
	d, ok := b.cfg.Device()
	if !ok || d.MemoryBytes == 0 {
		return 0, 0
	}
	headroom = int64(min(d.FreeBytes, math.MaxInt64/2)) + int64(b.held)*bps
	maxShare = max(headroom/bps, int64(max(b.MinShare(), 1)))
	return headroom, maxShare
}

// CapShares lowers a new view's shares to the workers' memory caps from
// the table of its settings vote, spreading the rest evenly over the
// others, the same on every member. Shares within every cap are kept;
// caps that cannot hold the global batch keep them too, with a warning.
func (b *Balancer) CapShares(recs []vote.Record, shares []int) []int {
	ws := make([]balance.Worker, len(recs))
	over := false
	for r, rec := range recs {
		ws[r] = balance.Worker{Model: balance.Model{RateMicro: 1e6}, Min: int(rec.MinShare), Max: int(rec.MaxShare)}
		over = over || rec.MaxShare > 0 && int64(shares[r]) > rec.MaxShare
	}
	if !over {
		return shares
	}
	next, err := balance.Solve(ws, b.cfg.Global)
	if err != nil {
		b.cfg.Log.Warn().Err(err).Ints("shares", shares).Msg("the workers' device memory cannot hold the global batch; shares kept")
		return shares
	}
	b.cfg.Log.Info().Ints("from", shares).Ints("to", next).Msg("shares capped at device memory")
	return next
}

// Keep keeps the models and share bounds of a boundary table that every
// member of the view of ids judged.
func (b *Balancer) Keep(ids []transport.PeerID, recs []vote.Record) {
	if !b.cfg.LBBSP {
		return
	}
	b.fits = make(map[transport.PeerID]balance.Worker, len(recs))
	for r, w := range vote.Workers(recs) {
		b.fits[ids[r]] = w
	}
}

// Fits returns the members' fits the balancer keeps.
func (b *Balancer) Fits() map[transport.PeerID]balance.Worker { return b.fits }

// SetFits replaces the fits kept (a checkpoint's).
func (b *Balancer) SetFits(fits map[transport.PeerID]balance.Worker) { b.fits = fits }

// State is the share decision's state; SetState sets it as a boundary's
// plan decided, and Reset starts it afresh, as for a new view.
func (b *Balancer) State() balance.State      { return b.state }
func (b *Balancer) SetState(st balance.State) { b.state = st }
func (b *Balancer) Reset()                    { b.state = balance.State{} }

// StartShares returns the shares a view of members starts from: under
// LB-BSP those balance.Start gives from the kept fits (a member with none
// counts as a joiner), else, or if no shares meet the bounds, equal
// shares. Every member that holds the same fits computes the same shares.
func (b *Balancer) StartShares(members []transport.PeerID) []int {
	equal := sampler.EqualShares(b.cfg.Global, len(members))
	if !b.cfg.LBBSP {
		return equal
	}
	ws := make([]balance.Worker, len(members))
	for r, id := range members {
		f, ok := b.fits[id]
		if !ok {
			f = balance.Worker{Min: b.MinShare()}
		}
		ws[r] = f
	}
	shares, err := balance.Start(ws, b.cfg.Global)
	if err != nil {
		b.cfg.Log.Warn().Err(err).Msg("the members' models give no shares for the new view; it starts from equal shares")
		return equal
	}
	return shares
}

// fitWords is how many int64 one member's fit takes in Sync: the model's
// fixed time, rate and noise, flags (fitKept, fitFlat), Min and Max.
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

// Sync brings every member of v the fits of root's last table, root being
// the holder of a recovery's winning commit or of the checkpoint a job
// resumes from, and sets the shares v starts from by them: the members'
// own tables may differ, as a failed boundary ends differently on each.
func (b *Balancer) Sync(ctx context.Context, v *view.View, root int) error {
	words := make([]int64, fitWords*len(v.IDs))
	if v.Rank == root {
		for r, id := range v.IDs {
			if f, ok := b.fits[id]; ok { // else not in the table: zeros
				encodeFit(words[fitWords*r:], f)
			}
		}
	}
	if err := ring.Broadcast(ctx, v.Data, root, words); err != nil {
		return fmt.Errorf("gyre: broadcast of the balance models from rank %d: %w", root, err)
	}
	fits := make(map[transport.PeerID]balance.Worker, len(v.IDs))
	for r, id := range v.IDs {
		if f, ok := decodeFit(words[fitWords*r:]); ok {
			fits[id] = f
		}
	}
	b.fits = fits
	v.Shares = b.StartShares(v.IDs)
	return nil
}
