package ring

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/kernels"
	"github.com/gyre-ml/gyre/transport"
)

// Config configures a Comm. Every rank of one communicator must use the
// same Epoch, Members, ChunkBytes and SmallBytes, or its collectives fail
// with ErrMismatch.
type Config struct {
	// Epoch is the membership epoch; every message carries it. Required to
	// grow from one Comm to the next on the same transports (see Comm).
	Epoch uint64
	// Members lists the workers in ring order; Members[Rank] is this one.
	// IDs must be distinct and non-empty. Required.
	Members []transport.PeerID
	// Rank is this worker's index in Members.
	Rank int
	// Order, if set, is the ring order: a permutation of the ranks, data
	// passing from Order[i] to Order[i+1] and from the last back to the
	// first, so that the ring can cross slow links rarely (see
	// ChooseOrder). Only who passes to whom changes: ranks keep their
	// meaning everywhere else (rank r's AllGather contribution, its
	// ReduceScatter segment, a Broadcast root, errors). The allreduce sums
	// in another order, so its result may differ from rank order's in the
	// last bits; it is still identical on every rank. Nil is rank order.
	// Recursive doubling and the barrier pair ranks, not ring neighbours,
	// and ignore it.
	Order []int
	// Channel is the transport channel that carries the Comm's messages
	// and abort markers. Default transport.ChanData. Comms on different
	// channels over the same transports run independently, so a control
	// Comm keeps working after a data collective was cut off mid-message.
	Channel transport.Channel
	// ChunkBytes is the pipeline chunk size in bytes. Default 1 MiB.
	ChunkBytes int
	// SmallBytes is the allreduce size, in bytes, below which recursive
	// doubling runs instead of the ring. 0 means the cost model's
	// Threshold for len(Members): DefaultCostModel's until SetCostModel
	// gives a measured one. A negative value means always the ring.
	SmallBytes int
	// CollectiveTimeout bounds how long a collective may take, from the
	// moment this rank enters it, while every member is alive: a late peer
	// (a GC pause, evaluation or a checkpoint on one rank, a straggler) is
	// waited for this long, then the collective fails with a *TimeoutError
	// naming the peer this rank was waiting for. Default 10 minutes.
	CollectiveTimeout time.Duration
	// PeerTimeout is how long a member may go unheard, by Liveness, before
	// a collective in progress fails with a *transport.PeerError naming it
	// (errors.Is ErrPeerSilent and transport.ErrPeerGone). Default 2 s.
	// Without Liveness it is unused.
	PeerTimeout time.Duration
	// Liveness, if set, tells when each member was last heard from, on a
	// path apart from the collectives (liveness.Monitor's heartbeats), so a
	// dead or frozen peer is found in PeerTimeout rather than
	// CollectiveTimeout.
	Liveness Liveness
	// InitialBandwidth seeds the bandwidth estimate, in bytes per second.
	// Default 100 MB/s; a Comm replacing another passes its Bandwidth.
	InitialBandwidth float64
	// Logger receives failures. The zero Logger discards.
	Logger zerolog.Logger
	// Observer, if set, is told of every collective when it ends.
	Observer Observer
	// StallThreshold, with OnStall, reports a collective still under way
	// after this long, and again after each further StallThreshold, as
	// Horovod's stall inspector does; keep it well below
	// CollectiveTimeout. 0 reports nothing.
	StallThreshold time.Duration
	// OnStall receives the reports, one at a time, on a goroutine of
	// their own that Close waits for: it must not call the Comm.
	OnStall func(Stall)
}

// Defaults.
const (
	DefaultChunkBytes        = 1 << 20
	DefaultCollectiveTimeout = 10 * time.Minute
	DefaultPeerTimeout       = 2 * time.Second
)

// maxChunkBytes keeps ChunkSize within wire.Header's uint32.
const maxChunkBytes = 1 << 30

// Validate checks the configuration.
func (c *Config) Validate() error {
	n := len(c.Members)
	switch {
	case n == 0:
		return invalid("no members")
	case c.Rank < 0 || c.Rank >= n:
		return invalid("rank %d not in [0, %d)", c.Rank, n)
	case c.ChunkBytes < 0 || c.ChunkBytes > maxChunkBytes:
		return invalid("chunk size %d bytes not in [0, %d]", c.ChunkBytes, maxChunkBytes)
	case c.CollectiveTimeout < 0:
		return invalid("collective timeout %v < 0", c.CollectiveTimeout)
	case c.PeerTimeout < 0:
		return invalid("peer timeout %v < 0", c.PeerTimeout)
	case c.StallThreshold < 0:
		return invalid("stall threshold %v < 0", c.StallThreshold)
	case c.InitialBandwidth < 0:
		return invalid("initial bandwidth %v < 0", c.InitialBandwidth)
	case c.Channel >= transport.NumChannels:
		return invalid("channel %v", c.Channel)
	case n > math.MaxUint32:
		return invalid("%d members", n)
	}
	if err := checkOrder(c.Order, n); err != nil {
		return err
	}
	seen := make(map[transport.PeerID]bool, n)
	for i, m := range c.Members {
		if m == "" {
			return invalid("member %d has an empty id", i)
		}
		if seen[m] {
			return invalid("member %s listed twice", m)
		}
		seen[m] = true
	}
	return nil
}

