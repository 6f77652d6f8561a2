package gyre

import (
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/config"
	"github.com/gyre-ml/gyre/internal/secret"
)

// Transport names accepted by Config.Transport.
const (
	TransportQUIC = config.TransportQUIC
	TransportTCP  = config.TransportTCP
)

// Defaults for Config fields left at their zero value.
const (
	DefaultTransport = config.DefaultTransport
	DefaultListen    = config.DefaultListen
	DefaultStripes   = config.DefaultStripes
	// StripesAuto has the link probes choose Stripes (Config.Stripes).
	StripesAuto     = config.StripesAuto
	DefaultMaxFrame = config.DefaultMaxFrame
	// DefaultGlobalBatch is GlobalBatch's default.
	DefaultGlobalBatch = config.DefaultGlobalBatch
	// DefaultJoinTimeout is JoinTimeout's default.
	DefaultJoinTimeout = config.DefaultJoinTimeout
	// DefaultConnectTimeout is ConnectTimeout's default.
	DefaultConnectTimeout = config.DefaultConnectTimeout
	// DefaultCollectiveTimeout is CollectiveTimeout's default.
	DefaultCollectiveTimeout = config.DefaultCollectiveTimeout
	// DefaultStallThreshold is StallThreshold's default, unless half of
	// CollectiveTimeout is shorter.
	DefaultStallThreshold = config.DefaultStallThreshold
	// DefaultPeerTimeout is PeerTimeout's default.
	DefaultPeerTimeout = config.DefaultPeerTimeout
	// LaunchQuorumWaits is QuorumTimeout's default under gyre launch, in
	// PeerTimeouts (Config.Launcher).
	LaunchQuorumWaits = config.LaunchQuorumWaits
	// LauncherLaunch is Config.Launcher under gyre launch.
	LauncherLaunch = config.LauncherLaunch
	// MinPeerTimeout bounds PeerTimeout from below: heartbeats go out four
	// times per PeerTimeout, and shorter silences are scheduling noise.
	MinPeerTimeout = config.MinPeerTimeout
	// MaxStripes bounds Stripes: past a few stripes per link the cores, not
	// the connections, are the limit.
	MaxStripes = config.MaxStripes
	// MaxView is the largest view. A welcome lists every member, and
	// its buffer is sized for this many.
	MaxView = config.MaxView
	// DefaultJob is Job's default.
	DefaultJob = config.DefaultJob
	// DefaultCheckpointEvery is CheckpointEvery's default, with a
	// CheckpointDir.
	DefaultCheckpointEvery = config.DefaultCheckpointEvery
	// DefaultCheckpointKeep is CheckpointKeep's default.
	DefaultCheckpointKeep = config.DefaultCheckpointKeep
)

// Balance modes accepted by Config.Balance.
const (
	// BalanceLBBSP decides the shares at every boundary from the workers'
	// measured compute times (package balance).
	BalanceLBBSP = config.BalanceLBBSP
	// BalanceStatic keeps equal shares, or Config.Shares.
	BalanceStatic = config.BalanceStatic
)

// Shared-memory modes accepted by Config.SharedMemory.
const (
	// SharedMemoryAuto reaches peers on this machine, and in this network
	// namespace, through shared memory.
	SharedMemoryAuto = config.SharedMemoryAuto
	// SharedMemoryOff reaches every peer over the network transport.
	SharedMemoryOff = config.SharedMemoryOff
)

// Ring orders accepted by Config.RingOrder.
const (
	// RingOrderAuto measures the links between the members of each new
	// view and orders the ring so that it crosses slow links as rarely as
	// it can (ring.ChooseOrder).
	RingOrderAuto = config.RingOrderAuto
	// RingOrderFixed keeps the view's order: members sorted by data
	// address.
	RingOrderFixed = config.RingOrderFixed
)

// Allreduce algorithms accepted by Config.Algo.
const (
	// AlgoAuto runs recursive doubling below the size from which the
	// ring's cost model, measured by the view's link probes, predicts the
	// ring to be faster, the ring from there (ring.CostModel.Threshold),
	// or the hierarchical allreduce where the view spans several machines
	// of as many workers each and the models predict it faster
	// (ring.Hierarchy).
	AlgoAuto = config.AlgoAuto
	// AlgoRing always runs the pipelined ring.
	AlgoRing = config.AlgoRing
	// AlgoDoubling always runs recursive doubling.
	AlgoDoubling = config.AlgoDoubling
	// AlgoHierarchical runs the hierarchical allreduce (a reduce-scatter
	// inside each machine, an allreduce across machines, an allgather
	// inside each) wherever the ring would run and the view spans several
	// machines of as many workers each; the ring otherwise.
	AlgoHierarchical = config.AlgoHierarchical
)

// Gossip timing presets accepted by Config.GossipTiming.
const (
	GossipLAN   = config.GossipLAN
	GossipLocal = config.GossipLocal
)

