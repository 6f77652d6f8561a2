package gyre

import (
	"context"
	"fmt"

	"github.com/gyre-ml/gyre/internal/config"
	"github.com/gyre-ml/gyre/internal/engine"
	"github.com/gyre-ml/gyre/internal/testhook"
	"github.com/gyre-ml/gyre/internal/view"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/kernels"
	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/transport"
)

// Handle is the pending result of AllReduceAsync.
type Handle struct {
	h   *ring.Handle
	err error // set instead of h when the submission itself failed
}

// Wait blocks until the tensor holds the global mean gradient, or its
// collective failed, and returns that collective's error. If ctx ends
// first it returns ctx.Err(); only the wait ends. It is safe for concurrent
// use and may be called more than once.
func (h *Handle) Wait(ctx context.Context) error {
	if h.h == nil {
		return h.err
	}
	return h.h.Wait(ctx)
}

// View is a membership view: an epoch and the members in rank order
// (sorted by data address).
type View struct {
	Epoch   uint64
	Members []string
	// RingOrder lists the ranks in the order the data ring passes through
	// them, from RingOrder[i] to RingOrder[i+1] and from the last back to
	// the first: rank order unless Config.RingOrder "auto" found links
	// that another order crosses less often.
	RingOrder []int
	// CostModel is the data ring's cost model: the latency, bandwidth and
	// kernel rates the view's link probes measured under Config.Algo or
	// Compress "auto" (ring.DefaultCostModel's figures where they
	// measured nothing, or when neither is auto).
	CostModel ring.CostModel
	// SmallBytes is the allreduce size from which the ring runs:
	// recursive doubling runs below it (0: the ring throughout).
	SmallBytes int
	// Stripes is the connections per peer link that the data channel's
	// large messages are split over: Config.Stripes, or what the link
	// probes chose under StripesAuto; 1 on a transport that cannot
	// stripe. Shared-memory links use 1 whatever it says.
	Stripes int
}

// Change is what a Boundary decided for the next iteration.
type Change struct {
	// Iter is the iteration to run next.
	Iter int64
	// View is the view it runs in; ViewChanged says it differs from the
	// last one.
	View        View
	ViewChanged bool
	// Shares are the per-rank batch shares it runs with; SharesChanged
	// says they differ from the last ones.
	Shares        []int
	SharesChanged bool
	// Redo says the job recovered from a lost worker: the view changed,
	// the state was replaced by the newest commit any member of the new
	// view held, and Iter (which may differ from the iteration just run)
	// is that commit's. What was not committed is redone. Only gossip
	// views recover; a static view fails with a *PeerLostError.
	Redo bool
	// Admitted and Departed name the workers that joined the view, and
	// those that left it at their request, at this boundary; Lost names,
	// on a Redo, the members of the view this worker ran before that the
	// new view lacks (killed, stopped or cut off), except the joiners that
	// view had just admitted: Pending names those. They held none of the
	// job's state, and a recovery leaves them out whether or not they
	// are alive; a live one is pending again and is admitted at a later
	// boundary.
	Admitted, Departed, Lost []string
	Pending                  []string
	// Left says this worker left the job at this boundary, as it asked
	// with RequestLeave: the Worker is closed, and the trainer stops
	// without calling Leave.
	Left bool
}

// Batch is one worker's part of one iteration's global batch.
type Batch struct {
	// Iter is the iteration.
	Iter int64
	// Global is the global batch size B; Share is this worker's bᵢ.
	Global, Share int
	// Start is the stream position of this worker's first sample.
	Start int64
	// Indices are the sample indices, Share of them. The slice is reused
	// by the next call to Batch.
	Indices []int64
}

// Option configures Join.
type Option func(*options)

type options struct {
	engine.Options
	hooks Hooks
}

// WithState registers the trainer's state: Join makes every worker's
// values equal to rank 0's, and Commit and Restore act on it. Without it
// the Worker has no state to restore.
func WithState(s *State) Option { return func(o *options) { o.State = s.set } }

// WithTransport makes the Worker use t instead of building the transport
// Config asks for. Config.Peers then holds the members' transport IDs,
// which are also the addresses passed to Connect (the in-memory transport
// in tests). The Worker does not close t.
func WithTransport(t transport.Transport) Option { return func(o *options) { o.T = t } }

// WithHooks sets the trainer-side span hooks.
func WithHooks(h Hooks) Option { return func(o *options) { o.hooks = h } }