// withDefaults returns a copy of c with defaults filled in.
func (c Config) withDefaults() Config {
	if c.ChunkBytes == 0 {
		c.ChunkBytes = DefaultChunkBytes
	}
	if c.CollectiveTimeout == 0 {
		c.CollectiveTimeout = DefaultCollectiveTimeout
	}
	if c.PeerTimeout == 0 {
		c.PeerTimeout = DefaultPeerTimeout
	}
	if c.InitialBandwidth == 0 {
		c.InitialBandwidth = initialBandwidth
	}
	switch {
	case c.SmallBytes == 0:
		c.SmallBytes = DefaultCostModel.Threshold(len(c.Members))
	case c.SmallBytes < 0:
		c.SmallBytes = 0
	}
	c.Members = append([]transport.PeerID(nil), c.Members...)
	c.Order = slices.Clone(c.Order)
	return c
}

// Comm runs collectives among a fixed set of members over a transport.
//
// A Comm runs one collective at a time: concurrent calls are serialized by
// a mutex, in call order, which every rank must make the same. Each
// collective takes the next sequence number, and every message carries
// (Epoch, Seq, Step, Chunk, DType, Op, Total, Algo, ChunkSize); a receiver
// checks each field against its own plan and fails with ErrMismatch on any
// difference, so ranks that disagree about a collective find out from the
// first message instead of corrupting data.
//
// Failure. A collective fails with a *MismatchError, a *StaleEpochError
// (a member is in a newer epoch than this rank), a transport error naming
// the peer (errors.Is(err, transport.ErrPeerGone); transport.PeerOf names
// it), or ctx's error. Late is not dead: while every member is alive the
// collective waits up to CollectiveTimeout from the moment this rank
// entered it, then fails with a *TimeoutError naming the peer it waited
// for; with Liveness, a member unheard for PeerTimeout (killed, stopped,
// cut off) fails it at once with a *transport.PeerError naming that member
// (ErrPeerSilent). A rank that fails sends an abort marker to every other
// member; a rank that receives one fails with an *AbortError of the same
// class and forwards it, so a failure reaches the ranks still waiting
// instead of leaving them to their timeouts, even ranks that disagree
// about which plan they run. The data buffer then holds unspecified
// values.
//
// A rank whose plan had nothing left to receive when another rank failed
// (the root of a broadcast, for instance) returns nil while the others
// fail: a Comm does not make ranks agree on a collective's outcome. The
// caller does that with a vote on a Comm of its own channel (see
// Config.Channel), which gyre.Worker's Boundary is.
//
// After a failure the caller should treat the data-plane state as suspect:
// the epoch/recovery layer rolls back, forms the next view and builds a new
// Comm with a larger Epoch over transports it has reconnected. A Comm whose
// collective failed with ErrMismatch, no peer lost, may also be used again:
// messages left over from an older Seq or Epoch are discarded by the
// receiver, so the next collective starts clean. (If the failure cut a
// message off mid-stream, which a real transport's flow control can force
// after a grace period of 250 ms, the next collective fails with that peer's
// transport error instead, and the recovery path applies.)
//
// Epochs. A rank left behind in an older epoch never mixes its data with
// a newer one's: it fails with a *StaleEpochError (ErrStaleEpoch) on the
// first message it receives from the newer epoch. A rank that receives a
// message from an older epoch discards it, since it may be a leftover of
// an aborted collective, and answers it with a notice naming its own epoch
// and collective, which fails the sender at once if it is in fact behind.
// A stale rank then aborts the newer epoch's collective too, so its ranks
// fail with an *AbortError whose Reason is AbortBehind and whose Culprit is
// the stale rank, instead of waiting for their deadline.
//
// Compression. AllReduceCompressed and ReduceScatterCompressed put float32
// data on the wire as bf16 (8 significant bits, float32's range) or fp16
// (11 significant bits, magnitudes up to 65504; beyond that ±Inf). Each
// message carries values rounded to nearest even; the receiver reduces
// them into its float32 buffer, accumulating in float32. The rank that
// completes an element's reduction (after Avg's division) rounds it to the
// wire format before forwarding it, and in recursive doubling each rank
// rounds its buffer before exchanging it, so every rank still ends
// bit-identical and, with more than one member, the result is
// representable in the wire format. A partial result is rounded once per
// hop, at most N-1 times in the ring and ⌊log2 N⌋+1 times in recursive
// doubling, plus the final rounding: with u = 2^-8 (bf16) or 2^-11 (fp16),
// an element of a Sum is within about (N+1)·u·Σ|xᵢ| of the exact sum, and
// Min and Max are the exact result rounded once. Deadlines and the
// bandwidth estimate count wire bytes. The plan, chunking included, is
// that of the uncompressed float32 collective, chosen by the caller's
// byte size.
//
// A call whose arguments are invalid on their own (ErrInvalid: an unknown
// dtype, a misaligned buffer, compression of data other than float32) is
// rejected before it takes a sequence number or sends anything, so the
// other ranks fail that collective by deadline and the Comm should be
// rebuilt. A call whose context has already ended
// does take its sequence number and aborts the peers at once.
//
// Close stops the Comm's goroutines; it does not close the transport, which
// the caller owns.
type Comm struct {
	t       transport.Transport
	cfg     Config
	members []transport.PeerID
	log     zerolog.Logger

	mu          sync.Mutex // held for a whole collective
	seq         uint64
	started     atomic.Uint64 // seq, for Started
	under       underWay      // the collective in progress, for stall reports
	reporting   atomic.Bool   // a stall report's OnStall is running
	bw          float64       // bytes per second, for deadlines
	plans       planCache
	scratch     []byte
	sendScratch []uint16     // compressed sends
	recvScratch []uint16     // compressed receives
	image       []uint16     // a compressed ring collective's wire image
	dirty       []bool       // per rank: leftovers of a failed collective may be queued
	toldStale   []uint64     // per rank: 1 + the seq in which it was told it is stale
	silent      atomic.Int32 // the member the watchdog found silent
	op          op
	ctx         *opCtx
	sendBuffer  int  // transport.SendBufferer's, 0 if it has none: then no collective runs inline
	inlineCap   int  // bytes per peer above which no collective runs inline, after a stall (handedOff)
	handoffs    int  // inline collectives whose receives moved to the second walker
	clean       bool // the last collective succeeded: no leftovers may fill the send buffers
	shut        bool
	// tune is the cost model and the size from which allreduce runs the
	// ring; autoSmall says the size follows the model (SmallBytes 0).
	tune      atomic.Pointer[tuning]
	autoSmall bool
	// poll is SetPoll's duration; pollCtx is the view pollView with
	// transport.WithPoll, nil for none (useView). pollAll extends it to
	// every collective's receives (SetPollAll).
	poll     time.Duration
	pollCtx  context.Context
	pollView *opView
	pollAll  bool

	sendc   chan struct{} // starts the send walker on op
	sendFin chan struct{} // the send walker finished
	// timer ends a collective at its timeout (onTimer).
	timer *time.Timer
	born  time.Time     // the clock op.deadline counts from
	quit  chan struct{} // closed by Close under mu: goroutines exit
	once  sync.Once
	wg    sync.WaitGroup
}