// ErrConfig is wrapped by every configuration error.
var ErrConfig = config.ErrConfig

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
	// use several cores: at most MaxStripes, or StripesAuto (0, the
	// default), with which the link probes choose 1 or more per job, the
	// same on every rank. They stripe only where every rank has a core of
	// its own, and only if striped links make a large allreduce's ring at
	// least 10% faster. Shared-memory links are never striped.
	Stripes int
	// SharedMemory is how peers on this machine are reached:
	// SharedMemoryAuto (default) through shared memory, after the same
	// authentication as the network transport; SharedMemoryOff over the
	// network transport, as every other peer. "This machine" means the
	// same kernel and the same network namespace, so containers of one pod
	// share it and separate network namespaces do not.
	SharedMemory string
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
	// only: a static view fails at the first lost peer. A worker that
	// still hears a majority (their heartbeats) when it passes is not cut
	// off: its members are late to the rounds, and it waits for them up
	// to JoinTimeout from the failure. Default: JoinTimeout; under gyre
	// launch (Launcher) LaunchQuorumWaits times PeerTimeout, 10 s by
	// default.
	QuorumTimeout time.Duration
	// Launcher says what started this worker: "launch" (LauncherLaunch)
	// when gyre launch did, which sets GYRE_LAUNCHER; else empty. Launch
	// starts a lost worker again, if at all (--max-restarts), only as a
	// new member, so a worker cut off from its view's majority can never
	// get it back: it waits a short QuorumTimeout. Workers started by
	// hand or by a scheduler (Slurm, Kubernetes) may be cut off by a
	// partition that heals, so there the wait is long.
	Launcher string

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
	// measured (View.CostModel, View.SmallBytes); AlgoRing,
	// AlgoDoubling or AlgoHierarchical pins one (the last probes the links
	// to learn the machines), so that the sums run in
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

// WithDefaults returns a copy of c with every unset field at its default.
func (c Config) WithDefaults() Config { return Config(config.Config(c).WithDefaults()) }

// Gossip reports whether c asks for gossip membership: Seeds, or a Listen
// address without a static view.
func (c Config) Gossip() bool { return config.Config(c).Gossip() }

// AdvertisedData is the data-plane address the others use: Advertise with
// DataAddr's port (0 until the transport has bound it).
func (c Config) AdvertisedData() string { return config.Config(c).AdvertisedData() }

// Validate checks c after filling defaults. Each error wraps ErrConfig and
// names the field at fault; all faults are reported together.
func (c Config) Validate() error { return config.Config(c).Validate() }

// Secret loads the cluster secret from Key or KeyFile. It returns the zero
// Secret and no error when neither is set, which Validate allows only with
// Insecure.
func (c Config) Secret() (secret.Secret, error) { return config.Config(c).Secret() }

// CompressAuto is Config.Compress's choice by the cost model.
const CompressAuto = config.CompressAuto

// Environment variables read by ConfigFromEnv.
const (
	EnvTransport  = config.EnvTransport
	EnvInsecure   = config.EnvInsecure
	EnvStripes    = config.EnvStripes
	EnvKeyFile    = config.EnvKeyFile
	EnvKey        = config.EnvKey
	EnvListen     = config.EnvListen
	EnvDataAddr   = config.EnvDataAddr
	EnvAdvertise  = config.EnvAdvertise
	EnvName       = config.EnvName
	EnvPeers      = config.EnvPeers // comma-separated data addresses in rank order
	EnvRank       = config.EnvRank
	EnvWorldSize  = config.EnvWorldSize
	EnvLocalRank  = config.EnvLocalRank
	EnvSeed       = config.EnvSeed // comma-separated gossip seed addresses
	EnvMinWorkers = config.EnvMinWorkers
	EnvMaxWorkers = config.EnvMaxWorkers
	EnvJob        = config.EnvJob
	// EnvGossipTiming is "lan" or "local"; EnvGossipProbeInterval a
	// duration; EnvGossipSuspicionMult an integer.
	EnvGossipTiming        = config.EnvGossipTiming
	EnvGossipProbeInterval = config.EnvGossipProbeInterval
	EnvGossipSuspicionMult = config.EnvGossipSuspicionMult
	// EnvBalance is "lbbsp" or "static".
	EnvBalance = config.EnvBalance
	// EnvRingOrder is "auto" or "fixed".
	EnvRingOrder = config.EnvRingOrder
	// EnvSharedMemory is "auto" or "off".
	EnvSharedMemory = config.EnvSharedMemory
	// EnvAlgo is "auto", "ring" or "doubling".
	EnvAlgo = config.EnvAlgo
	// EnvCollectiveTimeout, EnvJoinTimeout, EnvConnectTimeout,
	// EnvQuorumTimeout, EnvPeerTimeout and EnvStallThreshold are
	// durations such as "10m" or "2s".
	EnvCollectiveTimeout = config.EnvCollectiveTimeout
	EnvJoinTimeout       = config.EnvJoinTimeout
	EnvConnectTimeout    = config.EnvConnectTimeout
	EnvQuorumTimeout     = config.EnvQuorumTimeout
	// EnvLauncher is Config.Launcher: "launch", set by gyre launch.
	EnvLauncher       = config.EnvLauncher
	EnvPeerTimeout    = config.EnvPeerTimeout
	EnvStallThreshold = config.EnvStallThreshold
	// EnvFailpoint is Config.Failpoint: for tests of recovery only.
	EnvFailpoint = config.EnvFailpoint
	// EnvCheckpointDir is a directory; EnvCheckpointEvery and
	// EnvCheckpointKeep integers; EnvCheckpointRequired true or false.
	EnvCheckpointDir      = config.EnvCheckpointDir
	EnvCheckpointEvery    = config.EnvCheckpointEvery
	EnvCheckpointKeep     = config.EnvCheckpointKeep
	EnvCheckpointRequired = config.EnvCheckpointRequired
	// EnvMetricsAddr is Config.MetricsAddr, host:port.
	EnvMetricsAddr = config.EnvMetricsAddr
	// EnvTimeline is Config.Timeline, a file.
	EnvTimeline = config.EnvTimeline
)

// ConfigFromEnv reads the GYRE_* variables through lookup (os.LookupEnv in
// main packages, a map in tests). Unset variables leave their fields zero,
// so defaults apply; a malformed value is an error naming the variable.
func ConfigFromEnv(lookup func(string) (string, bool)) (Config, error) {
	c, err := config.FromEnv(lookup)
	return Config(c), err
}
