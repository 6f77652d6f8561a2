package config

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// BindFlags defines the worker flags on fs (see gyre.Config.BindFlags).
func (c *Config) BindFlags(fs *flag.FlagSet) { c.bind(goFlags{fs}) }

// BindPFlags is BindFlags for a pflag.FlagSet.
func (c *Config) BindPFlags(fs *pflag.FlagSet) { c.bind(pFlags{fs}) }

// flagAdder is what bind needs of a flag set; goFlags and pFlags adapt the
// two packages to it.
type flagAdder interface {
	StringVar(p *string, name, value, usage string)
	IntVar(p *int, name string, value int, usage string)
	BoolVar(p *bool, name string, value bool, usage string)
	Uint64Var(p *uint64, name string, value uint64, usage string)
	DurationVar(p *time.Duration, name string, value time.Duration, usage string)
	listVar(v listValue, name, usage string)
}

type goFlags struct{ *flag.FlagSet }

func (f goFlags) listVar(v listValue, name, usage string) { f.Var(v, name, usage) }

type pFlags struct{ *pflag.FlagSet }

func (f pFlags) listVar(v listValue, name, usage string) { f.Var(v, name, usage) }

// listValue is a comma-separated list flag; it satisfies both flag.Value
// and pflag.Value.
type listValue interface {
	String() string
	Set(string) error
	Type() string
}