// NewComm returns a communicator for cfg over t. The caller has already
// connected t to every other member: which of them a rank sends data to
// depends on the algorithm (the ring's right neighbour, recursive
// doubling's partners), and abort markers go to all of them. It starts a
// goroutine, and one more with Liveness or a transport.SendBufferer,
// which Close stops.
func NewComm(t transport.Transport, cfg Config) (*Comm, error) {
	if t == nil {
		return nil, invalid("nil transport")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	autoSmall := cfg.SmallBytes == 0
	cfg = cfg.withDefaults()
	n := len(cfg.Members)
	c := &Comm{
		autoSmall: autoSmall,
		t:         t,
		cfg:       cfg,
		members:   cfg.Members,
		plans:     planCache{order: cfg.Order},
		log:       cfg.Logger.With().Str("component", "ring").Uint64("epoch", cfg.Epoch).Int("rank", cfg.Rank).Logger(),
		bw:        max(cfg.InitialBandwidth, minBandwidth),
		dirty:     make([]bool, n),
		toldStale: make([]uint64, n),
		ctx:       newOpCtx(),
		sendc:     make(chan struct{}),
		sendFin:   make(chan struct{}, 1),
		quit:      make(chan struct{}),
	}
	// A new Comm may share its transport with an older one that failed, so
	// every peer may have leftovers queued until proven otherwise.
	for i := range c.dirty {
		c.dirty[i] = true
	}
	if sb, ok := t.(transport.SendBufferer); ok {
		c.sendBuffer = max(sb.SendBuffer(), 0)
	}
	c.tune.Store(&tuning{model: DefaultCostModel, small: cfg.SmallBytes})
	c.inlineCap = math.MaxInt
	c.op = op{c: c, sendsDone: make(chan struct{}, 1), sendWake: make(chan struct{}, 1), recvWake: make(chan struct{}, 1)}
	c.born = time.Now()
	c.timer = time.AfterFunc(time.Hour, c.onTimer)
	c.timer.Stop()
	c.wg.Add(1)
	go c.sender()
	if cfg.Liveness != nil || c.sendBuffer > 0 || c.reportsStalls() {
		c.wg.Add(1)
		go c.watchdog()
	}
	return c, nil
}

// Started returns how many collectives this Comm has begun: the sequence
// number of the latest. Every rank begins the same collectives in the same
// order, so a rank whose count is lower has not yet reached the
// collective this one is in. It does not wait.
func (c *Comm) Started() uint64 { return c.started.Load() }

// Rank returns this worker's rank.
func (c *Comm) Rank() int { return c.cfg.Rank }

// Size returns the number of members.
func (c *Comm) Size() int { return len(c.members) }

// Order returns the ring order, nil for rank order (RankOrder). It waits
// for a collective in flight to end.
func (c *Comm) Order() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.plans.order)
}

