package gyre

import (
	"cmp"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/secret"
	"github.com/gyre-ml/gyre/internal/wire"
)

// Transport names accepted by Config.Transport.
const (
	TransportQUIC = "quic"
	TransportTCP  = "tcp"
)

// Defaults for Config fields left at their zero value.
const (
	DefaultTransport = TransportQUIC
	DefaultListen    = "127.0.0.1:7946"
	DefaultStripes   = 1
	DefaultMaxFrame  = wire.DefaultMaxFrame
	// DefaultGlobalBatch is GlobalBatch's default.
	DefaultGlobalBatch = 256
	// DefaultJoinTimeout is JoinTimeout's default.
	DefaultJoinTimeout = 5 * time.Minute
	// DefaultConnectTimeout is ConnectTimeout's default.
	DefaultConnectTimeout = 30 * time.Second
	// DefaultCollectiveTimeout is CollectiveTimeout's default.
	DefaultCollectiveTimeout = 10 * time.Minute
	// DefaultStallThreshold is StallThreshold's default, unless half of
	// CollectiveTimeout is shorter.
	DefaultStallThreshold = time.Minute
	// DefaultPeerTimeout is PeerTimeout's default.
	DefaultPeerTimeout = 2 * time.Second
	// MinPeerTimeout bounds PeerTimeout from below: heartbeats go out four
	// times per PeerTimeout, and shorter silences are scheduling noise.
	MinPeerTimeout = 100 * time.Millisecond
	// MaxStripes bounds Stripes: past a few stripes per link the cores, not
	// the connections, are the limit.
	MaxStripes = 16
	// MaxView is the largest view. A welcome lists every member, and
	// its buffer is sized for this many.
	MaxView = 256
	// DefaultJob is Job's default.
	DefaultJob = "gyre"
	// DefaultCheckpointEvery is CheckpointEvery's default, with a
	// CheckpointDir.
	DefaultCheckpointEvery = 100
	// DefaultCheckpointKeep is CheckpointKeep's default.
	DefaultCheckpointKeep = 3
)

// Balance modes accepted by Config.Balance.
const (
	// BalanceLBBSP decides the shares at every boundary from the workers'
	// measured compute times (package balance).
	BalanceLBBSP = "lbbsp"
	// BalanceStatic keeps equal shares, or Config.Shares.
	BalanceStatic = "static"
)

// Ring orders accepted by Config.RingOrder.
const (
	// RingOrderAuto measures the links between the members of each new
	// view and orders the ring so that it crosses slow links as rarely as
	// it can (ring.ChooseOrder).
	RingOrderAuto = "auto"
	// RingOrderFixed keeps the view's order: members sorted by data
	// address.
	RingOrderFixed = "fixed"
)

// Allreduce algorithms accepted by Config.Algo.
const (
	// AlgoAuto runs recursive doubling below the size from which the
	// ring's cost model, measured by the view's link probes, predicts the
	// ring to be faster, the ring from there (ring.CostModel.Threshold).
	AlgoAuto = "auto"
	// AlgoRing always runs the pipelined ring.
	AlgoRing = "ring"
	// AlgoDoubling always runs recursive doubling.
	AlgoDoubling = "doubling"
)

// Gossip timing presets accepted by Config.GossipTiming.
const (
	GossipLAN   = "lan"
	GossipLocal = "local"
)

// ErrConfig is wrapped by every configuration error.
var ErrConfig = errors.New("gyre: invalid config")

