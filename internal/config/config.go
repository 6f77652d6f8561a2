package config

import (
	"cmp"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/obs"
	"github.com/gyre-ml/gyre/internal/sampler"
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
	// DefaultStripes is Stripes's default: StripesAuto.
	DefaultStripes  = StripesAuto
	DefaultMaxFrame = wire.DefaultMaxFrame
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
	// LaunchQuorumWaits is QuorumTimeout's default under gyre launch, in
	// PeerTimeouts (Launcher).
	LaunchQuorumWaits = 5
	// MinPeerTimeout bounds PeerTimeout from below: heartbeats go out four
	// times per PeerTimeout, and shorter silences are scheduling noise.
	MinPeerTimeout = 100 * time.Millisecond
	// StripesAuto has the link probes choose each job's stripes, the
	// same on every rank: 1, or more where every rank has a core of its
	// own and striped links make the ring at least 10% faster.
	StripesAuto = 0
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

// Shared-memory modes accepted by Config.SharedMemory.
const (
	// SharedMemoryAuto reaches peers on this machine, and in this network
	// namespace, through shared memory.
	SharedMemoryAuto = "auto"
	// SharedMemoryOff reaches every peer over the network transport.
	SharedMemoryOff = "off"
)

// Ring orders accepted by Config.RingOrder.
const (
	// LauncherLaunch is Launcher under gyre launch.
	LauncherLaunch = "launch"
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
	// AlgoHierarchical runs the hierarchical allreduce wherever the ring
	// would run and the view spans several machines of as many workers
	// each, the ring otherwise.
	AlgoHierarchical = "hierarchical"
)

// Gossip timing presets accepted by Config.GossipTiming.
const (
	GossipLAN   = "lan"
	GossipLocal = "local"
)

// ErrConfig is wrapped by every configuration error.
var ErrConfig = errors.New("gyre: invalid config")

// Config describes one worker. The zero value is usable: every field
// Config is gyre.Config without its documentation, which gyre.Config
// carries field by field: the two are one struct type, converted both
// ways, so the compiler keeps them in step.
type Config struct {
	Name                string
	Transport           string
	Insecure            bool
	Stripes             int
	SharedMemory        string
	MaxFrame            int
	KeyFile             string
	Key                 string
	Listen              string
	DataAddr            string
	Advertise           string
	Job                 string
	Peers               []string
	Rank                int
	WorldSize           int
	LocalRank           int
	Seeds               []string
	MinWorkers          int
	MaxWorkers          int
	GossipTiming        string
	GossipProbeInterval time.Duration
	GossipSuspicionMult int
	JoinTimeout         time.Duration
	ConnectTimeout      time.Duration
	CollectiveTimeout   time.Duration
	PeerTimeout         time.Duration
	Failpoint           string
	QuorumTimeout       time.Duration
	Launcher            string
	GlobalBatch         int
	Shares              []int
	Balance             string
	BalanceAllowZero    bool
	BytesPerSample      int64
	RingOrder           string
	Algo                string
	RNGSeed             uint64
	DatasetSize         int64
	BucketBytes         int
	Compress            string
	CheckpointDir       string
	CheckpointEvery     int
	CheckpointKeep      int
	CheckpointRequired  bool
	Logger              *zerolog.Logger
	Observer            obs.Observer
	MetricsAddr         string
	Timeline            string
	StallThreshold      time.Duration
}

// Log returns Logger, or the default: warnings and errors on stderr.
func (c Config) Log() zerolog.Logger {
	if c.Logger != nil {
		return *c.Logger
	}
	return defaultLogger()
}

// WithDefaults returns a copy of c with every unset field at its default.
func (c Config) WithDefaults() Config {
	gossip := c.Gossip()
	addressless := c.Lone() && c.DataAddr == ""
	if c.Transport == "" {
		c.Transport = DefaultTransport
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
		if c.Launcher == LauncherLaunch {
			c.QuorumTimeout = LaunchQuorumWaits * cmp.Or(c.PeerTimeout, DefaultPeerTimeout)
		}
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
	if c.SharedMemory == "" {
		c.SharedMemory = SharedMemoryAuto
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
		c.Shares = sampler.EqualShares(c.GlobalBatch, c.WorldSize)
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
func (c Config) Validate() error { return c.Check(true) }

// Check is Validate; needSecret is false when the caller brings its own
// transport, and with it its own credentials.
func (c Config) Check(needSecret bool) error {
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
	if c.Stripes < 0 || c.Stripes > MaxStripes {
		bad("Stripes %d: want 1 to %d, or 0 (auto)", c.Stripes, MaxStripes)
	}
	if c.MaxFrame < 4<<10 || c.MaxFrame > 64<<20 {
		bad("MaxFrame %d: want 4 KiB to 64 MiB", c.MaxFrame)
	}
	if c.Key != "" && c.KeyFile != "" {
		bad("give KeyFile or Key, not both")
	}
	if needSecret && !c.HasSecret() && len(c.Peers) > 0 { // checkGossip says it for gossip; a lone worker needs none
		bad("%v", ErrNoSecret)
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

// Compressions maps Config.Compress onto wire types; DTypeBytes is none,
// and CompressAuto chooses per bucket.
var Compressions = map[string]wire.DType{"": wire.DTypeBytes, "none": wire.DTypeBytes,
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
	if c.SharedMemory != SharedMemoryAuto && c.SharedMemory != SharedMemoryOff {
		errs = append(errs, fmt.Errorf("SharedMemory %q: want %q or %q", c.SharedMemory, SharedMemoryAuto, SharedMemoryOff))
	}
	if c.RingOrder != RingOrderAuto && c.RingOrder != RingOrderFixed {
		errs = append(errs, fmt.Errorf("RingOrder %q: want %q or %q", c.RingOrder, RingOrderAuto, RingOrderFixed))
	}
	if c.Algo != AlgoAuto && c.Algo != AlgoRing && c.Algo != AlgoDoubling && c.Algo != AlgoHierarchical {
		errs = append(errs, fmt.Errorf("Algo %q: want %q, %q, %q or %q", c.Algo, AlgoAuto, AlgoRing, AlgoDoubling, AlgoHierarchical))
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
	if _, err := ParseFailpoint(c.Failpoint); err != nil {
		errs = append(errs, err)
	}
	if c.QuorumTimeout < 0 {
		errs = append(errs, fmt.Errorf("QuorumTimeout %v is negative", c.QuorumTimeout))
	}
	if c.Launcher != "" && c.Launcher != LauncherLaunch {
		errs = append(errs, fmt.Errorf("Launcher %q (%s): want %q or empty", c.Launcher, EnvLauncher, LauncherLaunch))
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
	if _, ok := Compressions[c.Compress]; !ok {
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

// HasSecret reports whether c gives a cluster secret, or needs none.
func (c Config) HasSecret() bool { return c.Key != "" || c.KeyFile != "" || c.Insecure }

var ErrNoSecret = errors.New("a cluster secret is required: set KeyFile (gyre keygen --out FILE) or Key")

// Lone reports whether c is a job of one: no static view, no gossip.
func (c Config) Lone() bool { return len(c.Peers) == 0 && !c.Gossip() }

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
