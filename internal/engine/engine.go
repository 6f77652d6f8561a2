// Package engine runs a worker: Join, the data path, Boundary (decide,
// then the plan's I/O, then apply), the one installView every view change
// goes through, recovery from a lost worker, rejoining, resuming from a
// checkpoint, and the failpoints of the recovery tests. Package gyre is
// its public face; the decisions are the pure packages' (vote, recovery,
// balance), and the mechanisms (view, probe, gossip, admission, shares,
// recoverer, checkpoint/take, obs) own their goroutines and I/O.
package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/admission"
	"github.com/gyre-ml/gyre/internal/checkpoint/take"
	"github.com/gyre-ml/gyre/internal/config"
	"github.com/gyre-ml/gyre/internal/errs"
	"github.com/gyre-ml/gyre/internal/gossip"
	"github.com/gyre-ml/gyre/internal/obs"
	"github.com/gyre-ml/gyre/internal/probe"
	"github.com/gyre-ml/gyre/internal/recoverer"
	"github.com/gyre-ml/gyre/internal/sampler"
	"github.com/gyre-ml/gyre/internal/shares"
	"github.com/gyre-ml/gyre/internal/state"
	"github.com/gyre-ml/gyre/internal/testhook"
	"github.com/gyre-ml/gyre/internal/view"
	"github.com/gyre-ml/gyre/kernels"
	"github.com/gyre-ml/gyre/liveness"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/mem"
)

// Options are Join's options beside the configuration (gyre.Option).
type Options struct {
	// State is the trainer's registered state (nil: none).
	State *state.Set
	// T, if set, is the transport to use instead of building one; the
	// engine does not close it.
	T transport.Transport
	// Device reports the worker's compute device (nil: the GPU at
	// LocalRank, through NVML).
	Device func() (kernels.Device, bool)
	// Errors build the public typed errors.
	Errors Errors
	// Test holds the test seams.
	Test testhook.Hooks
}

// Errors build the public typed errors of package gyre, so that
// errors.As finds its types: the engine reports what was lost or failed,
// the public package decides how it reads.
type Errors struct {
	// PeerLost builds a *gyre.PeerLostError.
	PeerLost func(PeerLost) error
	// IterationFailed builds a *gyre.IterationError.
	IterationFailed func(IterationFailed) error
}

// PeerLost is a lost worker, as gyre.PeerLostError reports it.
type PeerLost struct {
	Iter int64
	Rank int
	Peer transport.PeerID
	Err  error
	SelfStall
}

// IterationFailed is an iteration whose collectives failed on some
// ranks, as gyre.IterationError reports it.
type IterationFailed struct {
	Iter    int64
	Ranks   []int
	Reasons []string
	Local   error
	SelfStall
}

// SelfStall says that this worker itself could not run for Unresponsive,
// longer than PeerTimeout, during the failed iteration; zero if it ran.
type SelfStall struct {
	Unresponsive time.Duration
	SelfRank     int
	Self         transport.PeerID
	PeerTimeout  time.Duration
}

// Engine is one worker of a job. Its methods other than Close and
// RequestLeave belong to the trainer's goroutine.
type Engine struct {
	cfg config.Config
	// opts are Join's options: the test seams and the error builders are
	// read from them.
	opts Options
	// log carries the worker's id and current rank (rank, which
	// installView sets); plain carries the id only, for the ring, which
	// adds its own rank.
	log, plain zerolog.Logger
	rank       *atomic.Int64
	// loss is the trainer's last ReportLoss (float64 bits), if lossSet.
	loss    atomic.Uint64
	lossSet atomic.Bool

	links   *view.Links
	live    *liveness.Monitor
	state   *state.Set
	sampler *sampler.Sampler
	bal     *shares.Balancer
	rep     *obs.Reporting

	// cur is the current view. The trainer's goroutine reads it without
	// mu, since only that goroutine replaces it; mu guards it against
	// Close. shared is the same view for the heartbeats and metrics,
	// which read it from their own goroutines.
	mu     sync.Mutex
	cur    *view.View
	shared atomic.Pointer[view.View]

	it iteration
	// merge is this worker's view in the merge of started views.
	merge mergeState

	// Membership: gossip is nil in the static view, and rec, which
	// recovers from a lost member, too.
	gossip  *gossip.Gossip
	adm     *admission.Admissions
	rec     *recoverer.Recoverer
	members membership

	ckpt checkpoints
	fp   failpoints

	// life ends at Close. Buckets flushed by Wait run under it, so a Wait
	// that gives up early never cancels a collective the peers are in.
	life context.Context
	// keepSeeds stops gossip.KeepSeeds (nil without gossip).
	keepSeeds func()
	stop      context.CancelFunc
	closeOnce sync.Once
	closed    atomic.Bool
}

