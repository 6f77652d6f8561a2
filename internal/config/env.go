package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Environment variables read by ConfigFromEnv.
const (
	EnvTransport = "GYRE_TRANSPORT"
	EnvInsecure  = "GYRE_INSECURE"
	EnvStripes   = "GYRE_STRIPES"
	// EnvSharedMemory is "auto" or "off".
	EnvSharedMemory = "GYRE_SHM"
	EnvKeyFile      = "GYRE_KEY_FILE"
	EnvKey          = "GYRE_KEY"
	EnvListen       = "GYRE_LISTEN"
	EnvDataAddr     = "GYRE_DATA_ADDR"
	EnvAdvertise    = "GYRE_ADVERTISE"
	EnvName         = "GYRE_NAME"
	EnvPeers        = "GYRE_PEERS" // comma-separated data addresses in rank order
	EnvRank         = "GYRE_RANK"
	EnvWorldSize    = "GYRE_WORLD_SIZE"
	EnvLocalRank    = "GYRE_LOCAL_RANK"
	EnvSeed         = "GYRE_SEED" // comma-separated gossip seed addresses
	EnvMinWorkers   = "GYRE_MIN_WORKERS"
	EnvMaxWorkers   = "GYRE_MAX_WORKERS"
	EnvJob          = "GYRE_JOB"
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
	// EnvLauncher is Config.Launcher: "launch", set by gyre launch.
	EnvLauncher       = "GYRE_LAUNCHER"
	EnvPeerTimeout    = "GYRE_PEER_TIMEOUT"
	EnvStallThreshold = "GYRE_STALL_THRESHOLD"
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

// FromEnv reads the GYRE_* variables through lookup (os.LookupEnv in
// main packages, a map in tests). Unset variables leave their fields zero,
// so defaults apply; a malformed value is an error naming the variable.
func FromEnv(lookup func(string) (string, bool)) (Config, error) {
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
	str(EnvSharedMemory, &c.SharedMemory)
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
	str(EnvLauncher, &c.Launcher)
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