// Config describes one worker. The zero value is usable: every field
// documents its default, which WithDefaults fills in.
type Config struct {
	// Name identifies the worker to its peers and in its certificate.
	// Default: the advertised data-plane address, or a random name when
	// that address has port 0 (the port is only known after binding) or
	// the worker is alone, with no address at all.
	Name string

	// Transport is the data-plane transport: "quic" (default) or "tcp"
	// (TLS 1.3 over TCP, the fast path for datacenter links).
	Transport string
	// Insecure switches the tcp transport to plain TCP with no encryption or
	// authentication. It is refused with quic, and logged as a warning.
	Insecure bool
	// Stripes is the number of connections per peer link, so one link can
	// use several cores. Default 1, at most MaxStripes.
	Stripes int
	// MaxFrame is the largest frame payload, in bytes, sent or accepted.
	// Default wire.DefaultMaxFrame (1 MiB).
	MaxFrame int

	// KeyFile is the path of the cluster secret written by `gyre keygen`.
	KeyFile string
	// Key is the hex-encoded cluster secret itself, an alternative to
	// KeyFile. A job of more than one worker needs exactly one of the
	// two, unless Insecure is set; a worker alone needs neither.
	Key string

	// Listen is the gossip address, host:port, which memberlist binds
	// (TCP and UDP) exactly: never 0.0.0.0. Setting it, or Seeds, turns
	// gossip membership on; with neither, a worker runs alone or in the
	// static view of Peers. Default with Seeds: "127.0.0.1:7946".
	Listen string
	// DataAddr is the data-plane listen address. Default: Listen's host
	// with Listen's port + 1 (port 0 stays 0: pick any free port).
	DataAddr string
	// Advertise is the host the others reach this worker at (NAT,
	// containers), for gossip and data plane alike; the ports are the
	// bound ones of Listen and DataAddr, since one address cannot carry
	// both. memberlist advertises Advertise with the gossip port, and the
	// node metadata carries Advertise with the data port. Default:
	// DataAddr's host.
	Advertise string
	// Job names the job in gossip: members of other jobs are ignored.
	// Default "gyre".
	Job string

	// Peers is the static view: every worker's advertised data address, in
	// rank order, as `gyre launch` (or an MPI-style launcher) passes it in
	// GYRE_PEERS (`gyre launch --static`). Empty means gossip membership
	// with Seeds or Listen, whose view is live, or else this worker alone:
	// a job of one, which talks to no one, so it binds no port and needs
	// no secret, and lone runs never collide.
	Peers []string
	// Rank is this worker's index in Peers. Default 0.
	Rank int
	// WorldSize is the number of workers. Default len(Peers); if set, it
	// must equal len(Peers), which catches launchers that disagree.
	WorldSize int
	// LocalRank is this worker's index among the workers on its host, for
	// choosing a device. Default 0.
	LocalRank int
	// Seeds are gossip seed addresses (host:port) of any live members: a
	// worker with Seeds joins the job through them and waits, pending,
	// until a boundary admits it into the view. A worker with Listen and
	// no Seeds starts a job. Seeds may name this worker too, so that
	// every worker is given one list: a worker leaves its own address
	// out, and the first seed's worker starts the job unless another
	// seed is in a running one (docs/deploy.md). Seeds excludes Peers, Rank, WorldSize and
	// Shares, which the view decides.
	Seeds []string
	// MinWorkers is how many workers must be in the view before iteration
	// 0 starts; later leaves may shrink the view below it. Default: 1 with
	// gossip, WorldSize in the static view (which needs every peer anyway).
	MinWorkers int
	// MaxWorkers caps the view; joiners beyond it stay pending. Default
	// and upper bound MaxView.
	MaxWorkers int
	// GossipTiming is memberlist's timing preset: "lan" (default) or
	// "local" (one machine: faster probes and suspicion).
	GossipTiming string
	// GossipProbeInterval and GossipSuspicionMult, if set, override the
	// preset: how often a node probes another, and how many probe
	// intervals a suspected node has to refute it. Loaded machines relax
	// them so that a busy worker is not declared dead by gossip.
	GossipProbeInterval time.Duration
	GossipSuspicionMult int

	// JoinTimeout bounds how long Join waits: for the seeds to answer, for
	// a boundary to admit this worker, for MinWorkers, for the static
	// view's peers. Default 5 minutes; Join's context may end it sooner.
	JoinTimeout time.Duration
	// ConnectTimeout bounds the connects of a view change: a member
	// dialling a joiner to welcome it, and every member of the new view
	// dialling the others. A joiner is admitted only once every member
	// has reached it, so these take milliseconds; the bound keeps a
	// joiner that became unreachable since from holding up the job.
	// Default 30 s.
	ConnectTimeout time.Duration
	// CollectiveTimeout is how long a collective waits for peers that are
	// alive but late: a GC pause, evaluation or a checkpoint on one rank, a
	// slow data loader, a straggler. Late is not dead: a peer whose process
	// still answers heartbeats is waited for this long, after which the
	// collective fails with a ring.TimeoutError naming it, and in a gossip
	// view the others recover without it (it rejoins as a new member).
	// Default 10 minutes.
	CollectiveTimeout time.Duration
	// PeerTimeout is how long a peer may stay silent (no heartbeat, which
	// workers send four times per PeerTimeout on a channel of their own)
	// before it is declared gone: killed, stopped (SIGSTOP) or cut off.
	// The collective then fails on every survivor with an error matching
	// transport.ErrPeerGone that names the peer. Default 2 s, at least
	// 100 ms.
	PeerTimeout time.Duration
	// Failpoint, for tests of recovery only, makes the worker die at a
	// named step of its protocols, as kill -9 would: "vote",
	// "send-state", "recv-state", "propose", "install", "probe" or
	// "checkpoint", optionally with "@ITER", the first iteration at which
	// it may (see FailVote and the others), and for "checkpoint" with
	// ":BYTES", how much of the checkpoint's file is written first.
	// Never set it in a real job.
	Failpoint string
	// QuorumTimeout is how long a worker that lost touch with a majority
	// of its view waits, in Boundary, for the majority to come back or
	// to take it in, before Boundary fails with ErrNoQuorum. Gossip views
	// only: a static view fails at the first lost peer. Default:
	// JoinTimeout.
	QuorumTimeout time.Duration

	// GlobalBatch is B, the number of samples per iteration summed over all
	// workers. Default: the sum of Shares if set, else DefaultGlobalBatch.
	GlobalBatch int
	// Shares fixes each worker's share of GlobalBatch, in rank order
	// (static balance). They must sum to GlobalBatch. Default: equal
	// shares, the remainder to the lowest ranks.
	Shares []int
	// Balance is how shares are decided: BalanceLBBSP (default) moves
	// samples from slow workers to fast ones at each boundary, from the
	// compute times every worker measures; BalanceStatic keeps equal
	// shares, for comparison. Shares implies BalanceStatic unless Balance
	// is given: with BalanceLBBSP they are the shares it starts from.
	Balance string
	// BalanceAllowZero lets balancing give a worker no samples at all;
	// by default every worker keeps at least 1.
	BalanceAllowZero bool
	// BytesPerSample is the device memory one sample of this worker's
	// batch takes (its activations and their gradients), for balancing
	// on a GPU: the share is capped at the device's headroom over it (see
	// WithDevice). 0: no memory cap, the CPU case.
	BytesPerSample int64
	// RingOrder is how the ring is ordered: RingOrderAuto (default) probes
	// the links of every view of 4 or more workers, a few MiB per pair,
	// and orders the ring to cross slow links rarely; RingOrderFixed keeps
	// address order.
	RingOrder string
	// Algo is the allreduce algorithm: AlgoAuto (default) chooses by
	// size, from a cost model fitted to what every view's link probes
	// measured (View.CostModel, View.SmallBytes); AlgoRing or
	// AlgoDoubling pins one and probes nothing for it, so that the sums run in
	// the same order whatever the sizes and the model say (the result is
	// bit-identical on every rank either way; pinning keeps it so from
	// one run to the next).
	Algo string
	// RNGSeed seeds the sampler's per-epoch permutations. Default 0.
	RNGSeed uint64
	// DatasetSize is the number of samples in one epoch of the training
	// set. Default 0: an unbounded stream in which position p is sample p.
	DatasetSize int64
	// BucketBytes is the gradient bucket size: submitted gradients are
	// fused until a bucket holds this many bytes, then it is sent while
	// backward continues. Default 25 MiB, as in PyTorch DDP; smaller
	// buckets start communication earlier for small models.
	BucketBytes int
	// Compress sends float32 gradients over the wire as "bf16" or "fp16",
	// halving the bytes; the sums still accumulate in float32, and every
	// worker ends with the same values, rounded to the wire format. Every
	// worker must use the same setting. Default "" (none); "none" also
	// means none. CompressAuto sends a bucket as bf16 only where the
	// view's measured cost model predicts it clearly faster (a link much
	// slower than the encoder), the same choice on every worker; on
	// loopback or a fast LAN it sends float32.
	Compress string

	// CheckpointDir, if set, is the directory this worker writes
	// checkpoints of the committed state into, and resumes from
	// (docs/checkpoints.md). Workers may share one directory: only one of
	// them then writes each checkpoint.
	CheckpointDir string
	// CheckpointEvery is K: a checkpoint is taken at every Commit whose
	// iteration is a multiple of K. Default with CheckpointDir:
	// DefaultCheckpointEvery.
	CheckpointEvery int
	// CheckpointKeep is how many of the newest checkpoints the directory
	// keeps; older ones are removed. Default DefaultCheckpointKeep.
	CheckpointKeep int
	// CheckpointRequired makes a checkpoint that could not be written end
	// the job: every worker's next Boundary returns ErrCheckpoint. By
	// default the failure is logged and training goes on.
	CheckpointRequired bool

	// Logger receives the runtime's structured logs, each line with the
	// worker's id and its current rank. Default (nil): warnings and errors
	// on stderr, human-readable, so that a worker that cannot reach its
	// seed or a peer says so at once. To see everything, pass a logger at
	// info or debug level; to silence the runtime:
	//
	//	quiet := zerolog.Nop()
	//	cfg.Logger = &quiet
	Logger *zerolog.Logger

	// Observer, if set, is told of every collective on the data channel
	// and every iteration boundary (see Observer). It is called on the
	// runtime's goroutines and must not block.
	Observer Observer
	// MetricsAddr, if set, is a host:port on which the worker serves
	// Prometheus metrics at /metrics, a status page at / and the same as
	// JSON at /status.json, over HTTP, plain and unauthenticated:
	// bind it to an address only the monitoring network reaches. Port 0
	// picks a free one (Worker.MetricsAddr says which). A port in use
	// fails Join. The metrics are documented in docs/operations.md.
	MetricsAddr string
	// Timeline, if set, is a file the worker writes its Chrome trace-event
	// JSON into (Perfetto and chrome://tracing open it): the trainer's
	// spans, the boundaries, every collective, and instant events for view
	// changes, share changes and recoveries. It is complete once the
	// worker is closed.
	Timeline string
	// StallThreshold is how long a collective may wait before the worker
	// logs a stall report, and again after each further StallThreshold,
	// as Horovod's stall inspector does: the ranks that have not reached
	// the collective (every worker's heartbeats carry its progress) and
	// this worker's tensors still pending. Reports also reach the
	// timeline, the metrics and the status page. A stall is only
	// reported: the collective fails at CollectiveTimeout. Default: 60 s,
	// or half of CollectiveTimeout if that is shorter; negative turns
	// reports off.
	StallThreshold time.Duration
}

