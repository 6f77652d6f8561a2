package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gyre-ml/gyre/internal/config"
	"github.com/gyre-ml/gyre/internal/errs"
	"github.com/gyre-ml/gyre/internal/obs"
	"github.com/gyre-ml/gyre/internal/sampler"
	"github.com/gyre-ml/gyre/internal/view"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/kernels"
	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/transport"
)

// The data path: what the trainer calls within an iteration, and Commit,
// Restore, Abandon and Leave. Package gyre documents each.

// Batch is one worker's part of one iteration's global batch (gyre.Batch).
type Batch struct {
	Iter          int64
	Global, Share int
	Start         int64
	Indices       []int64
}

// View is a view as package gyre shows it (gyre.View).
type View struct {
	Epoch      uint64
	Members    []string
	RingOrder  []int
	CostModel  ring.CostModel
	SmallBytes int
	Stripes    int
}

// View returns the current view.
func (e *Engine) View() View {
	v := e.cur
	return View{Epoch: v.Epoch, Members: slices.Clone(v.Names), RingOrder: v.RingOrder(),
		CostModel: v.Data.CostModel(), SmallBytes: v.Data.SmallBytes(), Stripes: e.dataStripes()}
}

// dataStripes returns the data channel's stripes, 1 on a transport that
// cannot stripe.
func (e *Engine) dataStripes() int {
	if st, ok := e.links.T.(transport.Striper); ok {
		return st.Stripes(transport.ChanData)
	}
	return 1
}

// Size returns the number of workers in the current view.
func (e *Engine) Size() int { return len(e.cur.IDs) }

// Shares returns the per-rank batch shares of the current iteration.
func (e *Engine) Shares() []int { return slices.Clone(e.cur.Shares) }

// Batch returns this worker's part of the current iteration's batch, and
// starts the iteration's compute clock.
func (e *Engine) Batch() Batch {
	v := e.cur
	e.it.started = time.Now()
	start, count := sampler.Positions(e.it.iter, v.Shares, v.Rank)
	e.it.batch = e.sampler.Indices(e.it.batch[:0], start, count)
	return Batch{Iter: e.it.iter, Global: e.cfg.GlobalBatch, Share: v.Shares[v.Rank], Start: start, Indices: e.it.batch}
}

// pendingGrad is a gradient submitted in this iteration: its collective's
// handle, or why it was not submitted.
type pendingGrad struct {
	h   *ring.Handle
	err error
}

// AllReduceAsync weighs grad by this worker's share and hands it to the
// view's fuser: the handle, or why it was not submitted.
func (e *Engine) AllReduceAsync(ctx context.Context, name string, grad []float32) (*ring.Handle, error) {
	return submit(ctx, e, name, "float32", e.cur.F32, grad)
}

// AllReduceAsync64 is AllReduceAsync for float64 gradients.
func (e *Engine) AllReduceAsync64(ctx context.Context, name string, grad []float64) (*ring.Handle, error) {
	return submit(ctx, e, name, "float64", e.cur.F64, grad)
}

// submit weighs grad and hands it to the view's fuser for T.
func submit[T float32 | float64](ctx context.Context, e *Engine, name, gradType string, fuser *ring.Fuser[T], grad []T) (*ring.Handle, error) {
	if err := e.useGradType(gradType); err != nil {
		err = fmt.Errorf("gyre: allreduce %q: %w", name, err)
		e.it.pending = append(e.it.pending, pendingGrad{err: err})
		return nil, err
	}
	v := e.cur
	weigh(grad, v.Shares[v.Rank], e.cfg.GlobalBatch)
	h := fuser.AllReduceAsync(ctx, name, grad)
	e.it.pending = append(e.it.pending, pendingGrad{h: h})
	return h, nil
}

// weigh scales a local mean gradient by share/global. A share of 0 gives
// zeros rather than 0·grad, which would keep a NaN from a mean over no
// samples.
func weigh[T float32 | float64](grad []T, share, global int) {
	if share == 0 {
		clear(grad)
		return
	}
	kernels.Scale(grad, T(float64(share)/float64(global)))
}

