package gyre

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/balance"
	"github.com/gyre-ml/gyre/internal/obs"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/kernels"
	"github.com/gyre-ml/gyre/liveness"
	"github.com/gyre-ml/gyre/membership"
	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/mem"
)

// Errors returned by Worker.
var (
	// ErrDiverged means workers disagree about something that must be the
	// same everywhere: the registered state, the batch settings, the
	// iteration or a boundary decision. Every worker gets it together,
	// since all of them compare the same gathered table.
	ErrDiverged = errors.New("gyre: workers diverged")
	// ErrPending means Boundary, Commit, Restore, AllGather64 or Leave was
	// called while gradients submitted with AllReduceAsync were still
	// unfinished.
	ErrPending = errors.New("gyre: gradients pending: call Wait first")
	// ErrClosed is returned by a Worker after Close or Leave.
	ErrClosed = errors.New("gyre: worker closed")
	// ErrNoQuorum means a worker lost touch with a majority of its view
	// and waited QuorumTimeout for it in vain: the job goes on without it
	// if a majority survives elsewhere, and this worker must exit (gyre
	// train exits with status ExitNoQuorum).
	ErrNoQuorum = errors.New("gyre: no quorum")
)

// ExitNoQuorum is the exit status of a gyre command whose worker failed
// with ErrNoQuorum. gyre launch stops a job when a worker exits with it:
// the job has lost its majority.
const ExitNoQuorum = 75

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
	// new view lacks (killed, stopped or cut off).
	Admitted, Departed, Lost []string
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
	failAction   func()        // a test's way to die at a failpoint
	timelineSkew time.Duration // a test's clock skew, added to the timeline's timestamps
	// A test's shorter periods, per worker so that such tests can run in
	// parallel: zero means defaultReprobeEvery and defaultHandshakeNote.
	reprobeEvery  int64
	handshakeNote time.Duration
	state         *State
	t             transport.Transport
	hooks         Hooks
	device        func() (kernels.Device, bool)
	gossipCut     func(addr string) bool
}

// WithState registers the trainer's state: Join makes every worker's
// values equal to rank 0's, and Commit and Restore act on it. Without it
// the Worker has no state to restore.
func WithState(s *State) Option { return func(o *options) { o.state = s } }

// WithTransport makes the Worker use t instead of building the transport
// Config asks for. Config.Peers then holds the members' transport IDs,
// which are also the addresses passed to Connect (the in-memory transport
// in tests). The Worker does not close t.
func WithTransport(t transport.Transport) Option { return func(o *options) { o.t = t } }

// WithHooks sets the trainer-side span hooks.
func WithHooks(h Hooks) Option { return func(o *options) { o.hooks = h } }