// logger returns Logger, or the default: warnings and errors on stderr.
func (c Config) logger() zerolog.Logger {
	if c.Logger != nil {
		return *c.Logger
	}
	return defaultLogger()
}

// WithDefaults returns a copy of c with every unset field at its default.
func (c Config) WithDefaults() Config {
	gossip := c.Gossip()
	addressless := c.lone() && c.DataAddr == ""
	if c.Transport == "" {
		c.Transport = DefaultTransport
	}
	if c.Stripes == 0 {
		c.Stripes = DefaultStripes
	}
	if c.MaxFrame == 0 {
		c.MaxFrame = DefaultMaxFrame
	}
	if c.Listen == "" && gossip {
		c.Listen = DefaultListen // Seeds without Listen
	}
	if c.DataAddr == "" {
		if c.Rank >= 0 && c.Rank < len(c.Peers) {
			c.DataAddr = c.Peers[c.Rank] // a launcher's view names this worker's address
		} else {
			c.DataAddr = nextPort(cmp.Or(c.Listen, DefaultListen))
		}
	}
	if c.Advertise == "" {
		c.Advertise, _, _ = net.SplitHostPort(c.DataAddr)
	}
	if c.Job == "" {
		c.Job = DefaultJob
	}
	if c.GossipTiming == "" {
		c.GossipTiming = GossipLAN
	}
	if c.WorldSize == 0 && !gossip {
		c.WorldSize = max(len(c.Peers), 1)
	}
	if c.MinWorkers == 0 {
		c.MinWorkers = max(c.WorldSize, 1)
	}
	if c.MaxWorkers == 0 {
		c.MaxWorkers = MaxView
	}
	if c.JoinTimeout == 0 {
		c.JoinTimeout = DefaultJoinTimeout
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.QuorumTimeout == 0 {
		c.QuorumTimeout = c.JoinTimeout
	}
	if c.CollectiveTimeout == 0 {
		c.CollectiveTimeout = DefaultCollectiveTimeout
	}
	if c.StallThreshold == 0 {
		c.StallThreshold = min(DefaultStallThreshold, c.CollectiveTimeout/2)
	}
	if c.CheckpointDir != "" {
		c.CheckpointEvery = cmp.Or(c.CheckpointEvery, DefaultCheckpointEvery)
		c.CheckpointKeep = cmp.Or(c.CheckpointKeep, DefaultCheckpointKeep)
	}
	if c.PeerTimeout == 0 {
		c.PeerTimeout = DefaultPeerTimeout
	}
	if c.Balance == "" {
		c.Balance = BalanceLBBSP
		if len(c.Shares) > 0 {
			c.Balance = BalanceStatic
		}
	}
	if c.Algo == "" {
		c.Algo = AlgoAuto
	}
	if c.RingOrder == "" {
		c.RingOrder = RingOrderAuto
	}
	if c.GlobalBatch == 0 {
		c.GlobalBatch = DefaultGlobalBatch
		if len(c.Shares) > 0 {
			c.GlobalBatch = 0
			for _, s := range c.Shares {
				c.GlobalBatch += s
			}
		}
	}
	if c.Shares == nil && c.WorldSize > 0 {
		c.Shares = EqualShares(c.GlobalBatch, c.WorldSize)
	}
	if c.Name == "" {
		c.Name = c.AdvertisedData()
		if _, port, err := net.SplitHostPort(c.DataAddr); err == nil && port == "0" || addressless {
			c.Name = "w-" + rand.Text()[:12] // no address to name it by yet, or ever
		}
	}
	return c
}

// Gossip reports whether c asks for gossip membership: Seeds, or a Listen
// address without a static view.
func (c Config) Gossip() bool { return len(c.Seeds) > 0 || c.Listen != "" && len(c.Peers) == 0 }

// AdvertisedData is the data-plane address the others use: Advertise with
// DataAddr's port (0 until the transport has bound it).
func (c Config) AdvertisedData() string {
	_, port, err := net.SplitHostPort(c.DataAddr)
	if err != nil || c.Advertise == "" {
		return c.DataAddr
	}
	return net.JoinHostPort(c.Advertise, port)
}

// nextPort returns addr with its port incremented, or addr unchanged if it
// cannot be parsed (Validate reports that) or its port is 0.
func nextPort(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	p, err := strconv.Atoi(port)
	if err != nil || p == 0 {
		return addr
	}
	return net.JoinHostPort(host, strconv.Itoa(p+1))
}

// Validate checks c after filling defaults. Each error wraps ErrConfig and
// names the field at fault; all faults are reported together.
func (c Config) Validate() error { return c.validate(true) }

// validate is Validate; needSecret is false when the caller brings its own
// transport, and with it its own credentials.
func (c Config) validate(needSecret bool) error {
	raw := c
	c = c.WithDefaults()
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrConfig}, args...)...))
	}
	switch c.Transport {
	case TransportQUIC:
		if c.Insecure {
			bad("Insecure is only available with the tcp transport; quic is always encrypted")
		}
	case TransportTCP:
	default:
		bad("Transport %q: want %q or %q", c.Transport, TransportQUIC, TransportTCP)
	}
	if c.Stripes < 1 || c.Stripes > MaxStripes {
		bad("Stripes %d: want 1 to %d", c.Stripes, MaxStripes)
	}
	if c.MaxFrame < 4<<10 || c.MaxFrame > 64<<20 {
		bad("MaxFrame %d: want 4 KiB to 64 MiB", c.MaxFrame)
	}
	if c.Key != "" && c.KeyFile != "" {
		bad("give KeyFile or Key, not both")
	}
	if needSecret && !c.hasSecret() && len(c.Peers) > 0 { // checkGossip says it for gossip; a lone worker needs none
		bad("%v", errNoSecret)
	}
	if c.Key != "" {
		if _, err := secret.Parse(c.Key); err != nil {
			bad("Key: %v", err)
		}
	}
	// A field derived from a bad one is not reported: only the root cause.
	listenErr := checkHostPort(c.Listen)
	if c.Listen != "" && listenErr != nil {
		bad("Listen %q: %v", c.Listen, listenErr)
	}
	dataErr := checkHostPort(c.DataAddr)
	if dataErr != nil && (raw.DataAddr != "" || !c.dataAddrFromBad(listenErr)) {
		bad("DataAddr %q: %v", c.DataAddr, dataErr)
	}
	if strings.Contains(c.Advertise, ":") && net.ParseIP(c.Advertise) == nil || c.Advertise == "" {
		if raw.Advertise != "" || dataErr == nil {
			bad("Advertise %q: want a host only, such as 10.0.0.5; the ports follow Listen and DataAddr", c.Advertise)
		}
	}
	if len(c.Name) > wire.MaxPeerID {
		bad("Name is %d bytes, at most %d", len(c.Name), wire.MaxPeerID)
	}
	if c.LocalRank < 0 {
		bad("LocalRank %d is negative", c.LocalRank)
	}
	if !c.Gossip() {
		for _, err := range c.checkView() {
			bad("%v", err)
		}
	}
	for _, err := range c.checkBatch(len(raw.Shares) > 0) {
		bad("%v", err)
	}
	return errors.Join(errs...)
}