// WithDevice sets how the worker learns the compute device it trains on.
// probe returns false when there is none: the worker is then a CPU
// worker. Join calls it once: a worker with a device fits the device's
// flat-then-linear time model (balance.Model's Flat). With
// Config.BytesPerSample set, balancing also calls it at every boundary:
// the device's FreeBytes, plus the memory the worker's last share holds
// (BytesPerSample per sample, which caching allocators keep), is its
// headroom, and the share is capped at headroom / BytesPerSample. The
// default is the GPU at Config.LocalRank through NVML (kernels.GPUs), as
// torchrun's LOCAL_RANK picks a GPU. A trainer that accounts for its
// device memory itself can report its own figure.
func WithDevice(probe func() (kernels.Device, bool)) Option {
	return func(o *options) { o.Device = probe }
}

// Worker is one member of a data-parallel training job. Join returns it
// connected to its peers with its state equal to rank 0's; the trainer then
// loops over iterations (see the package documentation).
//
// Batch, AllReduceAsync, Wait, Boundary, Commit, Restore, Abandon and
// Leave are meant for the trainer's goroutine, in that order within an
// iteration; they are not safe for concurrent use. Handle.Wait and Close
// are safe from any goroutine.
type Worker struct {
	e     *engine.Engine
	hooks Hooks
}

// Join starts a worker: it builds the data-plane transport (unless
// WithTransport gives one) and enters the job's view: the static view of
// cfg.Peers, or with gossip (cfg.Seeds or cfg.Listen) the live view, which
// a worker with no seeds starts and a worker with seeds is admitted into
// at a boundary. It then checks that every worker registered the same
// state and batch settings, broadcasts the state from a member that holds
// it (rank 0 at the start), confirms that every worker now holds the same
// state, and commits it. It blocks until then, ctx ends, or
// Config.JoinTimeout passes. A failure found by the comparisons
// (ErrDiverged) is returned by every worker.
func Join(ctx context.Context, cfg Config, opts ...Option) (*Worker, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.State != nil {
		if err := o.State.Err(); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrConfig, err)
		}
	}
	testhook.Apply(ctx, &o.Test)
	o.Errors = engine.Errors{PeerLost: newPeerLostError, IterationFailed: newIterationError}
	e, err := engine.Join(ctx, config.Config(cfg), o.Options)
	if err != nil {
		return nil, err
	}
	return &Worker{e: e, hooks: o.hooks}, nil
}

// Rank returns this worker's rank in the current view.
func (w *Worker) Rank() int { return w.e.Rank() }

// Size returns the number of workers in the current view.
func (w *Worker) Size() int { return w.e.Size() }

// Iter returns the current iteration.
func (w *Worker) Iter() int64 { return w.e.Iter() }

// View returns the current view.
func (w *Worker) View() View { return viewOf(w.e.View()) }

func viewOf(v engine.View) View {
	return View{Epoch: v.Epoch, Members: v.Members, RingOrder: v.RingOrder, CostModel: v.CostModel, SmallBytes: v.SmallBytes, Stripes: v.Stripes}
}

// Shares returns the per-rank batch shares of the current iteration.
func (w *Worker) Shares() []int { return w.e.Shares() }

// Batch returns this worker's part of the current iteration's batch, and
// starts the iteration's compute clock.
func (w *Worker) Batch() Batch {
	b := w.e.Batch()
	return Batch{Iter: b.Iter, Global: b.Global, Share: b.Share, Start: b.Start, Indices: b.Indices}
}

// AllReduceAsync submits grad, this worker's mean gradient over its own
// samples for the tensor called name, and returns a handle. When the
// handle's Wait returns nil, grad holds the global sample-weighted mean
// Σ bᵢ/B · gradᵢ, identical on every worker: the weight bᵢ/B is applied
// here, so trainers never scale by hand (a worker whose share is 0
// contributes zeros, whatever grad holds). Tensors are fused into buckets
// by submission order and size, as DDP does, so every worker must submit
// the same tensors in the same order. A worker uses one gradient type:
// float32 here or float64 (AllReduceAsync64), not both. Config.Compress
// sends float32 gradients as bf16 or fp16, summed in float32. ctx bounds
// the collective of the bucket this call fills, if any; cancelling it
// fails that collective on every worker.
func (w *Worker) AllReduceAsync(ctx context.Context, name string, grad []float32) *Handle {
	h, err := w.e.AllReduceAsync(ctx, name, grad)
	return &Handle{h: h, err: err}
}

// AllReduceAsync64 is AllReduceAsync for float64 gradients. Config.Compress
// does not apply to them.
func (w *Worker) AllReduceAsync64(ctx context.Context, name string, grad []float64) *Handle {
	h, err := w.e.AllReduceAsync64(ctx, name, grad)
	return &Handle{h: h, err: err}
}

// Wait flushes the open gradient bucket and waits for every gradient
// submitted in this iteration. It returns the first failure; a worker lost
// (dead, frozen or cut off) is reported as a *PeerLostError naming its
// rank. The time from Batch to Wait counts as the iteration's compute
// time.
//
// If ctx ends first, Wait returns ctx's error and only the wait ends: the
// collectives go on under the worker's own lifetime, so the peers are not
// aborted, and a later Wait, Abandon or Boundary picks them up.
func (w *Worker) Wait(ctx context.Context) error { return w.e.Wait(ctx) }

