package gyre

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/gyre-ml/gyre/ring"
)

// What a worker must share with the rest of its job, described so that a
// difference can be named: the settings (setting) and the state layout
// (tensorDesc). Join's settings vote compares their digests; a joiner
// sends them whole in its admission request, and misfitOf names the first
// difference for both sides.

// setting is one setting every worker of a job must share: its name, the
// Config field with its flag, and its value.
type setting struct {
	Name, Value string
}

// jobSettings lists the settings every worker of the job must share, in a
// fixed order, with defaults filled in. Shares are among them only in the
// static view; with gossip they come with the view, so that a joiner is
// not refused because they moved.
func jobSettings(cfg Config, staticShares []int) []setting {
	compress := cmp.Or(cfg.Compress, "none")
	bucket := cmp.Or(cfg.BucketBytes, ring.DefaultBucketBytes)
	s := []setting{
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
	}
	if staticShares != nil {
		parts := make([]string, len(staticShares))
		for i, v := range staticShares {
			parts[i] = strconv.Itoa(v)
		}
		s = append(s, setting{"Shares (--shares)", strings.Join(parts, ",")})
	}
	return s
}

// settingNames lists the names of settings, for messages.
func settingNames(settings []setting) string {
	names := make([]string, len(settings))
	for i, s := range settings {
		names[i], _, _ = strings.Cut(s.Name, " ")
	}
	return strings.Join(names, ", ")
}

// digestSettings hashes settings, names and values.
func digestSettings(settings []setting) uint64 {
	h := fnv.New64a()
	for _, s := range settings {
		h.Write([]byte(s.Name))
		h.Write([]byte{0})
		h.Write([]byte(s.Value))
		h.Write([]byte{0})
	}
	return h.Sum64()
}

// tensorDesc describes one registered state entry: its name, kind
// ("float32", "float64" or "metadata") and length (0 for metadata).
type tensorDesc struct {
	Name string
	Kind string
	Len  int
}

func (d tensorDesc) String() string {
	if d.Kind == "metadata" {
		return "metadata"
	}
	return fmt.Sprintf("%s[%d]", d.Kind, d.Len)
}

// Bounds on a layout's description in an admission request, so that the
// request of a model with many tensors still fits its buffer. Past them
// the layout digest still tells a difference, if not which entry.
const (
	maxDescribed = 1024
	maxDescName  = 128
)

// describe lists the first maxDescribed entries of the state's layout,
// with names cut at maxDescName bytes.
func (s *State) describe() []tensorDesc {
	out := make([]tensorDesc, 0, min(len(s.entries), maxDescribed))
	for _, e := range s.entries[:min(len(s.entries), maxDescribed)] {
		d := tensorDesc{Name: e.name, Kind: "metadata"}
		if len(d.Name) > maxDescName {
			d.Name = d.Name[:maxDescName]
		}
		switch e.kind {
		case kindF32:
			d.Kind, d.Len = "float32", len(e.f32)
		case kindF64:
			d.Kind, d.Len = "float64", len(e.f64)
		}
		out = append(out, d)
	}
	return out
}

// fitting is what a worker must share with its job: a joiner sends its
// own in its admission request, and a member compares it with the job's.
type fitting struct {
	Settings []setting
	// Tensors describe the first entries of the layout; Entries counts
	// them all, and Layout is the digest of the whole layout.
	Tensors []tensorDesc
	Entries int
	Layout  uint64
}

// misfit is the first difference between a joiner and its job: what
// differs, the joiner's value and the job's.
type misfit struct {
	What, Joiner, Job string
}

// misfitOf returns the first difference between the joiner's fitting and
// the job's, or nil if the joiner fits: settings first, by name, then the
// state layout entry by entry.
func misfitOf(job, joiner fitting) *misfit {
	theirs := make(map[string]string, len(joiner.Settings))
	for _, s := range joiner.Settings {
		theirs[s.Name] = s.Value
	}
	for _, s := range job.Settings {
		v, ok := theirs[s.Name]
		switch {
		case !ok:
			return &misfit{What: "setting " + s.Name, Joiner: "(not sent)", Job: s.Value}
		case v != s.Value:
			return &misfit{What: "setting " + s.Name, Joiner: v, Job: s.Value}
		}
	}
	if len(joiner.Settings) != len(job.Settings) {
		return &misfit{What: "the number of settings", Joiner: strconv.Itoa(len(joiner.Settings)), Job: strconv.Itoa(len(job.Settings))}
	}
	if joiner.Layout == job.Layout && joiner.Entries == job.Entries {
		return nil
	}
	for i := range min(len(job.Tensors), len(joiner.Tensors)) {
		a, b := job.Tensors[i], joiner.Tensors[i]
		switch {
		case a.Name != b.Name:
			return &misfit{What: fmt.Sprintf("state entry %d", i), Joiner: strconv.Quote(b.Name), Job: strconv.Quote(a.Name)}
		case a != b:
			return &misfit{What: fmt.Sprintf("state entry %q", a.Name), Joiner: b.String(), Job: a.String()}
		}
	}
	if joiner.Entries != job.Entries {
		return &misfit{What: "the number of state entries", Joiner: strconv.Itoa(joiner.Entries), Job: strconv.Itoa(job.Entries)}
	}
	return &misfit{What: fmt.Sprintf("the state layout (past the first %d entries, or in a long name)", len(job.Tensors)),
		Joiner: fmt.Sprintf("digest %016x", joiner.Layout), Job: fmt.Sprintf("digest %016x", job.Layout)}
}