// checkView checks the static view: ranks in range, sizes that agree, and
// peer addresses that are distinct, complete and include this worker's.
func (c Config) checkView() []error {
	var errs []error
	if len(c.Peers) == 0 {
		if c.Rank != 0 || c.WorldSize != 1 {
			errs = append(errs, fmt.Errorf("Rank %d of WorldSize %d needs Peers, the address of every rank", c.Rank, c.WorldSize))
		}
		return errs
	}
	if c.WorldSize != len(c.Peers) {
		errs = append(errs, fmt.Errorf("WorldSize %d but Peers lists %d addresses", c.WorldSize, len(c.Peers)))
	}
	if c.Rank < 0 || c.Rank >= len(c.Peers) {
		return append(errs, fmt.Errorf("Rank %d outside Peers [0, %d)", c.Rank, len(c.Peers)))
	}
	seen := make(map[string]int, len(c.Peers))
	for i, p := range c.Peers {
		if err := checkHostPort(p); err != nil {
			errs = append(errs, fmt.Errorf("Peers[%d] %q: %v", i, p, err))
		} else if _, port, _ := net.SplitHostPort(p); port == "0" {
			errs = append(errs, fmt.Errorf("Peers[%d] %q: a peer address needs a real port", i, p))
		}
		if j, dup := seen[p]; dup {
			errs = append(errs, fmt.Errorf("Peers[%d] and Peers[%d] are both %q", j, i, p))
		}
		seen[p] = i
	}
	if adv := c.AdvertisedData(); c.Peers[c.Rank] != adv {
		errs = append(errs, fmt.Errorf("Peers[%d] is %q but this worker advertises %q", c.Rank, c.Peers[c.Rank], adv))
	}
	return errs
}