// SetOrder changes the ring order (Config.Order) for the collectives that
// follow. Every member must make the same change between the same two
// collectives, as every member runs the same collectives: a worker does it
// at an iteration boundary, where none is in flight.
func (c *Comm) SetOrder(order []int) error {
	if err := checkOrder(order, len(c.members)); err != nil {
		return err
	}
	if err := c.lock(); err != nil {
		return err
	}
	defer c.mu.Unlock()
	c.plans = planCache{order: slices.Clone(order), groups: c.plans.groups}
	return nil
}

// SetChunk makes bytes the pipeline chunk size (Config.ChunkBytes) of
// the collectives that follow; 0 means DefaultChunkBytes. Every member
// must make the same change between the same two collectives, as for
// SetOrder: a collective whose chunk sizes differ fails with ErrMismatch.
func (c *Comm) SetChunk(bytes int) error {
	if bytes < 0 || bytes > maxChunkBytes {
		return invalid("chunk size %d bytes not in [0, %d]", bytes, maxChunkBytes)
	}
	if err := c.lock(); err != nil {
		return err
	}
	defer c.mu.Unlock()
	c.cfg.ChunkBytes = cmp.Or(bytes, DefaultChunkBytes)
	return nil
}

// ChunkBytes returns the pipeline chunk size in bytes.
func (c *Comm) ChunkBytes() int {
	if err := c.lock(); err != nil {
		return c.cfg.ChunkBytes
	}
	defer c.mu.Unlock()
	return c.cfg.ChunkBytes
}

// checkOrder checks that order is nil or a permutation of [0, n).
func checkOrder(order []int, n int) error {
	if order == nil {
		return nil
	}
	if len(order) != n {
		return invalid("ring order of %d ranks for %d members", len(order), n)
	}
	seen := make([]bool, n)
	for _, r := range order {
		if r < 0 || r >= n || seen[r] {
			return invalid("ring order %v is not a permutation of the ranks", order)
		}
		seen[r] = true
	}
	return nil
}

// Close cancels the collective in progress, which fails with ErrClosed,
// and stops the Comm's goroutines. Later calls return ErrClosed. It is
// idempotent and does not close the transport.
func (c *Comm) Close() error {
	c.once.Do(func() {
		// Ends the collective in progress, and the Done channel the
		// transports may be watching.
		c.ctx.shutdown(ErrClosed)
		c.mu.Lock()
		c.shut = true
		close(c.quit)
		c.mu.Unlock()
		c.timer.Stop()
		c.wg.Wait()
	})
	return nil
}

// lock takes the collective mutex, or reports a closed Comm.
func (c *Comm) lock() error {
	c.mu.Lock()
	if c.shut {
		c.mu.Unlock()
		return ErrClosed
	}
	return nil
}

// elemSize returns the element size of dtype, and its kernels type if it
// can be reduced.
func elemSize(dtype wire.DType) (int, kernels.DType, error) {
	switch dtype {
	case wire.DTypeFloat32:
		return 4, kernels.Float32, nil
	case wire.DTypeFloat64:
		return 8, kernels.Float64, nil
	case wire.DTypeInt32:
		return 4, kernels.Int32, nil
	case wire.DTypeInt64:
		return 8, kernels.Int64, nil
	case wire.DTypeBytes, wire.DTypeBF16, wire.DTypeFP16:
		return dtype.Size(), 0, nil
	}
	return 0, 0, invalid("unknown dtype %v", dtype)
}