// AllGather64 gives every worker every worker's row, in rank order: an
// unweighted collective for metrics and reports (losses, timings), unlike
// AllReduceAsync, which weighs gradients by share. Every worker passes a
// row of the same length; it needs no gradients pending, as Boundary.
func (w *Worker) AllGather64(ctx context.Context, row []float64) ([][]float64, error) {
	return w.e.AllGather64(ctx, row)
}

// ReduceOp combines the values of Reduce.
type ReduceOp uint8

// Reduce's operations.
const (
	ReduceSum ReduceOp = iota + 1
	// ReduceMean is the plain mean over workers, each counting alike;
	// for a mean over samples, reduce value·Batch().Count with ReduceSum
	// and divide by the global batch.
	ReduceMean
	ReduceMax
	ReduceMin
)

var reduceOps = map[ReduceOp]wire.Op{ReduceSum: wire.OpSum, ReduceMean: wire.OpAvg, ReduceMax: wire.OpMax, ReduceMin: wire.OpMin}

// Reduce combines a few float64 values across the view, in place, so
// that every worker ends with the same result: a global loss or
// accuracy, a count, the slowest worker's time. Unlike AllReduceAsync it
// does not weigh by share. Every worker passes the same number of values
// and the same op, with no gradients pending. A lost worker fails it with
// a *PeerLostError.
func (w *Worker) Reduce(ctx context.Context, op ReduceOp, vals []float64) error {
	wop, ok := reduceOps[op]
	if !ok {
		return fmt.Errorf("gyre: Reduce: unknown op %d", op)
	}
	return w.e.Reduce(ctx, wop, vals)
}

// Comm returns the current view's communicator, for unweighted
// collectives outside the gradient path: benchmarks (gyre bench
// allreduce), metrics, reports. Unlike AllReduceAsync, which weighs each
// worker's gradient by its share, ring.AllReduce on it counts every
// worker alike. Like Boundary it needs no gradients pending, and every
// worker must run the same collectives on it in the same order. A
// Boundary that changes the view (Change.ViewChanged) closes it: take it
// afresh after each boundary.
func (w *Worker) Comm() (*ring.Comm, error) { return w.e.Comm() }

// Boundary ends the current iteration with a vote that every worker joins,
// including one whose collectives failed. Each contributes a record
// (iteration, share, compute time, whether its collectives completed, a
// digest of the view and shares it will use next, and at the iterations
// where the state is checked, a digest of the state about to be
// committed) to one allgather on the control channel, apart from the
// gradients. All judge the same table:
//   - every worker completed and agrees: Boundary advances to the next
//     iteration and returns what changed for it;
//   - some worker's collective failed with every member there: every
//     worker returns an *IterationError naming the failed ranks
//     (ErrIterationFailed), and the iteration stays where it was. In a
//     gossip job, a first mismatch (sizes that differ across workers) at
//     an iteration is redone instead: every worker returns Redo, from
//     the last commit, in a view of the same members at the next epoch;
//     the same mismatch again at that iteration is the error. A rank
//     late past CollectiveTimeout is left out as if lost (below), and
//     rejoins as a new member when it gets there;
//   - workers disagree about the iteration, shares, decision or state:
//     every worker returns ErrDiverged naming the ranks;
//   - a member was lost (it died, froze past PeerTimeout, or was cut
//     off): in a gossip job the others recover without it
//     (docs/recovery.md) and return a Change with Redo set, the new view,
//     and Iter, the iteration to run next, with the winning commit's state
//     restored; a member left out of the new view rejoins as a new member
//     and returns the same. Without a majority of the view, Boundary
//     returns ErrNoQuorum after Config.QuorumTimeout. In a static view
//     every survivor returns a *PeerLostError naming the lost rank
//     (ErrPeerLost).
//
// Survivors may see different outcomes from the Boundary in which a
// member was lost (some advanced, some recovered); the recovery that
// follows brings them to one view, iteration and state before any
// commits again. Call Commit after every Boundary that returns no error.
//
// If ctx ends first (the trainer's own cancellation or deadline), this
// worker leaves the job: Boundary returns ctx's error and, in a gossip
// job, closes the worker, so that the others see it go at once and
// recover without it instead of waiting for its record.
//
// The state is hashed at every boundary while hashing costs at most 1% of
// the iteration's compute time; for larger models it is checked every K
// iterations, K chosen from the table so that it stays within that budget.
func (w *Worker) Boundary(ctx context.Context) (Change, error) {
	c, err := w.e.Boundary(ctx)
	return Change{Iter: c.Iter, View: viewOf(c.View), ViewChanged: c.ViewChanged, Shares: c.Shares, SharesChanged: c.SharesChanged,
		Redo: c.Redo, Admitted: c.Admitted, Departed: c.Departed, Lost: c.Lost, Pending: c.Pending, Left: c.Left}, err
}