// WithGossipBlock, for tests (gyretest's Partition), cuts the worker's
// gossip to the gossip addresses block reports true for, as a cut network
// would (membership.Config.Block). It is called on gossip's goroutines.
func WithGossipBlock(block func(addr string) bool) Option {
	return func(o *options) { o.gossipCut = block }
}

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
	return func(o *options) { o.device = probe }
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
	cfg Config
	// log carries the worker's id and current rank (rank, for setView);
	// plain carries the id only, for the ring, which adds its own rank.
	log     zerolog.Logger
	plain   zerolog.Logger
	rank    *atomic.Int64
	t       transport.Transport
	ownT    bool
	live    *liveness.Monitor // heartbeats with the view's members, for the whole worker's life
	state   *State
	sampler *Sampler
	hooks   Hooks

	// life ends at Close. Buckets flushed by Wait run under it, so a Wait
	// that gives up early never cancels a collective the peers are in.
	life context.Context
	stop context.CancelFunc

	// mu guards cur against Close. The trainer's goroutine reads cur
	// without it, since only that goroutine replaces it; the heartbeats
	// read view, the same, which never waits for Close.
	mu   sync.Mutex
	cur  *viewState
	view atomic.Pointer[viewState]

	iter    int64
	iterNow atomic.Int64 // iter, for the heartbeats' progress: both set only by setIter
	// ctrlStep is what the control channel's collectives belong to, for
	// stall reports.
	ctrlStep atomic.Int32
	batch    []int64
	started  time.Time     // when the iteration's Batch was taken
	compute  time.Duration // the iteration's compute time, up to Wait
	// observer hears of collectives and boundaries: Config.Observer and
	// the metrics that metrics serves (Config.MetricsAddr).
	observer Observer
	metrics  *obs.Server
	trace    *obs.Trace
	computes []time.Duration // every rank's compute time in the last boundary's table
	joiners  int             // joiners gossip listed at the last boundary, not yet in a view

	gradType  string // "float32" or "float64", fixed by the first AllReduceAsync
	pending   []*Handle
	failed    error     // the iteration's first collective failure
	nextCheck int64     // the iteration whose boundary next checks the state digests
	lastVote  time.Time // when the previous boundary (or Join) ended

	// node is this worker's gossip membership; nil in the static view.
	node *membership.Node
	// seeds are the gossip seeds but this worker's own address,
	// namedSeed whether the seed list named this worker, and starter
	// whether it named it first (seeds.go).
	seeds              []string
	namedSeed, starter bool
	meta               *metaPublisher
	adm                *admissions // the members' side of the admission handshake
	leaveReq           atomic.Bool // RequestLeave was called
	left               bool        // left the job at a boundary
	// departed are the members that left the view, with their data
	// addresses, until gossip stops listing them there.
	departed map[transport.PeerID]string
	forget   []transport.PeerID // departed members the transport still knows
	// dialled is the address each peer was connected at, so that a member
	// back under its ID at another address is dialled afresh.
	dialled map[transport.PeerID]string
	capped  int // joiners MaxWorkers kept out at the last boundary
	// rec recovers from a lost member; nil in the static view, which
	// fails instead.
	rec *recoverer
	// ckpt takes the checkpoints (nil without Config.CheckpointDir);
	// epochBase is the job epoch of the checkpoint the job resumed from,
	// which later checkpoints count on from, and resumed says which.
	ckpt      *checkpointer
	epochBase uint64
	resumed   Resumed
	// failAt is Config.Failpoint; failAction, if set, is how a test's
	// worker dies there instead of its process; died says it has.
	failAt     failpoint
	failAction func()
	// timelineSkew shifts the timeline's clock (tests of merging only).
	timelineSkew time.Duration
	gossipCut    func(addr string) bool // WithGossipBlock
	died         atomic.Bool
	// reprobeEvery and handshakeNote are defaultReprobeEvery and
	// defaultHandshakeNote, or a test's shorter periods.
	reprobeEvery  int64
	handshakeNote time.Duration

	// est fits this worker's compute model from its own iterations; bst
	// is the share decision's state, the same on every member.
	est balance.Estimator
	bst balance.State
	// fits are the models and share bounds of the members in the last
	// boundary table every member judged (LB-BSP): a new view's shares
	// start from them.
	fits map[transport.PeerID]balance.Worker

	// redoneMismatch is the iteration whose mismatch was last redone
	// (redoMismatch), -1 for none.
	redoneMismatch int64
	// device reports the worker's compute device, for its memory cap;
	// held is the share of the last iteration this worker computed, whose
	// memory its allocator may still hold (0 before its first).
	device func() (kernels.Device, bool)
	held   int

	closeOnce sync.Once
	closed    atomic.Bool
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
	// A given transport brings its own credentials; a lone worker needs
	// none, as it talks to no one.
	if err := cfg.validate(o.t == nil && !cfg.lone()); err != nil {
		return nil, err
	}
	gossip := cfg.Gossip()
	cfg = cfg.WithDefaults()
	if o.state == nil {
		o.state = NewState()
	}
	if err := o.state.Err(); err != nil {
		return nil, err
	}
	sampler, err := NewSampler(cfg.RNGSeed, cfg.DatasetSize)
	if err != nil {
		return nil, err
	}
	if o.device == nil {
		o.device = localGPU(cfg.LocalRank)
	}
	if o.reprobeEvery <= 0 {
		o.reprobeEvery = defaultReprobeEvery
	}
	if o.handshakeNote <= 0 {
		o.handshakeNote = defaultHandshakeNote
	}
	// Every line carries the worker's current rank (the transports add
	// its id themselves); the ring's Comm adds the rank of its own view.
	rank := new(atomic.Int64)
	rank.Store(-1)
	base := cfg.logger()
	hooked := base.Hook(rankHook{rank})
	cfg.Logger = &hooked
	w := &Worker{failAction: o.failAction, timelineSkew: o.timelineSkew, gossipCut: o.gossipCut, device: o.device,
		reprobeEvery: o.reprobeEvery, handshakeNote: o.handshakeNote, cfg: cfg, rank: rank, log: hooked.With().Str("id", cfg.Name).Logger(),
		plain: base.With().Str("id", cfg.Name).Logger(), t: o.t, state: o.state, sampler: sampler, hooks: o.hooks,
		departed: map[transport.PeerID]string{}, dialled: map[transport.PeerID]string{}, redoneMismatch: -1}
	w.failAt, _ = parseFailpoint(cfg.Failpoint) // validate checked it
	if w.ckpt, err = newCheckpointer(cfg, w.log); err != nil {
		return nil, err
	}
	// A worker on a device (a GPU) fits the device's flat-then-linear
	// time model.
	_, w.est.Flat = w.device()
	w.life, w.stop = context.WithCancel(context.Background())
	if w.t == nil {
		if w.t, err = w.newTransport(); err != nil {
			return nil, err
		}
		w.ownT = true
	}
	joined := false
	defer func() {
		if !joined {
			// A worker refused or given up on leaves gossip, so that the
			// members see it leave rather than die.
			w.leaveGossip()
			w.Close()
		}
	}()
	if err := w.startObservers(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeoutCause(ctx, cfg.JoinTimeout,
		fmt.Errorf("%w (%v, --join-timeout): %w", errJoinTimedOut, cfg.JoinTimeout, context.DeadlineExceeded))
	defer cancel()
	if w.live, err = liveness.New(liveness.Config{Transport: w.t, Interval: cfg.PeerTimeout / 4, Logger: w.log, Progress: w.progress}); err != nil {
		return nil, err
	}
	if gossip {
		err = w.joinGossip(ctx)
	} else {
		err = w.joinStatic(ctx)
	}
	if err == nil {
		err = w.resume(ctx)
	}
	if err != nil {
		return nil, err
	}
	w.nextCheck, w.lastVote = w.iter, time.Now()
	if gossip {
		w.rec = newRecoverer(w)
	}
	if w.trace != nil {
		w.trace.Start(w.Rank(), w.cur.view.Members[w.Rank()])
	}
	w.log.Info().Int("world", w.Size()).Uint64("epoch", w.cur.view.Epoch).Int64("iter", w.iter).Msg("joined")
	joined = true
	return w, nil
}