// checkData validates a buffer of dtype elements and returns its element
// size and length in elements.
func checkData(dtype wire.DType, data []byte) (es, length int, kdt kernels.DType, err error) {
	es, kdt, err = elemSize(dtype)
	if err != nil {
		return 0, 0, 0, err
	}
	if len(data)%es != 0 {
		return 0, 0, 0, invalid("%d bytes is not a whole number of %v", len(data), dtype)
	}
	if len(data) > 0 && uintptr(unsafe.Pointer(unsafe.SliceData(data)))%uintptr(es) != 0 {
		return 0, 0, 0, invalid("buffer not aligned for %v", dtype)
	}
	return es, len(data) / es, kdt, nil
}

// reduction maps a wire operator onto the kernels one, with the Avg scale.
func reduction(dtype wire.DType, kdt kernels.DType, wop wire.Op, n int) (kernels.Op, float64, error) {
	if kdt == 0 {
		return 0, 0, invalid("cannot reduce %v", dtype)
	}
	switch wop {
	case wire.OpSum:
		return kernels.OpSum, 0, nil
	case wire.OpMin:
		return kernels.OpMin, 0, nil
	case wire.OpMax:
		return kernels.OpMax, 0, nil
	case wire.OpAvg:
		if kdt != kernels.Float32 && kdt != kernels.Float64 {
			return 0, 0, invalid("avg of %v", dtype)
		}
		return kernels.OpSum, 1 / float64(n), nil
	}
	return 0, 0, invalid("unknown op %v", wop)
}

// chunkElems returns the pipeline chunk in elements of es bytes.
func (c *Comm) chunkElems(es int) int { return max(1, c.cfg.ChunkBytes/es) }

// AllReduceAlgo returns the algorithm an allreduce of bytes bytes runs:
// AlgoRecursiveDoubling below SmallBytes, else AlgoRing.
func (c *Comm) AllReduceAlgo(bytes int) Algo {
	return c.tune.Load().allReduceAlgo(len(c.members), bytes)
}

// allReduceAlgo is AllReduceAlgo under one tuning.
func (t *tuning) allReduceAlgo(n, bytes int) Algo {
	algo := Choose(n, bytes, t.small)
	if algo == AlgoRing && t.hier != nil && (t.hierAlways || t.hier.AllReduce(bytes) < t.model.Ring(n, bytes)) {
		return AlgoHierarchical
	}
	return algo
}

// PredictAllReduce returns the time in seconds the Comm's models predict
// for an uncompressed allreduce of bytes bytes, by the algorithm
// AllReduceAlgo picks.
func (c *Comm) PredictAllReduce(bytes int) float64 {
	t := c.tune.Load() // one load: SetHierarchy may run meanwhile
	if t.allReduceAlgo(len(c.members), bytes) == AlgoHierarchical {
		return t.hier.AllReduce(bytes)
	}
	return t.model.AllReduce(len(c.members), bytes, t.small)
}

// SmallBytes returns the allreduce size from which the ring runs
// (Config.SmallBytes after defaults, or the threshold of the model
// SetCostModel gave: 0 when the ring always runs).
func (c *Comm) SmallBytes() int { return c.tune.Load().small }

// AutoCompression returns the wire type of an allreduce of bytes float32
// bytes under automatic compression: bf16 where the Comm's cost model
// predicts it clearly faster, else none (CostModel.Compression). Every
// rank with the same model (SetCostModel) chooses alike.
func (c *Comm) AutoCompression(bytes int) wire.DType {
	t := c.tune.Load()
	return t.model.Compression(len(c.members), bytes, t.small)
}

// tuning is what SetCostModel and SetHierarchy set.
type tuning struct {
	model      CostModel
	small      int
	hier       *Hierarchy
	hierAlways bool
}

// CostModel returns the model the Comm predicts with: DefaultCostModel
// until SetCostModel gives another.
func (c *Comm) CostModel() CostModel { return c.tune.Load().model }

// SetCostModel makes m the Comm's cost model and, if Config.SmallBytes
// was 0, makes m.Threshold the size from which allreduce runs the ring.
// Every member must make the same change between the same two
// collectives, from the same measurements (FitCostModel), as for SetOrder:
// ranks that chose different algorithms fail with ErrMismatch.
func (c *Comm) SetCostModel(m CostModel) error {
	if err := m.Validate(); err != nil {
		return err
	}
	if err := c.lock(); err != nil {
		return err
	}
	defer c.mu.Unlock()
	t := *c.tune.Load()
	t.model = m
	if c.autoSmall {
		t.small = m.Threshold(len(c.members))
	}
	c.tune.Store(&t)
	return nil
}

// SetHierarchy lets allreduce run the hierarchical algorithm over h's
// machines (Hierarchical): always, from the size at which the ring would
// run, if always is set; otherwise where h's models predict it faster
// than the flat ring the Comm's cost model predicts (Hierarchy.AllReduce,
// CostModel.Ring). Compressed allreduces keep the flat ring. nil turns it
// off. Every member must make the same change between the same two
// collectives, as for SetCostModel.
func (c *Comm) SetHierarchy(h *Hierarchy, always bool) error {
	if err := h.validate(len(c.members)); err != nil {
		return err
	}
	if err := c.lock(); err != nil {
		return err
	}
	defer c.mu.Unlock()
	t := *c.tune.Load()
	t.hier, t.hierAlways = h, always && h != nil
	c.tune.Store(&t)
	c.plans = planCache{order: c.plans.order}
	if h != nil {
		c.plans.groups = h.Groups
	}
	return nil
}