// CompressAuto is Config.Compress's choice by the cost model.
const CompressAuto = "auto"

// compressions maps Config.Compress onto wire types; DTypeBytes is none,
// and CompressAuto chooses per bucket.
var compressions = map[string]wire.DType{"": wire.DTypeBytes, "none": wire.DTypeBytes,
	"bf16": wire.DTypeBF16, "fp16": wire.DTypeFP16, CompressAuto: wire.DTypeBytes}

// dataAddrFromBad reports whether the defaulted DataAddr came from an
// address that is reported bad itself: Listen (listenErr) or this rank's
// entry of Peers.
func (c Config) dataAddrFromBad(listenErr error) bool {
	if c.Rank >= 0 && c.Rank < len(c.Peers) {
		return checkHostPort(c.Peers[c.Rank]) != nil
	}
	return c.Listen != "" && listenErr != nil
}

// checkBatch checks the membership and batch fields; userShares says
// whether Shares were given rather than derived from GlobalBatch, whose
// own check then covers them.
func (c Config) checkBatch(userShares bool) []error {
	var errs []error
	if c.MaxWorkers < 1 || c.MaxWorkers > MaxView {
		errs = append(errs, fmt.Errorf("MaxWorkers %d: want 1 to %d", c.MaxWorkers, MaxView))
	}
	if c.Balance != BalanceLBBSP && c.Balance != BalanceStatic {
		errs = append(errs, fmt.Errorf("Balance %q: want %q or %q", c.Balance, BalanceLBBSP, BalanceStatic))
	}
	if c.BytesPerSample < 0 {
		errs = append(errs, fmt.Errorf("BytesPerSample %d: want 0 (no memory cap) or more", c.BytesPerSample))
	}
	if c.RingOrder != RingOrderAuto && c.RingOrder != RingOrderFixed {
		errs = append(errs, fmt.Errorf("RingOrder %q: want %q or %q", c.RingOrder, RingOrderAuto, RingOrderFixed))
	}
	if c.Algo != AlgoAuto && c.Algo != AlgoRing && c.Algo != AlgoDoubling {
		errs = append(errs, fmt.Errorf("Algo %q: want %q, %q or %q", c.Algo, AlgoAuto, AlgoRing, AlgoDoubling))
	}
	if c.GossipTiming != GossipLAN && c.GossipTiming != GossipLocal {
		errs = append(errs, fmt.Errorf("GossipTiming %q: want %q or %q", c.GossipTiming, GossipLAN, GossipLocal))
	}
	if c.GossipProbeInterval < 0 || c.GossipSuspicionMult < 0 {
		errs = append(errs, fmt.Errorf("GossipProbeInterval %v and GossipSuspicionMult %d may not be negative", c.GossipProbeInterval, c.GossipSuspicionMult))
	}
	if c.JoinTimeout < 0 {
		errs = append(errs, fmt.Errorf("JoinTimeout %v is negative", c.JoinTimeout))
	}
	if c.ConnectTimeout < 0 {
		errs = append(errs, fmt.Errorf("ConnectTimeout %v is negative", c.ConnectTimeout))
	}
	if _, err := parseFailpoint(c.Failpoint); err != nil {
		errs = append(errs, err)
	}
	if c.QuorumTimeout < 0 {
		errs = append(errs, fmt.Errorf("QuorumTimeout %v is negative", c.QuorumTimeout))
	}
	switch {
	case c.CheckpointEvery < 0:
		errs = append(errs, fmt.Errorf("CheckpointEvery %d is negative", c.CheckpointEvery))
	case c.CheckpointKeep < 0:
		errs = append(errs, fmt.Errorf("CheckpointKeep %d is negative", c.CheckpointKeep))
	case c.CheckpointDir == "" && (c.CheckpointEvery > 0 || c.CheckpointRequired):
		errs = append(errs, errors.New("CheckpointEvery or CheckpointRequired without CheckpointDir (--checkpoint-dir): where would the checkpoints go?"))
	}
	if c.CollectiveTimeout < 0 {
		errs = append(errs, fmt.Errorf("CollectiveTimeout %v is negative", c.CollectiveTimeout))
	}
	if c.PeerTimeout < MinPeerTimeout {
		errs = append(errs, fmt.Errorf("PeerTimeout %v: want at least %v", c.PeerTimeout, MinPeerTimeout))
	}
	if _, ok := compressions[c.Compress]; !ok {
		errs = append(errs, fmt.Errorf("Compress %q: want bf16, fp16, auto or none", c.Compress))
	}
	if c.BucketBytes < 0 {
		errs = append(errs, fmt.Errorf("BucketBytes %d is negative", c.BucketBytes))
	}
	if c.DatasetSize < 0 {
		errs = append(errs, fmt.Errorf("DatasetSize %d is negative", c.DatasetSize))
	}
	if c.Gossip() {
		return append(errs, c.checkGossip()...)
	}
	if c.MinWorkers < 1 || c.MinWorkers > c.WorldSize {
		errs = append(errs, fmt.Errorf("MinWorkers %d: want 1 to WorldSize %d (the static view needs every peer)", c.MinWorkers, c.WorldSize))
	}
	if c.GlobalBatch < 1 {
		errs = append(errs, fmt.Errorf("GlobalBatch %d: want at least 1", c.GlobalBatch))
	}
	if !userShares {
		return errs
	}
	if len(c.Shares) != c.WorldSize {
		return append(errs, fmt.Errorf("Shares lists %d workers, WorldSize is %d", len(c.Shares), c.WorldSize))
	}
	sum := 0
	for r, s := range c.Shares {
		if s < 0 {
			errs = append(errs, fmt.Errorf("Shares[%d] = %d is negative", r, s))
		}
		sum += s
	}
	if sum != c.GlobalBatch {
		errs = append(errs, fmt.Errorf("Shares sum to %d, GlobalBatch is %d", sum, c.GlobalBatch))
	}
	return errs
}