// newTransport builds the worker's own transport: for a job of one, an
// in-process one, which binds no port and needs no secret, so that lone
// runs never collide; else the data plane cfg asks for.
func (w *Worker) newTransport() (transport.Transport, error) {
	if w.cfg.lone() {
		return mem.NewNetwork(0).Join(transport.PeerID(w.cfg.Name))
	}
	return NewTransport(w.cfg)
}

// errJoinTimedOut marks the cause of Join's context when JoinTimeout ends
// it. The cause also matches context.DeadlineExceeded, since the
// transports report a context's cause.
var errJoinTimedOut = errors.New("JoinTimeout passed")

// joinEnded says why Join's wait ended, once ctx has: JoinTimeout, or the
// caller's context, cancelled (as on SIGTERM) or past its own deadline. It
// wraps ctx.Err().
func (w *Worker) joinEnded(ctx context.Context) error {
	switch {
	case errors.Is(context.Cause(ctx), errJoinTimedOut):
		return fmt.Errorf("Join gave up after JoinTimeout %v (--join-timeout): %w", w.cfg.JoinTimeout, ctx.Err())
	case errors.Is(ctx.Err(), context.Canceled):
		return fmt.Errorf("Join was cancelled while it waited: %w", ctx.Err())
	}
	return fmt.Errorf("Join's context reached its deadline before JoinTimeout %v: %w", w.cfg.JoinTimeout, ctx.Err())
}

// joinStatic joins the static view of cfg.Peers, in which a worker's name
// is its address.
func (w *Worker) joinStatic(ctx context.Context) error {
	cfg := w.cfg
	peers := cfg.Peers
	if len(peers) == 0 {
		peers = []string{cfg.Name}
	}
	if peers[cfg.Rank] != cfg.Name {
		return fmt.Errorf("%w: Name %q must be this worker's address in Peers, %q", ErrConfig, cfg.Name, peers[cfg.Rank])
	}
	members := make([]member, len(peers))
	for i, p := range peers {
		members[i] = member{ID: transport.PeerID(p), Addr: p}
	}
	return w.installView(ctx, newView{epoch: 1, members: members, shares: cfg.Shares, what: "the static view",
		patient: true, sync: syncState, root: 0})
}

// connectView connects to every member of vs, naming one whose secret
// differs after lingering so that it learns why too.
func (w *Worker) connectView(ctx context.Context, vs *viewState) error {
	err := w.connect(ctx, vs.ids, vs.addrs(), vs.rank)
	if errors.Is(err, transport.ErrUnauthenticated) {
		w.lingerRefused(ctx)
	}
	return err
}

