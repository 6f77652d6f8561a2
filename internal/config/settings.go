package config

import (
	"cmp"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/gyre-ml/gyre/ring"
)

// What every worker of a job must share: the settings (Setting) that
// Join's settings vote compares by digest, that a joiner sends whole in
// its admission request, and that a checkpoint records.

// Setting is one setting every worker of a job must share: its name, the
// Config field with its flag, and its value.
type Setting struct {
	Name, Value string
}

// JobSettings lists the settings every worker of the job must share, in a
// fixed order, with defaults filled in. Shares are among them only in the
// static view; with gossip they come with the view, so that a joiner is
// not refused because they moved.
func JobSettings(cfg Config, staticShares []int) []Setting {
	compress := cmp.Or(cfg.Compress, "none")
	bucket := cmp.Or(cfg.BucketBytes, ring.DefaultBucketBytes)
	s := []Setting{
		{"GlobalBatch (--batch)", strconv.Itoa(cfg.GlobalBatch)},
		{"RNGSeed (--rng-seed)", strconv.FormatUint(cfg.RNGSeed, 10)},
		{"DatasetSize", strconv.FormatInt(cfg.DatasetSize, 10)},
		{"Balance (--balance)", cfg.Balance},
		{"BalanceAllowZero (--balance-allow-zero)", strconv.FormatBool(cfg.BalanceAllowZero)},
		{"RingOrder (--ring-order)", cfg.RingOrder},
		{"BucketBytes (--bucket-bytes)", strconv.Itoa(bucket)},
		{"Compress (--compress)", compress},
		// Algo decides whether a view probes its links, and which
		// algorithm runs at which size: ranks that differ would wait in
		// different collectives.
		{"Algo (--algo)", cmp.Or(cfg.Algo, AlgoAuto)},
		// Stripes auto makes the link probes gather the machines first and
		// probe striped connections too: a rank without it would run
		// other collectives. Pinned counts may differ: the receiver takes
		// each sender's from its streams.
		{"Stripes (--stripes) auto or pinned", map[bool]string{true: "auto", false: "pinned"}[cfg.Stripes == StripesAuto]},
	}
	if staticShares != nil {
		parts := make([]string, len(staticShares))
		for i, v := range staticShares {
			parts[i] = strconv.Itoa(v)
		}
		s = append(s, Setting{"Shares (--shares)", strings.Join(parts, ",")})
	}
	return s
}

// SettingNames lists the names of settings, for messages.
func SettingNames(settings []Setting) string {
	names := make([]string, len(settings))
	for i, s := range settings {
		names[i], _, _ = strings.Cut(s.Name, " ")
	}
	return strings.Join(names, ", ")
}

// DigestSettings hashes settings, names and values.
func DigestSettings(settings []Setting) uint64 {
	h := fnv.New64a()
	for _, s := range settings {
		h.Write([]byte(s.Name))
		h.Write([]byte{0})
		h.Write([]byte(s.Value))
		h.Write([]byte{0})
	}
	return h.Sum64()
}