func (c *Config) bind(fs flagAdder) {
	fs.StringVar(&c.Name, "name", c.Name, "worker name (empty: the advertised data address)")
	fs.StringVar(&c.Transport, "transport", c.Transport, "data-plane transport: quic or tcp (empty: quic)")
	fs.BoolVar(&c.Insecure, "insecure", c.Insecure, "tcp only: plain TCP, no encryption or authentication")
	fs.IntVar(&c.Stripes, "stripes", c.Stripes, "connections per peer link, 1 to 16; 0: the link probes choose 1 or 4 per job")
	fs.StringVar(&c.SharedMemory, "shm", c.SharedMemory, "peers on this machine: auto (through shared memory) or off (over the network transport) (empty: auto)")
	fs.StringVar(&c.KeyFile, "key-file", c.KeyFile, "cluster secret file, written by gyre keygen (a job of one needs none)")
	fs.StringVar(&c.Listen, "listen", c.Listen, "gossip address host:port (empty: "+DefaultListen+")")
	fs.StringVar(&c.DataAddr, "data-addr", c.DataAddr, "data-plane listen address (empty: the gossip port + 1)")
	fs.StringVar(&c.Advertise, "advertise", c.Advertise, "host the others reach this worker at, for gossip and data (empty: --data-addr's host)")
	fs.listVar(&stringList{p: &c.Seeds}, "seed", "gossip seed address host:port of any member, comma-separated or repeated; a list naming this worker too may be given to every worker alike: the first seed's worker starts the job if no other seed runs it")
	fs.StringVar(&c.Job, "job", c.Job, "job name in gossip (empty: "+DefaultJob+")")
	fs.IntVar(&c.MaxWorkers, "max-workers", c.MaxWorkers, fmt.Sprintf("largest view; further joiners wait (0: %d)", MaxView))
	fs.StringVar(&c.GossipTiming, "gossip-timing", c.GossipTiming, "memberlist timing preset: lan or local (empty: lan)")
	fs.DurationVar(&c.GossipProbeInterval, "gossip-probe-interval", c.GossipProbeInterval, "gossip probe interval (0: the preset's)")
	fs.IntVar(&c.GossipSuspicionMult, "gossip-suspicion-mult", c.GossipSuspicionMult, "probe intervals a suspected member has to refute it (0: the preset's)")
	fs.listVar(&stringList{p: &c.Peers}, "peers", "static view: every worker's data address in rank order, comma-separated")
	fs.IntVar(&c.Rank, "rank", c.Rank, "this worker's index in --peers")
	fs.IntVar(&c.MinWorkers, "min-workers", c.MinWorkers, "workers needed before iteration 0 (0: 1 with gossip, all of --peers without)")
	fs.IntVar(&c.GlobalBatch, "batch", c.GlobalBatch, fmt.Sprintf("global batch: samples per iteration over all workers (0: %d)", DefaultGlobalBatch))
	fs.listVar(&intList{&c.Shares}, "shares", "fixed per-worker batch shares in rank order, comma-separated (empty: equal); implies --balance static")
	fs.StringVar(&c.Balance, "balance", c.Balance, "how shares are decided: lbbsp (from measured compute times) or static (equal, or --shares) (empty: lbbsp)")
	fs.BoolVar(&c.BalanceAllowZero, "balance-allow-zero", c.BalanceAllowZero, "let balancing give a very slow worker no samples")
	fs.StringVar(&c.RingOrder, "ring-order", c.RingOrder, "ring order: auto (probe the links and cross slow ones rarely) or fixed (address order) (empty: auto)")
	fs.StringVar(&c.Algo, "algo", c.Algo, "allreduce algorithm: auto (recursive doubling for small buffers, the ring or the hierarchical allreduce for large), ring, doubling or hierarchical (empty: auto)")
	fs.Uint64Var(&c.RNGSeed, "rng-seed", c.RNGSeed, "random seed of the sampler")
	fs.IntVar(&c.BucketBytes, "bucket-bytes", c.BucketBytes, "gradient bucket size in bytes (0: 25 MiB)")
	fs.StringVar(&c.Compress, "compress", c.Compress, "send float32 gradients as bf16 or fp16, or auto: bf16 only where the measured links are slow enough to gain (empty: none)")
	fs.DurationVar(&c.JoinTimeout, "join-timeout", c.JoinTimeout,
		"how long Join waits for the seeds, admission and --min-workers (0: 5m)")
	fs.DurationVar(&c.ConnectTimeout, "connect-timeout", c.ConnectTimeout,
		"how long a view change waits to connect to a member or to welcome a joiner (0: 30s)")
	fs.DurationVar(&c.CollectiveTimeout, "collective-timeout", c.CollectiveTimeout,
		"how long a collective waits for a peer that is alive but late (0: 10m)")
	fs.DurationVar(&c.PeerTimeout, "peer-timeout", c.PeerTimeout,
		"how long a peer may miss heartbeats before it is declared gone (0: 2s)")
	fs.DurationVar(&c.StallThreshold, "stall-threshold", c.StallThreshold,
		"log a stall report, naming the ranks not yet arrived and the tensors pending, when a collective waits this long (0: 60s or half of --collective-timeout; negative: off)")
	fs.DurationVar(&c.QuorumTimeout, "quorum-timeout", c.QuorumTimeout,
		"how long a worker cut off from a majority of its view waits for it before it fails (0: --join-timeout)")
	fs.StringVar(&c.CheckpointDir, "checkpoint-dir", c.CheckpointDir,
		"directory to write checkpoints of the committed state into, and to resume from (empty: none)")
	fs.IntVar(&c.CheckpointEvery, "checkpoint-every", c.CheckpointEvery,
		fmt.Sprintf("take a checkpoint at every iteration that is a multiple of this (0: %d)", DefaultCheckpointEvery))
	fs.IntVar(&c.CheckpointKeep, "checkpoint-keep", c.CheckpointKeep,
		fmt.Sprintf("how many of the newest checkpoints to keep (0: %d)", DefaultCheckpointKeep))
	fs.BoolVar(&c.CheckpointRequired, "checkpoint-required", c.CheckpointRequired,
		"end the job when a checkpoint cannot be written, instead of logging it and training on")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", c.MetricsAddr,
		"serve Prometheus metrics at http://HOST:PORT/metrics and a status page at / (empty: none; port 0: any free port, logged)")
	fs.StringVar(&c.Timeline, "timeline", c.Timeline,
		"write a Chrome trace-event timeline of this worker (spans, boundaries, collectives) to this file; open it in Perfetto")
}

// stringList is a list flag of strings. Each Set appends, so a flag may be
// repeated; the first Set replaces the default.
type stringList struct {
	p   *[]string
	set bool
}

func (l *stringList) String() string {
	if l.p == nil {
		return ""
	}
	return strings.Join(*l.p, ",")
}

func (l *stringList) Type() string { return "list" }

func (l *stringList) Set(v string) error {
	if !l.set {
		*l.p, l.set = nil, true
	}
	*l.p = append(*l.p, splitList(v)...)
	return nil
}

// intList is a list flag of non-negative integers; Set replaces the list.
type intList struct{ p *[]int }

func (l *intList) String() string {
	if l.p == nil {
		return ""
	}
	s := make([]string, len(*l.p))
	for i, v := range *l.p {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, ",")
}

func (l *intList) Type() string { return "ints" }

func (l *intList) Set(v string) error {
	var out []int
	for _, f := range splitList(v) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 {
			return fmt.Errorf("%q is not a non-negative integer", f)
		}
		out = append(out, n)
	}
	*l.p = out
	return nil
}