// connect is connectMembers, first dropping every member that the
// transport holds at an address other than addrs gives, a worker back
// under its ID at a new address: Connect would otherwise return the old,
// dead link.
func (w *Worker) connect(ctx context.Context, ids []transport.PeerID, addrs []string, rank int) error {
	for i, id := range ids {
		if i != rank {
			w.redialIfMoved(id, addrs[i])
		}
	}
	if err := connectMembers(ctx, w.t, ids, addrs, rank); err != nil {
		return err
	}
	for i, id := range ids {
		if i != rank {
			w.dialled[id] = addrs[i]
		}
	}
	return nil
}

// redialIfMoved drops id if the transport holds it at an address other
// than addr, so that the next Connect dials addr.
func (w *Worker) redialIfMoved(id transport.PeerID, addr string) {
	prev, ok := w.dialled[id]
	if !ok || prev == addr {
		return
	}
	w.log.Info().Str("peer", string(id)).Str("was", prev).Str("now", addr).Msg("member is back at a new address; dialling it afresh")
	if f, ok := w.t.(transport.Forgetter); ok {
		f.Forget(id)
	} else if d, ok := w.t.(transport.Dropper); ok {
		d.Drop(id, errMoved)
	}
	delete(w.dialled, id)
}

var errMoved = errors.New("gyre: the member is back at another address")

// lingerRefused keeps a worker whose credentials a peer refused reachable
// for a while before Join closes its transport, so that the peers dialing
// it are refused in turn and name it, instead of retrying a closed port
// until their JoinTimeout.
func (w *Worker) lingerRefused(ctx context.Context) {
	if !w.ownT {
		return
	}
	w.log.Warn().Dur("for", refusedLinger).Msg("a peer refused this worker's certificate; staying reachable so the peers learn why")
	select {
	case <-time.After(refusedLinger):
	case <-ctx.Done():
	}
}

// refusedLinger is how long lingerRefused waits: long enough for peers
// that retry every connectRetry to dial again.
const refusedLinger = 3 * time.Second

// agree checks that every worker registered the same state layout and the
// same batch settings, so that a misconfigured worker fails Join on every
// worker instead of training on different data. With balancing, each
// worker's record also carries its memory cap (shareCap), which the view's
// first shares then respect.
func (w *Worker) agree(ctx context.Context) error {
	vs := w.cur
	rec := record{kind: kindSettings, iter: -1, layout: w.state.layout(), decision: w.settingsDigest(),
		minShare: int64(w.minShare())}
	if w.cfg.Balance == BalanceLBBSP {
		rec.headroom, rec.maxShare = w.shareCap()
	}
	recs, err := w.vote(ctx, vs, rec)
	if err != nil {
		return err
	}
	var errs []error
	for r, rec := range recs[1:] {
		if rec.layout != recs[0].layout {
			errs = append(errs, fmt.Errorf("%w: rank %d registered different state (names, kinds or lengths) from rank 0", ErrDiverged, r+1))
		}
		if rec.decision != recs[0].decision {
			errs = append(errs, fmt.Errorf("%w: rank %d (%s) has different batch settings (one of %s) from rank 0 (%s)",
				ErrDiverged, r+1, vs.ids[r+1], settingNames(w.settings()), vs.ids[0]))
		}
	}
	if len(errs) > 0 {
		// Every worker holds the same table, so all gather alike; the
		// digests' verdict stands if the gather fails.
		if named, err := w.differences(ctx, vs); err != nil {
			w.log.Debug().Err(err).Msg("could not gather the settings to name the difference")
		} else if len(named) > 0 {
			errs = named
		}
	}
	if err := w.settle(ctx, vs, errors.Join(errs...)); err != nil {
		return err
	}
	w.capShares(recs)
	return nil
}

// differences gathers every worker's settings and state layout and names,
// for each rank that differs from rank 0, the first difference with both
// values: the field or tensor the user must fix, not a list of suspects.
func (w *Worker) differences(ctx context.Context, vs *viewState) ([]error, error) {
	// A worker that cannot encode its own still takes part in both
	// gathers, with nothing, so that none is left waiting.
	own, ownErr := json.Marshal(w.fitting())
	if ownErr != nil {
		own = nil
	}
	n := len(vs.ids)
	lens := make([]int64, n)
	lens[vs.rank] = int64(len(own))
	if err := ring.AllGather(ctx, vs.ctrl, lens); err != nil {
		return nil, err
	}
	width := slices.Max(lens)
	if width > maxFittingBytes {
		return nil, fmt.Errorf("a worker's settings take %d bytes, more than %d", width, maxFittingBytes)
	}
	table := make([]byte, n*int(width))
	copy(table[vs.rank*int(width):], own)
	if err := vs.ctrl.AllGather(ctx, wire.DTypeBytes, table); err != nil {
		return nil, err
	}
	if ownErr != nil {
		return nil, ownErr
	}
	fits := make([]fitting, n)
	for r := range fits {
		at := r * int(width)
		if lens[r] <= 0 || lens[r] > width {
			return nil, fmt.Errorf("rank %d sent no settings", r)
		}
		if err := json.Unmarshal(table[at:at+int(lens[r])], &fits[r]); err != nil {
			return nil, fmt.Errorf("rank %d's settings: %w", r, err)
		}
	}
	var errs []error
	for r := 1; r < n; r++ {
		if m := misfitOf(fits[0], fits[r]); m != nil {
			errs = append(errs, fmt.Errorf("%w: rank %d (%s) differs from rank 0 (%s) in %s: %s at rank %d, %s at rank 0",
				ErrDiverged, r, vs.ids[r], vs.ids[0], m.What, m.Joiner, r, m.Job))
		}
	}
	return errs, nil
}