// iteration is the iteration under way, as the trainer's goroutine runs
// it.
type iteration struct {
	iter int64
	// now is iter, for the heartbeats' progress: both set only by setIter.
	now atomic.Int64
	// left is the epoch of the latest view this worker saw fail
	// (abandon), for the heartbeats' progress.
	left atomic.Uint64
	// ctrlStep is what the control channel's collectives belong to, for
	// stall reports.
	ctrlStep atomic.Int32
	batch    []int64
	started  time.Time     // when the iteration's Batch was taken
	compute  time.Duration // its compute time, up to Wait
	gradType string        // "float32" or "float64", fixed by the first AllReduceAsync
	pending  []pendingGrad
	failed   error // the first collective failure
	// nextCheck is the iteration whose boundary next checks the state
	// digests; lastVote is when the previous boundary (or Join) ended.
	nextCheck int64
	lastVote  time.Time
	// redoneMismatch is the iteration whose mismatch was last redone, -1
	// for none.
	redoneMismatch int64
	// computes are every rank's compute times in the last boundary's table.
	computes []time.Duration
}

// membership is what the worker knows of the job's membership beside
// its view.
type membership struct {
	leaveReq atomic.Bool // RequestLeave was called
	left     bool        // left the job at a boundary
	// forget are departed members the transport still knows.
	forget []transport.PeerID
	// joiners counts the joiners gossip listed at the last boundary, and
	// capped those MaxWorkers kept out.
	joiners, capped int
}

// checkpoints is the checkpointing state: the taker (nil without
// Config.CheckpointDir), the job epoch of the checkpoint the job resumed
// from, which later checkpoints count on from, and which it was.
type checkpoints struct {
	taker     *take.Taker
	epochBase uint64
	resumed   Resumed
}

// Resumed says which checkpoint a job resumed from (gyre.Resumed).
type Resumed struct {
	File  string
	Rank  int
	ID    string
	Epoch uint64
	Iter  int64
}

