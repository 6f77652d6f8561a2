package gyre

import (
	"flag"

	"github.com/spf13/pflag"

	"github.com/gyre-ml/gyre/internal/config"
)

// BindFlags defines the worker flags on fs (the standard library's flag
// package) with c's current values as defaults, writing parsed values into
// c. Main packages usually fill c from ConfigFromEnv first, so a flag
// overrides the environment:
//
//	cfg, err := gyre.ConfigFromEnv(os.LookupEnv)
//	cfg.BindFlags(flag.CommandLine)
//	flag.Parse()
//
// The flags are --name, --transport, --insecure, --stripes, --key-file,
// --listen, --data-addr, --advertise, --seed, --job, --max-workers,
// --gossip-timing, --gossip-probe-interval, --gossip-suspicion-mult,
// --peers, --rank, --min-workers, --batch, --shares, --balance,
// --balance-allow-zero, --ring-order, --rng-seed,
// --bucket-bytes, --compress, --join-timeout, --collective-timeout,
// --peer-timeout, --quorum-timeout, --checkpoint-dir, --checkpoint-every,
// --checkpoint-keep, --checkpoint-required, --metrics-addr, --timeline
// and --stall-threshold.
func (c *Config) BindFlags(fs *flag.FlagSet) { (*config.Config)(c).BindFlags(fs) }

// BindPFlags is BindFlags for a pflag.FlagSet, the one cobra commands use
// (cmd.Flags()).
func (c *Config) BindPFlags(fs *pflag.FlagSet) { (*config.Config)(c).BindPFlags(fs) }