// maxFittingBytes bounds a worker's encoded fitting, which describes at
// most maxDescribed tensors.
const maxFittingBytes = 1 << 20

// confirm makes the outcome of the state broadcast known to every worker,
// the root included, whose part of a broadcast can end before the others
// receive theirs, and checks that every worker now holds the same state.
func (w *Worker) confirm(ctx context.Context, syncErr error, root int) error {
	vs := w.cur
	rec := record{kind: kindSynced, iter: -1, status: statusOf(syncErr)}
	var err error
	if syncErr == nil {
		if rec.digest, rec.hashNs, err = w.digestState(true); err != nil {
			return err
		}
	}
	recs, err := w.vote(ctx, vs, rec)
	if err != nil {
		return errors.Join(syncErr, err)
	}
	if fe := failures(recs, -1, syncErr); fe != nil {
		return w.settle(ctx, vs, fmt.Errorf("gyre: broadcast of rank %d's state: %w", root, fe))
	}
	return w.settle(ctx, vs, errors.Join(divergedStates(recs)...))
}

// settingsDigest hashes the settings every worker must share (see
// jobSettings).
func (w *Worker) settingsDigest() uint64 { return digestSettings(w.settings()) }

// settings lists the settings every worker must share: Shares too in the
// static view, where they do not come with the view.
func (w *Worker) settings() []setting {
	var shares []int
	if w.node == nil {
		shares = w.cur.shares
	}
	return jobSettings(w.cfg, shares)
}

// fitting is what a joiner must share with this worker's job.
func (w *Worker) fitting() fitting {
	return fitting{Settings: w.settings(), Tensors: w.state.describe(), Entries: len(w.state.entries), Layout: w.state.layout()}
}

// syncState broadcasts root's tensors, metadata and iteration to every
// worker, as Horovod's broadcast_parameters does, so all start identical.
func (w *Worker) syncState(ctx context.Context, root int) error {
	defer w.observeSpan("state transfer", time.Now())
	vs := w.cur
	var blob []byte
	if vs.rank == root {
		var err error
		if blob, err = w.state.marshalMeta(); err != nil {
			return err
		}
	}
	head := []int64{w.iter, int64(len(blob)), int64(w.epochBase)}
	if err := ring.Broadcast(ctx, vs.data, root, head); err != nil {
		return fmt.Errorf("gyre: broadcast state from rank %d: %w", root, err)
	}
	w.setIter(head[0])
	w.epochBase = uint64(head[2])
	if vs.rank != root {
		blob = make([]byte, head[1])
	}
	for _, e := range w.state.entries {
		var err error
		switch e.kind {
		case kindF32:
			err = ring.Broadcast(ctx, vs.data, root, e.f32)
		case kindF64:
			err = ring.Broadcast(ctx, vs.data, root, e.f64)
		}
		if err != nil {
			return fmt.Errorf("gyre: broadcast %q from rank %d: %w", e.name, root, err)
		}
		if vs.rank == root {
			w.fail(FailSendState)
		} else {
			w.fail(FailRecvState)
		}
	}
	if len(blob) > 0 {
		if err := vs.data.Broadcast(ctx, root, wire.DTypeBytes, blob); err != nil {
			return fmt.Errorf("gyre: broadcast metadata from rank %d: %w", root, err)
		}
	}
	if vs.rank != root {
		return w.state.unmarshalMeta(blob)
	}
	return nil
}

// Rank returns this worker's rank in the current view.
func (w *Worker) Rank() int { return w.cur.rank }

// Size returns the number of workers in the current view.
func (w *Worker) Size() int { return len(w.cur.ids) }

// Iter returns the current iteration.
func (w *Worker) Iter() int64 { return w.iter }