// checkGossip checks the fields of gossip membership, where the view, and
// with it ranks and shares, is decided at run time.
func (c Config) checkGossip() []error {
	var errs []error
	for _, f := range []struct {
		name string
		set  bool
	}{{"Peers", len(c.Peers) > 0}, {"Rank", c.Rank != 0}, {"WorldSize", c.WorldSize != 0}, {"Shares", len(c.Shares) > 0}} {
		if f.set {
			errs = append(errs, fmt.Errorf("%s cannot be given with Seeds: the membership view decides it", f.name))
		}
	}
	if c.Key == "" && c.KeyFile == "" {
		errs = append(errs, errors.New("gossip needs the cluster secret, which encrypts it, even with Insecure: "+
			"set KeyFile (gyre keygen --out FILE, then --key-file) or Key; every worker of the job uses the same one"))
	}
	for i, s := range c.Seeds {
		if err := checkHostPort(s); err != nil {
			errs = append(errs, fmt.Errorf("Seeds[%d] %q: %v", i, s, err))
		}
	}
	if c.MinWorkers < 1 || c.MinWorkers > c.MaxWorkers {
		errs = append(errs, fmt.Errorf("MinWorkers %d: want 1 to MaxWorkers %d", c.MinWorkers, c.MaxWorkers))
	}
	if c.GlobalBatch < c.MinWorkers {
		errs = append(errs, fmt.Errorf("GlobalBatch %d is smaller than MinWorkers %d: every worker needs a sample", c.GlobalBatch, c.MinWorkers))
	}
	return errs
}