// Hierarchy returns what SetHierarchy set: nil for none.
func (c *Comm) Hierarchy() *Hierarchy { return c.tune.Load().hier }

// SetPoll lets the receives of collectives small enough to run on the
// caller's goroutine poll the transport for up to d before they sleep
// (transport.WithPoll), from the next collective on; 0 turns it off.
// Polling saves the wake-up of an idle core, which on a virtual machine
// is most of a small allreduce's time, and costs the core: set it only
// where each rank has a core of its own.
func (c *Comm) SetPoll(d time.Duration) error {
	if err := c.lock(); err != nil {
		return err
	}
	defer c.mu.Unlock()
	c.poll, c.pollCtx, c.pollView = max(d, 0), nil, nil
	return nil
}

// SetPollAll makes the poll of SetPoll apply to the receives of every
// collective, not only of those small enough to run on the caller's
// goroutine, from the next collective on; false restores the default.
// It pays where a message's bytes follow each other within microseconds
// and a wake-up costs more than the copy, as over shared memory: there
// it took a 64 KiB allreduce of 2 ranks from 0.65 to 3.0-3.5 GB/s. Over
// a socket the polling core is the one the kernel copies with.
func (c *Comm) SetPollAll(all bool) error {
	if err := c.lock(); err != nil {
		return err
	}
	defer c.mu.Unlock()
	c.pollAll = all
	return nil
}

// useView gives o v, the op context's view for the collective just
// begun, and points pollCtx at it: a new view follows only a
// cancellation, so only then does this allocate.
func (c *Comm) useView(o *op, v *opView) {
	o.ctx = v
	if c.poll > 0 && c.pollView != o.ctx {
		c.pollCtx, c.pollView = transport.WithPoll(o.ctx, c.poll), o.ctx
	}
}

// AllReduce replaces data, a buffer of dtype elements, with the reduction
// by op of every member's data, in place. Every rank ends bit-identical.
// dtype is float32, float64, int32 or int64; op is Sum, Min, Max, or Avg
// for floats (the sum divided by the number of members, once per element).
// Buffers below SmallBytes run recursive doubling, others the pipelined
// ring. It blocks until the collective completes or fails (see Comm).
func (c *Comm) AllReduce(ctx context.Context, dtype wire.DType, wop wire.Op, data []byte) error {
	return c.AllReduceCompressed(ctx, dtype, wop, data, wire.DTypeBytes)
}

// AllReduceCompressed is AllReduce with the data compressed on the wire to
// wireType, wire.DTypeBF16 or wire.DTypeFP16, which halves the bytes sent;
// dtype must be float32. The zero wireType, wire.DTypeBytes, means no
// compression, as AllReduce. Any other combination is ErrInvalid. See Comm
// for the precision of the result.
func (c *Comm) AllReduceCompressed(ctx context.Context, dtype wire.DType, wop wire.Op, data []byte, wireType wire.DType) error {
	// The algorithm follows the caller's bytes, not the wire's, so a
	// compressed collective runs the plan of the uncompressed one.
	algo := c.AllReduceAlgo(len(data))
	if algo == AlgoHierarchical && wireType != wire.DTypeBytes {
		algo = AlgoRing // the hierarchy's phases do not forward wire images
	}
	return c.collective(ctx, planKey{algo: algo}, dtype, wop, data, wireType)
}

// ReduceScatter reduces every member's data by op, in place, leaving rank
// r's share of the result at Segments(len(data)/size, Size())[r] of its
// buffer; the rest of the buffer holds partial results. Types and
// operators are those of AllReduce.
func (c *Comm) ReduceScatter(ctx context.Context, dtype wire.DType, wop wire.Op, data []byte) error {
	return c.ReduceScatterCompressed(ctx, dtype, wop, data, wire.DTypeBytes)
}

// ReduceScatterCompressed is ReduceScatter with wire compression, as
// AllReduceCompressed.
func (c *Comm) ReduceScatterCompressed(ctx context.Context, dtype wire.DType, wop wire.Op, data []byte, wireType wire.DType) error {
	return c.collective(ctx, planKey{algo: AlgoRingReduceScatter}, dtype, wop, data, wireType)
}