// View returns the current view.
func (w *Worker) View() View {
	v := w.cur.view
	return View{Epoch: v.Epoch, Members: slices.Clone(v.Members), RingOrder: w.cur.ringOrder(),
		CostModel: w.cur.data.CostModel(), SmallBytes: w.cur.data.SmallBytes()}
}

// Shares returns the per-rank batch shares of the current iteration.
func (w *Worker) Shares() []int { return slices.Clone(w.cur.shares) }

// Batch returns this worker's part of the current iteration's batch, and
// starts the iteration's compute clock.
func (w *Worker) Batch() Batch {
	vs := w.cur
	w.started = time.Now()
	start, count := Positions(w.iter, vs.shares, vs.rank)
	w.batch = w.sampler.Indices(w.batch[:0], start, count)
	return Batch{Iter: w.iter, Global: w.cfg.GlobalBatch, Share: vs.shares[vs.rank], Start: start, Indices: w.batch}
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
	return submit(ctx, w, name, "float32", w.cur.f32, grad)
}

// AllReduceAsync64 is AllReduceAsync for float64 gradients. Config.Compress
// does not apply to them.
func (w *Worker) AllReduceAsync64(ctx context.Context, name string, grad []float64) *Handle {
	return submit(ctx, w, name, "float64", w.cur.f64, grad)
}