func (e *Engine) useGradType(t string) error {
	switch {
	case e.closed.Load():
		return errs.Closed
	case e.it.gradType == "":
		e.it.gradType = t
	case e.it.gradType != t:
		return fmt.Errorf("%w: %s gradients after %s ones: a worker uses one gradient type", config.ErrConfig, t, e.it.gradType)
	}
	return nil
}

// Wait flushes the open gradient bucket and waits for every gradient
// submitted in this iteration (gyre.Worker.Wait).
func (e *Engine) Wait(ctx context.Context) error {
	if !e.it.started.IsZero() {
		e.it.compute = time.Since(e.it.started)
	}
	e.flush()
	start := time.Now()
	var first error
	for _, p := range e.it.pending {
		err := p.err
		if p.h != nil {
			err = p.h.Wait(ctx)
		}
		if err != nil && first == nil {
			first = err
		}
	}
	e.span("wait", start)
	if first != nil && ctx.Err() != nil && errors.Is(first, ctx.Err()) {
		return first // only the wait ended; the buckets are still pending
	}
	e.it.pending = e.it.pending[:0]
	if first != nil && e.it.failed == nil {
		e.it.failed = first
	}
	if lost := e.peerLost(e.cur, first); lost != nil {
		return lost
	}
	return first
}

// flush sends the open buckets under the worker's lifetime context.
func (e *Engine) flush() {
	v := e.cur
	v.F32.Flush(e.life)
	v.F64.Flush(e.life)
}

// AllGather64 gives every worker every worker's row, in rank order.
func (e *Engine) AllGather64(ctx context.Context, row []float64) ([][]float64, error) {
	if err := e.idle(); err != nil {
		return nil, err
	}
	v := e.cur
	n, k := len(v.IDs), len(row)
	table := make([]float64, n*k)
	copy(table[v.Rank*k:], row)
	if err := ring.AllGather(ctx, v.Data, table); err != nil {
		return nil, e.collectiveErr(v, "allgather", err)
	}
	rows := make([][]float64, n)
	for r := range rows {
		rows[r] = table[r*k : (r+1)*k : (r+1)*k]
	}
	return rows, nil
}

// Reduce combines a few float64 values across the view with op, in place.
func (e *Engine) Reduce(ctx context.Context, op wire.Op, vals []float64) error {
	if err := e.idle(); err != nil {
		return err
	}
	v := e.cur
	if err := ring.AllReduce(ctx, v.Data, op, vals); err != nil {
		return e.collectiveErr(v, "reduce", err)
	}
	return nil
}

// collectiveErr records a failed collective outside the gradient path for
// the boundary's record, as Wait does a gradient's, and names the lost
// worker, or says which collective failed.
func (e *Engine) collectiveErr(v *view.View, what string, err error) error {
	if e.it.failed == nil {
		e.it.failed = err // the boundary's record reports it, as a gradient's failure
	}
	if lost := e.peerLost(v, err); lost != nil {
		return lost
	}
	return fmt.Errorf("gyre: %s: %w", what, err)
}

// peerLost returns the lost-peer error naming the member blamed for err,
// or nil if err is not a lost peer's.
func (e *Engine) peerLost(v *view.View, err error) error {
	if err == nil || !errors.Is(err, transport.ErrPeerGone) {
		return nil
	}
	if r, p, ok := e.blame(v, err); ok {
		return e.peerLostError(e.it.iter, r, p, err)
	}
	return nil
}

// blame names the member lost when err ended a collective of v
// (View.Blame). A worker that itself stalled past PeerTimeout is the one
// its peers lost: what they did meanwhile, closing their links on purpose
// included, is no evidence against them, and it names the peer err names,
// or else one whose heartbeats broke, for its error to say so beside its
// own stall (peerLostError).
func (e *Engine) blame(v *view.View, err error) (int, transport.PeerID, bool) {
	if r, p, ok := v.Blame(e.live, e.cfg.PeerTimeout, err); ok {
		return r, p, true
	}
	if e.selfStall().Unresponsive == 0 {
		return -1, "", false
	}
	if p, ok := transport.PeerOf(err); ok {
		if r := v.RankOf(p); r >= 0 && r != v.Rank {
			return r, p, true
		}
	}
	for r, p := range v.IDs { // a send finds a link gone, not its peer: a peer whose link broke
		if _, broke := e.live.Broken(p); broke && r != v.Rank {
			return r, p, true
		}
	}
	return -1, "", false
}