func checkHostPort(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if host == "" {
		return errors.New("missing host: bind an explicit address such as 127.0.0.1")
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("bad port %q", port)
	}
	return nil
}

// hasSecret reports whether c gives a cluster secret, or needs none.
func (c Config) hasSecret() bool { return c.Key != "" || c.KeyFile != "" || c.Insecure }

var errNoSecret = errors.New("a cluster secret is required: set KeyFile (gyre keygen --out FILE) or Key")

// lone reports whether c is a job of one: no static view, no gossip.
func (c Config) lone() bool { return len(c.Peers) == 0 && !c.Gossip() }

// Secret loads the cluster secret from Key or KeyFile. It returns the zero
// Secret and no error when neither is set, which Validate allows only with
// Insecure.
func (c Config) Secret() (secret.Secret, error) {
	switch {
	case c.Key != "":
		return secret.Parse(c.Key)
	case c.KeyFile != "":
		return secret.Load(c.KeyFile)
	}
	return secret.Secret{}, nil
}

// Environment variables read by ConfigFromEnv.
const (
	EnvTransport  = "GYRE_TRANSPORT"
	EnvInsecure   = "GYRE_INSECURE"
	EnvStripes    = "GYRE_STRIPES"
	EnvKeyFile    = "GYRE_KEY_FILE"
	EnvKey        = "GYRE_KEY"
	EnvListen     = "GYRE_LISTEN"
	EnvDataAddr   = "GYRE_DATA_ADDR"
	EnvAdvertise  = "GYRE_ADVERTISE"
	EnvName       = "GYRE_NAME"
	EnvPeers      = "GYRE_PEERS" // comma-separated data addresses in rank order
	EnvRank       = "GYRE_RANK"
	EnvWorldSize  = "GYRE_WORLD_SIZE"
	EnvLocalRank  = "GYRE_LOCAL_RANK"
	EnvSeed       = "GYRE_SEED" // comma-separated gossip seed addresses
	EnvMinWorkers = "GYRE_MIN_WORKERS"
	EnvMaxWorkers = "GYRE_MAX_WORKERS"
	EnvJob        = "GYRE_JOB"
	// EnvGossipTiming is "lan" or "local"; EnvGossipProbeInterval a
	// duration; EnvGossipSuspicionMult an integer.
	EnvGossipTiming        = "GYRE_GOSSIP_TIMING"
	EnvGossipProbeInterval = "GYRE_GOSSIP_PROBE_INTERVAL"
	EnvGossipSuspicionMult = "GYRE_GOSSIP_SUSPICION_MULT"
	// EnvBalance is "lbbsp" or "static".
	EnvBalance = "GYRE_BALANCE"
	// EnvRingOrder is "auto" or "fixed".
	EnvRingOrder = "GYRE_RING_ORDER"
	// EnvAlgo is "auto", "ring" or "doubling".
	EnvAlgo = "GYRE_ALGO"
	// EnvCollectiveTimeout, EnvJoinTimeout, EnvConnectTimeout,
	// EnvQuorumTimeout, EnvPeerTimeout and EnvStallThreshold are
	// durations such as "10m" or "2s".
	EnvCollectiveTimeout = "GYRE_COLLECTIVE_TIMEOUT"
	EnvJoinTimeout       = "GYRE_JOIN_TIMEOUT"
	EnvConnectTimeout    = "GYRE_CONNECT_TIMEOUT"
	EnvQuorumTimeout     = "GYRE_QUORUM_TIMEOUT"
	EnvPeerTimeout       = "GYRE_PEER_TIMEOUT"
	EnvStallThreshold    = "GYRE_STALL_THRESHOLD"
	// EnvFailpoint is Config.Failpoint: for tests of recovery only.
	EnvFailpoint = "GYRE_FAILPOINT"
	// EnvCheckpointDir is a directory; EnvCheckpointEvery and
	// EnvCheckpointKeep integers; EnvCheckpointRequired true or false.
	EnvCheckpointDir      = "GYRE_CHECKPOINT_DIR"
	EnvCheckpointEvery    = "GYRE_CHECKPOINT_EVERY"
	EnvCheckpointKeep     = "GYRE_CHECKPOINT_KEEP"
	EnvCheckpointRequired = "GYRE_CHECKPOINT_REQUIRED"
	// EnvMetricsAddr is Config.MetricsAddr, host:port.
	EnvMetricsAddr = "GYRE_METRICS_ADDR"
	// EnvTimeline is Config.Timeline, a file.
	EnvTimeline = "GYRE_TIMELINE"
)