// Join starts a worker and enters the job's view (gyre.Join).
func Join(ctx context.Context, cfg config.Config, o Options) (*Engine, error) {
	// A given transport brings its own credentials; a lone worker needs
	// none, as it talks to no one.
	if err := cfg.Check(o.T == nil && !cfg.Lone()); err != nil {
		return nil, err
	}
	gossiping := cfg.Gossip()
	cfg = cfg.WithDefaults()
	if o.State == nil {
		o.State = state.New()
	}
	smp, err := sampler.New(cfg.RNGSeed, cfg.DatasetSize)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", config.ErrConfig, err)
	}
	if o.Device == nil {
		o.Device = shares.LocalGPU(cfg.LocalRank)
	}
	if o.Test.ReprobeEvery <= 0 {
		o.Test.ReprobeEvery = probe.DefaultReprobeEvery
	}
	if o.Test.HandshakeNote <= 0 {
		o.Test.HandshakeNote = admission.DefaultNote
	}
	// Every line carries the worker's current rank (the transports add
	// its id themselves); the ring's Comm adds the rank of its own view.
	rank := new(atomic.Int64)
	rank.Store(-1)
	base := cfg.Log()
	hooked := base.Hook(config.RankHook{Rank: rank})
	cfg.Logger = &hooked
	e := &Engine{cfg: cfg, opts: o, rank: rank, log: hooked.With().Str("id", cfg.Name).Logger(),
		plain: base.With().Str("id", cfg.Name).Logger(), state: o.State, sampler: smp}
	e.it.redoneMismatch = -1
	e.fp.at, _ = config.ParseFailpoint(cfg.Failpoint) // Check checked it
	e.fp.action = o.Test.FailAction
	e.bal = shares.New(shares.Config{LBBSP: cfg.Balance == config.BalanceLBBSP, Global: cfg.GlobalBatch,
		AllowZero: cfg.BalanceAllowZero, BytesPerSample: cfg.BytesPerSample, Device: o.Device, Log: e.log})
	if e.ckpt.taker, err = take.New(cfg, e.log); err != nil {
		return nil, err
	}
	e.life, e.stop = context.WithCancel(context.Background())
	t, own := o.T, false
	if t == nil {
		if t, err = e.newTransport(); err != nil {
			return nil, err
		}
		own = true
	}
	e.links = view.NewLinks(t, own, e.log)
	joined := false
	defer func() {
		if !joined {
			// A worker refused or given up on leaves gossip, so that the
			// members see it leave rather than die.
			e.gossip.Leave()
			e.Close()
		}
	}()
	if st, ok := t.(transport.Striper); ok && cfg.Stripes == config.StripesAuto {
		// The probe channel is striped from its first use, so that the
		// probes never reopen it: a single probe's messages stay below
		// wire.StripeMin, on one connection; only the striped probe's
		// dial the others.
		if err := st.SetStripes(transport.ChanProbe, probe.AutoStripes); err != nil {
			return nil, err
		}
	}
	if err := e.openReporting(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeoutCause(ctx, cfg.JoinTimeout,
		fmt.Errorf("%w (%v, --join-timeout): %w", errJoinTimedOut, cfg.JoinTimeout, context.DeadlineExceeded))
	defer cancel()
	if e.live, err = liveness.New(liveness.Config{Transport: t, Interval: cfg.PeerTimeout / 4, Logger: e.log, Progress: e.progress}); err != nil {
		return nil, err
	}
	if gossiping {
		err = e.joinGossip(ctx)
	} else {
		err = e.joinStatic(ctx)
	}
	if err == nil {
		err = e.resume(ctx)
	}
	if err != nil {
		// JoinTimeout may end a step that reports only its context's
		// error (a vote, a broadcast): say which deadline it was.
		if errors.Is(context.Cause(ctx), errJoinTimedOut) && !errors.Is(err, errJoinTimedOut) && !strings.Contains(err.Error(), "--join-timeout") {
			err = fmt.Errorf("Join gave up after JoinTimeout %v (--join-timeout): %w", cfg.JoinTimeout, err)
		}
		return nil, err
	}
	e.it.nextCheck, e.it.lastVote = e.it.iter, time.Now()
	if gossiping {
		e.rec = recoverer.New(recoverer.Config{Self: e.self().ID, T: t, Live: e.live, PeerTimeout: cfg.PeerTimeout,
			CollectiveTimeout: cfg.CollectiveTimeout, Life: e.life, Log: e.log},
			recoveryView(e.cur), e.commitOf(e.cur.Epoch), e.cur.Members)
		e.keepSeeds = e.gossip.KeepSeeds(e.life)
	}
	if e.rep.Trace != nil {
		e.rep.Trace.Start(e.cur.Rank, e.cur.Names[e.cur.Rank])
	}
	e.log.Info().Int("world", len(e.cur.IDs)).Uint64("epoch", e.cur.Epoch).Int64("iter", e.it.iter).Msg("joined")
	joined = true
	return e, nil
}

// newTransport builds the worker's own transport: for a job of one, an
// in-process one, which binds no port and needs no secret, so that lone
// runs never collide; else the data plane cfg asks for.
func (e *Engine) newTransport() (transport.Transport, error) {
	if e.cfg.Lone() {
		return mem.NewNetwork(0).Join(transport.PeerID(e.cfg.Name))
	}
	return view.NewTransport(e.cfg)
}