// submit weighs grad and hands it to the view's fuser for T.
func submit[T float32 | float64](ctx context.Context, w *Worker, name, gradType string, fuser *ring.Fuser[T], grad []T) *Handle {
	if err := w.useGradType(gradType); err != nil {
		return w.failedHandle(name, err)
	}
	vs := w.cur
	weigh(grad, vs.shares[vs.rank], w.cfg.GlobalBatch)
	return w.track(&Handle{h: fuser.AllReduceAsync(ctx, name, grad)})
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

func (w *Worker) useGradType(t string) error {
	switch {
	case w.closed.Load():
		return ErrClosed
	case w.gradType == "":
		w.gradType = t
	case w.gradType != t:
		return fmt.Errorf("%w: %s gradients after %s ones: a worker uses one gradient type", ErrConfig, t, w.gradType)
	}
	return nil
}

func (w *Worker) track(h *Handle) *Handle {
	w.pending = append(w.pending, h)
	return h
}

func (w *Worker) failedHandle(name string, err error) *Handle {
	return w.track(&Handle{err: fmt.Errorf("gyre: allreduce %q: %w", name, err)})
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
func (w *Worker) Wait(ctx context.Context) error {
	if !w.started.IsZero() {
		w.compute = time.Since(w.started)
	}
	w.flush()
	start := time.Now()
	var first error
	for _, h := range w.pending {
		if err := h.Wait(ctx); err != nil && first == nil {
			first = err
		}
	}
	w.observeSpan("wait", start)
	if first != nil && ctx.Err() != nil && errors.Is(first, ctx.Err()) {
		return first // only the wait ended; the buckets are still pending
	}
	w.pending = w.pending[:0]
	if first != nil && w.failed == nil {
		w.failed = first
	}
	if lost := w.peerLost(w.cur, first); lost != nil {
		return lost
	}
	return first
}

// flush sends the open buckets under the worker's lifetime context.
func (w *Worker) flush() {
	vs := w.cur
	vs.f32.Flush(w.life)
	vs.f64.Flush(w.life)
}

// AllGather64 gives every worker every worker's row, in rank order: an
// unweighted collective for metrics and reports (losses, timings), unlike
// AllReduceAsync, which weighs gradients by share. Every worker passes a
// row of the same length; it needs no gradients pending, as Boundary.
func (w *Worker) AllGather64(ctx context.Context, row []float64) ([][]float64, error) {
	if err := w.idle(); err != nil {
		return nil, err
	}
	vs := w.cur
	n, k := len(vs.ids), len(row)
	table := make([]float64, n*k)
	copy(table[vs.rank*k:], row)
	if err := ring.AllGather(ctx, vs.data, table); err != nil {
		return nil, w.collectiveErr(vs, "allgather", err)
	}
	rows := make([][]float64, n)
	for r := range rows {
		rows[r] = table[r*k : (r+1)*k : (r+1)*k]
	}
	return rows, nil
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
	if err := w.idle(); err != nil {
		return err
	}
	vs := w.cur
	if err := ring.AllReduce(ctx, vs.data, wop, vals); err != nil {
		return w.collectiveErr(vs, "reduce", err)
	}
	return nil
}

// collectiveErr records a failed collective outside the gradient path for
// the boundary's record, as Wait does a gradient's, and names the lost
// worker with a *PeerLostError, or says which collective failed.
func (w *Worker) collectiveErr(vs *viewState, what string, err error) error {
	if w.failed == nil {
		w.failed = err // the boundary's record reports it, as a gradient's failure
	}
	if lost := w.peerLost(vs, err); lost != nil {
		return lost
	}
	return fmt.Errorf("gyre: %s: %w", what, err)
}

// peerLost returns the *PeerLostError naming the member blamed for err,
// or nil if err is not a lost peer's.
func (w *Worker) peerLost(vs *viewState, err error) error {
	if err == nil || !errors.Is(err, transport.ErrPeerGone) {
		return nil
	}
	if r, p, ok := w.blame(vs, err); ok {
		return w.peerLostError(w.iter, r, p, err)
	}
	return nil
}

// peerLostError builds the *PeerLostError for rank r, saying so if this
// worker itself stalled for longer than PeerTimeout since the previous
// boundary ended: then the peers lost it, not it them.
func (w *Worker) peerLostError(iter int64, r int, p transport.PeerID, err error) *PeerLostError {
	e := &PeerLostError{Iter: iter, Rank: r, Peer: p, Err: err}
	if d := w.live.StalledSince(w.lastVote); d > w.cfg.PeerTimeout {
		e.Unresponsive, e.SelfRank, e.Self, e.PeerTimeout = d, w.cur.rank, transport.PeerID(w.cfg.Name), w.cfg.PeerTimeout
	}
	return e
}

// Comm returns the current view's communicator, for unweighted
// collectives outside the gradient path: benchmarks (gyre bench
// allreduce), metrics, reports. Unlike AllReduceAsync, which weighs each
// worker's gradient by its share, ring.AllReduce on it counts every
// worker alike. Like Boundary it needs no gradients pending, and every
// worker must run the same collectives on it in the same order. A
// Boundary that changes the view (Change.ViewChanged) closes it: take it
// afresh after each boundary.
func (w *Worker) Comm() (*ring.Comm, error) {
	if err := w.idle(); err != nil {
		return nil, err
	}
	return w.cur.data, nil
}

// decisionDigest hashes the view and shares this worker runs with, as the
// previous boundary decided them.
func (w *Worker) decisionDigest() uint64 {
	vs := w.cur
	return viewDigest(vs.view.Epoch, vs.members, vs.shares)
}

// idle reports ErrPending if gradients are unfinished, or ErrClosed.
func (w *Worker) idle() error {
	switch {
	case w.closed.Load():
		return ErrClosed
	case len(w.pending) > 0:
		return ErrPending
	}
	return nil
}

// Commit records the registered state and the sampler position (the next
// iteration) as the point Restore returns to. Call it after Boundary.
func (w *Worker) Commit() error {
	if err := w.idle(); err != nil {
		return err
	}
	if err := w.state.commit(w.iter); err != nil {
		return err
	}
	if w.rec != nil {
		w.rec.committed(w.cur.view.Epoch, w.iter)
	}
	if w.ckpt != nil {
		return w.ckpt.committed(w)
	}
	return nil
}

// Restore copies the committed state back into the registered tensors and
// metadata, and moves the sampler back to the committed iteration.
func (w *Worker) Restore() error {
	if err := w.idle(); err != nil {
		return err
	}
	return w.rollBack()
}

// rollBack restores the committed state and moves the iteration back to
// it, forgetting the failure and timing of the iteration under way.
func (w *Worker) rollBack() error {
	iter, err := w.state.restore()
	if err != nil {
		return err
	}
	w.setIter(iter)
	w.failed = nil
	w.started, w.compute = time.Time{}, 0
	return nil
}

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
func (w *Worker) Abandon(ctx context.Context) error {
	err := w.Wait(ctx)
	if err != nil && len(w.pending) > 0 {
		return err // ctx ended while gradients were still in flight
	}
	failed := w.failed
	if failed != nil && w.rec == nil {
		return fmt.Errorf("gyre: abandon iteration %d: %w", w.iter, failed)
	}
	if err := w.Restore(); err != nil {
		return err
	}
	w.failed = failed // the next boundary's record says so
	return nil
}

// Leave ends the job: every worker of the view calls it after the loop,
// and it waits at a barrier for all of them, then says farewell and waits
// (up to CollectiveTimeout) until every peer has said farewell too or is
// gone, so that closing cuts off no message a peer still needs, then
// leaves gossip (the others list it as left) and closes the worker. To
// leave a job that goes on, use RequestLeave; after the Boundary that
// returned Change.Left, Leave returns nil. With Config.CheckpointDir it
// first writes a checkpoint that fell due while the disk was busy, and
// waits for the writes under way.
func (w *Worker) Leave(ctx context.Context) error {
	if w.left {
		return nil
	}
	w.ctrlStep.Store(int32(stepLeave))
	if err := w.idle(); err != nil {
		return err
	}
	ckptErr := w.ckpt.finish(ctx, w)
	err := w.cur.ctrl.Barrier(ctx)
	if err == nil {
		fctx, cancel := context.WithTimeout(ctx, w.cfg.CollectiveTimeout)
		err = w.live.Farewell(fctx, w.cfg.PeerTimeout)
		cancel()
		if err != nil {
			err = fmt.Errorf("gyre: leave: waiting for the peers' farewells: %w", err)
		}
	}
	return errors.Join(ckptErr, err, w.leaveGossip(), w.Close())
}

// Close stops the worker at once: pending gradients fail with ErrClosed,
// and the transport is closed unless it was given with WithTransport.
// Peers still in a collective with this worker fail it. Close is
// idempotent and safe from any goroutine, also while the trainer's
// goroutine submits gradients.
func (w *Worker) Close() error {
	var err error
	w.closeOnce.Do(func() {
		w.closed.Store(true)
		w.stop()
		w.mu.Lock()
		if w.cur != nil {
			w.cur.close()
		}
		w.mu.Unlock()
		if w.live != nil {
			w.live.Close()
		}
		w.adm.close()
		w.meta.stop()
		if w.node != nil {
			w.node.Close()
		}
		if w.ownT && w.t != nil {
			err = w.t.Close()
		}
		if w.metrics != nil {
			if merr := w.metrics.Close(); merr != nil {
				w.log.Warn().Err(merr).Str("metrics_addr", w.MetricsAddr()).Msg("the metrics server did not stop cleanly")
			}
		}
		if w.trace != nil {
			if terr := w.trace.Close(); terr != nil {
				w.log.Warn().Err(terr).Str("timeline", w.cfg.Timeline).Msg("the timeline could not be written")
			}
		}
	})
	return err
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
	return connectMembers(ctx, t, members, addrs, rank)
}

// connectMembers is ConnectAll with each member's address in addrs.
func connectMembers(ctx context.Context, t transport.Transport, members []transport.PeerID, addrs []string, rank int) error {
	for i, m := range members {
		if i == rank {
			continue
		}
		var refusal error // names the refused member itself, which need not be rank i
		refused := func() error {
			refusal = refusedMember(t, members, addrs, rank)
			return refusal
		}
		if err := connectPeer(ctx, t, m, addrs[i], refused); err != nil {
			if refusal != nil {
				return refusal
			}
			return fmt.Errorf("gyre: rank %d connecting to rank %d (%s at %s): %w", rank, i, m, addrs[i], err)
		}
	}
	return nil
}

// connectPeer connects t to peer at addr, retrying while it starts, until
// ctx ends. A peer that refuses this worker's credentials fails it at
// once, and so does refused's error, if refused is given.
func connectPeer(ctx context.Context, t transport.Transport, peer transport.PeerID, addr string, refused func() error) error {
	for {
		if refused != nil {
			if err := refused(); err != nil {
				return err
			}
		}
		cctx, cancel := context.WithTimeout(ctx, connectAttempt)
		err := t.Connect(cctx, peer, addr)
		cancel()
		switch {
		case err == nil:
			return nil
		case errors.Is(err, transport.ErrUnauthenticated):
			return fmt.Errorf("the cluster secrets differ: %w", err)
		case ctx.Err() != nil:
			return err
		}
		select {
		case <-time.After(connectRetry):
		case <-ctx.Done():
			// Both wrapped: a member that never answered is a lost peer
			// to a view change, which recovers from it.
			return fmt.Errorf("%w (last attempt: %w)", ctx.Err(), err)
		}
	}
}

// refusedMember returns an error naming the first member, other than rank,
// whose connection t refused for its certificate, or nil.
func refusedMember(t transport.Transport, members []transport.PeerID, addrs []string, rank int) error {
	rr, ok := t.(transport.RefusalReporter)
	if !ok {
		return nil
	}
	for _, ref := range rr.Refusals() {
		for i, m := range members {
			if i != rank && (ref.Claimed == m || ref.Remote == addrs[i]) {
				return fmt.Errorf("gyre: rank %d: rank %d (%s) connected with a certificate this cluster's CA did not issue: the cluster secrets differ: %w",
					rank, i, m, ref.Err)
			}
		}
	}
	return nil
}

const (
	connectAttempt = 2 * time.Second
	connectRetry   = 100 * time.Millisecond
)