// ConfigFromEnv reads the GYRE_* variables through lookup (os.LookupEnv in
// main packages, a map in tests). Unset variables leave their fields zero,
// so defaults apply; a malformed value is an error naming the variable.
func ConfigFromEnv(lookup func(string) (string, bool)) (Config, error) {
	var c Config
	var errs []error
	str := func(name string, dst *string) {
		if v, ok := lookup(name); ok {
			*dst = strings.TrimSpace(v)
		}
	}
	str(EnvName, &c.Name)
	str(EnvTransport, &c.Transport)
	str(EnvKeyFile, &c.KeyFile)
	str(EnvKey, &c.Key)
	str(EnvListen, &c.Listen)
	str(EnvDataAddr, &c.DataAddr)
	str(EnvAdvertise, &c.Advertise)
	str(EnvJob, &c.Job)
	str(EnvGossipTiming, &c.GossipTiming)
	str(EnvBalance, &c.Balance)
	str(EnvRingOrder, &c.RingOrder)
	str(EnvAlgo, &c.Algo)
	str(EnvCheckpointDir, &c.CheckpointDir)
	str(EnvMetricsAddr, &c.MetricsAddr)
	str(EnvTimeline, &c.Timeline)
	boolean := func(name string, dst *bool) {
		if v, ok := lookup(name); ok && strings.TrimSpace(v) != "" {
			b, err := strconv.ParseBool(strings.TrimSpace(v))
			if err != nil {
				errs = append(errs, fmt.Errorf("%w: %s=%q: want true or false", ErrConfig, name, v))
			}
			*dst = b
		}
	}
	boolean(EnvInsecure, &c.Insecure)
	boolean(EnvCheckpointRequired, &c.CheckpointRequired)
	integer := func(name string, dst *int) {
		if v, ok := lookup(name); ok && strings.TrimSpace(v) != "" {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				errs = append(errs, fmt.Errorf("%w: %s=%q: want an integer", ErrConfig, name, v))
			}
			*dst = n
		}
	}
	integer(EnvStripes, &c.Stripes)
	integer(EnvRank, &c.Rank)
	integer(EnvWorldSize, &c.WorldSize)
	integer(EnvLocalRank, &c.LocalRank)
	integer(EnvMinWorkers, &c.MinWorkers)
	integer(EnvMaxWorkers, &c.MaxWorkers)
	integer(EnvGossipSuspicionMult, &c.GossipSuspicionMult)
	integer(EnvCheckpointEvery, &c.CheckpointEvery)
	integer(EnvCheckpointKeep, &c.CheckpointKeep)
	duration := func(name string, dst *time.Duration) {
		if v, ok := lookup(name); ok && strings.TrimSpace(v) != "" {
			d, err := time.ParseDuration(strings.TrimSpace(v))
			if err != nil {
				errs = append(errs, fmt.Errorf("%w: %s=%q: want a duration such as 30s or 10m", ErrConfig, name, v))
			}
			*dst = d
		}
	}
	duration(EnvCollectiveTimeout, &c.CollectiveTimeout)
	duration(EnvJoinTimeout, &c.JoinTimeout)
	duration(EnvConnectTimeout, &c.ConnectTimeout)
	duration(EnvQuorumTimeout, &c.QuorumTimeout)
	str(EnvFailpoint, &c.Failpoint)
	duration(EnvPeerTimeout, &c.PeerTimeout)
	duration(EnvStallThreshold, &c.StallThreshold)
	duration(EnvGossipProbeInterval, &c.GossipProbeInterval)
	if v, ok := lookup(EnvPeers); ok {
		c.Peers = splitList(v)
	}
	if l, err := loggerFromEnv(lookup); err != nil {
		errs = append(errs, err)
	} else if l != nil {
		c.Logger = l
	}
	if v, ok := lookup(EnvSeed); ok {
		c.Seeds = splitList(v)
	}
	return c, errors.Join(errs...)
}

// splitList splits a comma-separated list, trimming spaces and dropping
// empty items.
func splitList(v string) []string {
	var out []string
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// rankHook adds the worker's current rank to every log line, as a view
// change can move it; -1 (pending, or not joined yet) adds nothing.
type rankHook struct{ rank *atomic.Int64 }

func (h rankHook) Run(e *zerolog.Event, _ zerolog.Level, _ string) {
	if r := h.rank.Load(); r >= 0 {
		e.Int64("rank", r)
	}
}