// peerLostError builds the error for rank r, saying so if this worker
// itself stalled: then the peers lost it, not it them.
func (e *Engine) peerLostError(iter int64, r int, p transport.PeerID, err error) error {
	return e.opts.Errors.PeerLost(PeerLost{Iter: iter, Rank: r, Peer: p, Err: err, SelfStall: e.selfStall()})
}

// selfStall is this worker's own stall since the previous boundary
// ended, if it was longer than PeerTimeout, or zero.
func (e *Engine) selfStall() SelfStall {
	d := e.live.StalledSince(e.it.lastVote)
	if d <= e.cfg.PeerTimeout {
		return SelfStall{}
	}
	return SelfStall{Unresponsive: d, SelfRank: e.cur.Rank, Self: transport.PeerID(e.cfg.Name), PeerTimeout: e.cfg.PeerTimeout}
}

// Comm returns the current view's data communicator.
func (e *Engine) Comm() (*ring.Comm, error) {
	if err := e.idle(); err != nil {
		return nil, err
	}
	return e.cur.Data, nil
}

// Commit records the registered state and the sampler position.
func (e *Engine) Commit() error {
	if err := e.idle(); err != nil {
		return err
	}
	if err := e.state.Commit(e.it.iter); err != nil {
		return err
	}
	if e.rec != nil {
		e.rec.Committed(e.cur.Epoch, e.it.iter)
	}
	if e.ckpt.taker != nil {
		return e.ckpt.taker.Committed(e.it.iter, e.checkpointJob)
	}
	return nil
}

// Restore copies the committed state back and moves the sampler back to
// the committed iteration.
func (e *Engine) Restore() error {
	if err := e.idle(); err != nil {
		return err
	}
	return e.rollBack()
}

// rollBack restores the committed state and moves the iteration back to
// it, forgetting the failure and timing of the iteration under way.
func (e *Engine) rollBack() error {
	iter, err := e.state.Restore()
	if err != nil {
		return err
	}
	e.setIter(iter)
	e.it.failed = nil
	e.it.started, e.it.compute = time.Time{}, 0
	return nil
}

// Abandon gives up the current iteration (gyre.Worker.Abandon).
func (e *Engine) Abandon(ctx context.Context) error {
	err := e.Wait(ctx)
	if err != nil && len(e.it.pending) > 0 {
		return err // ctx ended while gradients were still in flight
	}
	failed := e.it.failed
	if failed != nil && e.rec == nil {
		return fmt.Errorf("gyre: abandon iteration %d: %w", e.it.iter, failed)
	}
	if err := e.Restore(); err != nil {
		return err
	}
	e.it.failed = failed // the next boundary's record says so
	return nil
}

// Leave ends the job on every worker at one final barrier
// (gyre.Worker.Leave).
func (e *Engine) Leave(ctx context.Context) error {
	if e.members.left {
		return nil
	}
	e.it.ctrlStep.Store(int32(stepLeave))
	if err := e.idle(); err != nil {
		return err
	}
	ckptErr := e.ckpt.taker.Finish(ctx, e.it.iter, e.checkpointJob)
	err := e.cur.Ctrl.Barrier(ctx)
	if err == nil {
		fctx, cancel := context.WithTimeout(ctx, e.cfg.CollectiveTimeout)
		err = e.live.Farewell(fctx, e.cfg.PeerTimeout)
		cancel()
		if err != nil {
			err = fmt.Errorf("gyre: leave: waiting for the peers' farewells: %w", err)
		}
	}
	e.gossip.Leave()
	return errors.Join(ckptErr, err, e.Close())
}

// SpanObserver returns the observer of spans (the timeline), nil if none.
func (e *Engine) SpanObserver() obs.SpanObserver {
	so, _ := e.rep.Observer.(obs.SpanObserver)
	return so
}