// AllGather gathers in place: rank r contributes the elements at
// Segments(len(data)/size, Size())[r] of its buffer, and every rank ends
// with every rank's contribution at its place. For contributions of k
// elements each, data holds Size()·k elements. dtype may be any wire dtype.
func (c *Comm) AllGather(ctx context.Context, dtype wire.DType, data []byte) error {
	return c.collective(ctx, planKey{algo: AlgoRingAllGather}, dtype, wire.OpNone, data, wire.DTypeBytes)
}

// Broadcast copies root's data to every other rank, along a pipelined
// chain around the ring. dtype may be any wire dtype.
//
// The root is not carried in the headers as such: each message's Step is
// its sender's distance from the root, which the receiver checks against
// its own, so ranks that disagree about the root fail with ErrMismatch
// wherever a message crosses between them. Disagreements that make no
// message cross (every rank believing itself the root) go undetected.
func (c *Comm) Broadcast(ctx context.Context, root int, dtype wire.DType, data []byte) error {
	return c.collective(ctx, planKey{algo: AlgoRingBroadcast, root: root}, dtype, wire.OpNone, data, wire.DTypeBytes)
}

// Barrier returns once every member has entered it: a dissemination
// barrier of ⌈log2 n⌉ rounds of empty messages.
func (c *Comm) Barrier(ctx context.Context) error {
	return c.collective(ctx, planKey{algo: AlgoBarrier}, wire.DTypeBytes, wire.OpNone, nil, wire.DTypeBytes)
}

// collective is the body every collective shares: it checks data, the
// operator and the compression (wireType, DTypeBytes for none), takes the
// Comm, completes key (world size, rank, length and, for the pipelined
// algorithms, the chunk) and runs its plan.
func (c *Comm) collective(ctx context.Context, key planKey, dtype wire.DType, wop wire.Op, data []byte, wireType wire.DType) error {
	if c.cfg.Observer == nil {
		return c.runCollective(ctx, key, dtype, wop, data, wireType)
	}
	start := time.Now()
	err := c.runCollective(ctx, key, dtype, wop, data, wireType)
	c.cfg.Observer.Collective(CollectiveStats{Algo: key.algo, Bytes: len(data), Ranks: len(c.members), Wire: wireType,
		Duration: time.Since(start), Err: err})
	return err
}

func (c *Comm) runCollective(ctx context.Context, key planKey, dtype wire.DType, wop wire.Op, data []byte, wireType wire.DType) error {
	es, length, kdt, err := checkData(dtype, data)
	if err != nil {
		return err
	}
	var kop kernels.Op
	var scale float64
	reducing := false
	switch key.algo {
	case AlgoRing, AlgoRecursiveDoubling, AlgoRingReduceScatter, AlgoHierarchical:
		reducing = true
		if kop, scale, err = reduction(dtype, kdt, wop, len(c.members)); err != nil {
			return err
		}
	}
	cd, err := codecOf(wireType)
	if err != nil {
		return err
	}
	if cd != nil && (!reducing || dtype != wire.DTypeFloat32) {
		return invalid("%v compression of a %v %v", wireType, dtype, key.algo)
	}
	if err := c.lock(); err != nil {
		return err
	}
	defer c.mu.Unlock()
	key.n, key.rank, key.length = len(c.members), c.cfg.Rank, length
	switch key.algo {
	case AlgoRing, AlgoRingReduceScatter, AlgoRingAllGather, AlgoRingBroadcast, AlgoHierarchical:
		key.chunk = c.chunkElems(es)
	}
	e, err := c.plans.get(key)
	if err != nil {
		return err
	}
	c.op.kdt, c.op.kop, c.op.scale, c.op.codec = kdt, kop, scale, cd
	return c.lostPeer(c.run(ctx, e, dtype, wop, data, es, wireType))
}

// AllReduce is Comm.AllReduce on a typed buffer, viewed as bytes without a
// copy.
func AllReduce[T kernels.Number](ctx context.Context, c *Comm, op wire.Op, data []T) error {
	return c.AllReduce(ctx, wireDType[T](), op, kernels.Bytes(data))
}

// ReduceScatter is Comm.ReduceScatter on a typed buffer.
func ReduceScatter[T kernels.Number](ctx context.Context, c *Comm, op wire.Op, data []T) error {
	return c.ReduceScatter(ctx, wireDType[T](), op, kernels.Bytes(data))
}

// AllReduceCompressed is Comm.AllReduceCompressed on a float32 buffer.
func AllReduceCompressed(ctx context.Context, c *Comm, op wire.Op, data []float32, wireType wire.DType) error {
	return c.AllReduceCompressed(ctx, wire.DTypeFloat32, op, kernels.Bytes(data), wireType)
}

// ReduceScatterCompressed is Comm.ReduceScatterCompressed on a float32
// buffer.
func ReduceScatterCompressed(ctx context.Context, c *Comm, op wire.Op, data []float32, wireType wire.DType) error {
	return c.ReduceScatterCompressed(ctx, wire.DTypeFloat32, op, kernels.Bytes(data), wireType)
}