// openReporting opens the timeline, the metrics endpoint and the observer
// the configuration asks for.
func (e *Engine) openReporting() error {
	tname := e.cfg.Transport
	if e.cfg.Lone() {
		tname = "mem"
	}
	rep, err := obs.Open(obs.Options{Observer: e.cfg.Observer, Timeline: e.cfg.Timeline, Skew: e.opts.Test.TimelineSkew,
		MetricsAddr: e.cfg.MetricsAddr, Transport: tname, T: e.links.T, Heartbeats: e.heartbeatAges,
		PeerTimeout: e.cfg.PeerTimeout, Log: e.log})
	if err != nil {
		return fmt.Errorf("%w: %w", config.ErrConfig, err)
	}
	e.rep = rep
	return nil
}

// errJoinTimedOut marks the cause of Join's context when JoinTimeout ends
// it. The cause also matches context.DeadlineExceeded, since the
// transports report a context's cause.
var errJoinTimedOut = errors.New("JoinTimeout passed")

// joinEnded says why Join's wait ended, once ctx has: JoinTimeout, or the
// caller's context, cancelled (as on SIGTERM) or past its own deadline. It
// wraps ctx.Err().
func (e *Engine) joinEnded(ctx context.Context) error {
	switch {
	case errors.Is(context.Cause(ctx), errJoinTimedOut):
		return fmt.Errorf("Join gave up after JoinTimeout %v (--join-timeout): %w", e.cfg.JoinTimeout, ctx.Err())
	case errors.Is(ctx.Err(), context.Canceled):
		return fmt.Errorf("Join was cancelled while it waited: %w", ctx.Err())
	}
	return fmt.Errorf("Join's context reached its deadline before JoinTimeout %v: %w", e.cfg.JoinTimeout, ctx.Err())
}

// Close stops the worker at once (gyre.Worker.Close).
func (e *Engine) Close() error {
	var err error
	e.closeOnce.Do(func() {
		e.closed.Store(true)
		e.stop()
		e.mu.Lock()
		if e.cur != nil {
			e.cur.Close()
		}
		e.mu.Unlock()
		if e.live != nil {
			e.live.Close()
		}
		e.adm.Close()
		if e.keepSeeds != nil {
			e.keepSeeds()
		}
		e.gossip.Close()
		if e.links != nil && e.links.Own {
			err = e.links.T.Close()
		}
		e.rep.Close()
	})
	return err
}

// idle reports errs.Pending if gradients are unfinished, or errs.Closed.
func (e *Engine) idle() error {
	switch {
	case e.closed.Load():
		return errs.Closed
	case len(e.it.pending) > 0:
		return errs.Pending
	}
	return nil
}

// Rank returns this worker's rank in the current view.
func (e *Engine) Rank() int { return e.cur.Rank }

// Iter returns the current iteration.
func (e *Engine) Iter() int64 { return e.it.iter }

// Resumed returns the checkpoint the job resumed from at Join, and false
// if it started afresh or this worker was admitted into a running job.
func (e *Engine) Resumed() (Resumed, bool) { return e.ckpt.resumed, e.ckpt.resumed.File != "" }

// MetricsAddr returns the address the metrics are served on, "" if none.
func (e *Engine) MetricsAddr() string { return e.rep.MetricsAddr() }

// RequestLeave asks for this worker to leave at the next boundary; safe
// from any goroutine.
func (e *Engine) RequestLeave() { e.members.leaveReq.Store(true) }

// setIter sets the iteration, and the copy the heartbeats read.
func (e *Engine) setIter(iter int64) {
	e.it.iter = iter
	e.it.now.Store(iter)
}

// heartbeatAges reports how long ago each other member of the current view
// was last heard from.
func (e *Engine) heartbeatAges(report func(rank int, age time.Duration)) {
	v := e.shared.Load()
	if v == nil || e.live == nil {
		return
	}
	now := time.Now()
	for r, id := range v.IDs {
		if heard := e.live.LastHeard(id); r != v.Rank && !heard.IsZero() {
			report(r, now.Sub(heard))
		}
	}
}

// span reports the runtime's own phase name, from start to now, to an
// observer that takes spans (the timeline).
func (e *Engine) span(name string, start time.Time) { e.rep.Span(name, e.it.iter, start) }