// RequestLeave asks for this worker to leave the job at the next boundary:
// the request rides in its boundary record, every member removes it from
// the next view, and that Boundary returns a Change with Left set, with no
// iteration redone. It is safe from any goroutine (a SIGTERM handler).
func (w *Worker) RequestLeave() { w.e.RequestLeave() }

// ReportLoss tells the runtime the trainer's latest loss, for the job's
// status: gossip carries it, with this worker's share and samples/s, to
// gyre status, refreshed every few seconds at a boundary. Reporting is
// optional and costs no communication of its own; gyre train reports its
// global mean loss. It is safe from any goroutine.
func (w *Worker) ReportLoss(loss float64) { w.e.ReportLoss(loss) }

// Commit records the registered state and the sampler position (the next
// iteration) as the point Restore returns to. Call it after Boundary.
func (w *Worker) Commit() error { return w.e.Commit() }

// Restore copies the committed state back into the registered tensors and
// metadata, and moves the sampler back to the committed iteration.
func (w *Worker) Restore() error { return w.e.Restore() }

// Abandon gives up the current iteration after an error in the trainer's
// own code, or after a Wait that gave up early: it flushes and waits for
// the gradients already submitted, discarding their results, then restores
// the last commit. Every worker must abandon the same iteration after
// submitting the same gradients, so their collectives stay in step; a
// worker that fails alone is a lost worker, which the recovery layer
// handles.
//
// After a failed collective, in a gossip job, Abandon restores the commit
// all the same and returns nil: the view stays failed, so the collectives
// of the iteration run again fail at once, and the next Boundary recovers
// as it would have. In a static view it returns the failure.
func (w *Worker) Abandon(ctx context.Context) error { return w.e.Abandon(ctx) }

// Leave ends the job: every worker of the view calls it after the loop,
// and it waits at a barrier for all of them, then says farewell and waits
// (up to CollectiveTimeout) until every peer has said farewell too or is
// gone, so that closing cuts off no message a peer still needs, then
// leaves gossip (the others list it as left) and closes the worker. To
// leave a job that goes on, use RequestLeave; after the Boundary that
// returned Change.Left, Leave returns nil. With Config.CheckpointDir it
// first writes a checkpoint that fell due while the disk was busy, and
// waits for the writes under way.
func (w *Worker) Leave(ctx context.Context) error { return w.e.Leave(ctx) }

// Close stops the worker at once: pending gradients fail with ErrClosed,
// and the transport is closed unless it was given with WithTransport.
// Peers still in a collective with this worker fail it. Close is
// idempotent and safe from any goroutine, also while the trainer's
// goroutine submits gradients.
func (w *Worker) Close() error { return w.e.Close() }

// Resumed says which checkpoint a job resumed from.
type Resumed struct {
	// File is the checkpoint's file name, in the directory of the worker
	// that held it: Rank, ID in the view that resumed.
	File string
	Rank int
	ID   string
	// Epoch and Iter are the checkpoint's job epoch and iteration: the
	// job went on from iteration Iter.
	Epoch uint64
	Iter  int64
}

// Resumed returns the checkpoint the job resumed from at Join, and false
// if it started afresh or this worker was admitted into a running job.
func (w *Worker) Resumed() (Resumed, bool) {
	r, ok := w.e.Resumed()
	return Resumed{File: r.File, Rank: r.Rank, ID: r.ID, Epoch: r.Epoch, Iter: r.Iter}, ok
}

// ConnectAll connects t to every member but members[rank], retrying while
// they start, until ctx ends. A member that refuses this worker's
// credentials fails it at once, and so does one whose own connection this
// transport refused (transport.RefusalReporter), even if it has gone since:
// the cluster secrets differ, and waiting would not help. In the static
// view a member's address is its ID.
func ConnectAll(ctx context.Context, t transport.Transport, members []transport.PeerID, rank int) error {
	addrs := make([]string, len(members))
	for i, m := range members {
		addrs[i] = string(m)
	}
	return view.ConnectMembers(ctx, t, members, addrs, rank)
}

// NewTransport validates cfg and builds the data-plane transport it asks
// for, listening on cfg.DataAddr. It loads the cluster secret, derives the
// cluster CA and mints this worker's leaf certificate for cfg.Name. The
// result also implements transport.Listener (its bound address) and
// transport.Dropper.
func NewTransport(cfg Config) (transport.Transport, error) {
	return view.NewTransport(config.Config(cfg))
}