// AllGather is Comm.AllGather on a typed buffer.
func AllGather[T kernels.Number](ctx context.Context, c *Comm, data []T) error {
	return c.AllGather(ctx, wireDType[T](), kernels.Bytes(data))
}

// Broadcast is Comm.Broadcast on a typed buffer.
func Broadcast[T kernels.Number](ctx context.Context, c *Comm, root int, data []T) error {
	return c.Broadcast(ctx, root, wireDType[T](), kernels.Bytes(data))
}

// wireDType maps T onto its wire dtype by size and by whether 1/2
// truncates.
func wireDType[T kernels.Number]() wire.DType {
	var z T
	isFloat := T(1)/2 != 0
	switch {
	case unsafe.Sizeof(z) == 4 && isFloat:
		return wire.DTypeFloat32
	case unsafe.Sizeof(z) == 4:
		return wire.DTypeInt32
	case isFloat:
		return wire.DTypeFloat64
	}
	return wire.DTypeInt64
}

// planKey identifies a plan: every constructor is a pure function of it.
type planKey struct {
	algo                         Algo
	n, rank, root, length, chunk int
}

// planEntry is a cached plan and the scratch it needs.
type planEntry struct {
	plan Plan
	// maxRecv is the longest receive in elements: the scratch a receive
	// needs when it cannot go straight into the buffer.
	maxRecv int
	// maxSend is the longest send in elements: the scratch a compressed
	// send encodes into.
	maxSend int
	// peerSendElems and peerSendMsgs bound what the plan sends to any one
	// peer, in elements and messages: what must fit the transport's send
	// buffer for the plan to run inline.
	peerSendElems, peerSendMsgs int
	// forwards[i] says that compressed, send i forwards exactly the wire
	// values its receive left (the wire image, see compress.go), and
	// keeps[j] that receive j's wire values are forwarded so; nil where
	// no send forwards (recursive doubling, which rounds and reduces in
	// turn, and the barrier).
	forwards, keeps []bool
}

// planCache keeps the last few plans. A training loop reuses a handful of
// shapes (its buckets), so a small cache replaced round robin holds them
// all, and looking one up is a short linear scan.
type planCache struct {
	order   []int   // the ring order every ring plan follows
	groups  [][]int // the machines of hierarchical plans (SetHierarchy)
	keys    [planCacheSize]planKey
	entries [planCacheSize]*planEntry
	next    int
}

const planCacheSize = 16

func (pc *planCache) get(k planKey) (*planEntry, error) {
	for i := range pc.entries {
		if pc.entries[i] != nil && pc.keys[i] == k {
			return pc.entries[i], nil
		}
	}
	var p Plan
	var err error
	switch k.algo {
	case AlgoRing:
		p, err = ringAllReduce(pc.order, k.n, k.rank, k.length, k.chunk)
	case AlgoRecursiveDoubling:
		p, err = RecursiveDoubling(k.n, k.rank, k.length)
	case AlgoRingReduceScatter:
		p, err = ringReduceScatter(pc.order, k.n, k.rank, k.length, k.chunk)
	case AlgoRingAllGather:
		p, err = ringAllGather(pc.order, k.n, k.rank, k.length, k.chunk)
	case AlgoRingBroadcast:
		p, err = ringBroadcast(pc.order, k.n, k.rank, k.root, k.length, k.chunk)
	case AlgoBarrier:
		p, err = Barrier(k.n, k.rank)
	case AlgoHierarchical:
		if pc.groups == nil {
			return nil, invalid("a hierarchical allreduce without SetHierarchy")
		}
		p, err = Hierarchical(pc.groups, k.rank, k.length, k.chunk)
	default:
		err = fmt.Errorf("%w: algorithm %v", ErrInvalid, k.algo)
	}
	if err != nil {
		return nil, err
	}
	e := &planEntry{plan: p}
	for _, x := range p.Recvs {
		e.maxRecv = max(e.maxRecv, x.Len)
	}
	elems, msgs := map[int]int{}, map[int]int{}
	for _, x := range p.Sends {
		e.maxSend = max(e.maxSend, x.Len)
		elems[x.Peer] += x.Len
		msgs[x.Peer]++
		e.peerSendElems = max(e.peerSendElems, elems[x.Peer])
		e.peerSendMsgs = max(e.peerSendMsgs, msgs[x.Peer])
	}
	if k.algo != AlgoRecursiveDoubling && k.algo != AlgoBarrier && k.algo != AlgoHierarchical {
		e.forwards, e.keeps = forwardedImages(p)
	}
	pc.keys[pc.next], pc.entries[pc.next] = k, e
	pc.next = (pc.next + 1) % planCacheSize
	return e, nil
}
