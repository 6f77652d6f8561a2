package gyre

import (
	"strconv"
	"strings"
	"testing"
)

// fittingOf is the fitting of a worker with cfg and state.
func fittingOf(cfg Config, s *State) fitting {
	return fitting{Settings: jobSettings(cfg.WithDefaults(), nil), Tensors: s.describe(), Entries: len(s.entries), Layout: s.layout()}
}

func TestMisfitOfNamesTheFirstDifference(t *testing.T) {
	base := Config{GlobalBatch: 64}
	state := func() *State {
		return NewState().Float32("w1", make([]float32, 6)).Float64("w2", make([]float64, 3)).Meta("opt", &meta{})
	}
	job := fittingOf(base, state())
	for _, tc := range []struct {
		name   string
		cfg    func(*Config)
		state  func() *State
		want   misfit
		prefix bool // want.What is a prefix of the misfit's
	}{
		{"batch", func(c *Config) { c.GlobalBatch = 128 }, state, misfit{"setting GlobalBatch (--batch)", "128", "64"}, false},
		{"rng seed", func(c *Config) { c.RNGSeed = 9 }, state, misfit{"setting RNGSeed (--rng-seed)", "9", "0"}, false},
		{"dataset", func(c *Config) { c.DatasetSize = 1000 }, state, misfit{"setting DatasetSize", "1000", "0"}, false},
		{"balance", func(c *Config) { c.Balance = BalanceStatic }, state, misfit{"setting Balance (--balance)", "static", "lbbsp"}, false},
		{"allow zero", func(c *Config) { c.BalanceAllowZero = true }, state, misfit{"setting BalanceAllowZero (--balance-allow-zero)", "true", "false"}, false},
		{"ring order", func(c *Config) { c.RingOrder = RingOrderFixed }, state, misfit{"setting RingOrder (--ring-order)", "fixed", "auto"}, false},
		{"buckets", func(c *Config) { c.BucketBytes = 1 << 20 }, state, misfit{"setting BucketBytes (--bucket-bytes)", "1048576", "26214400"}, false},
		{"compress", func(c *Config) { c.Compress = "bf16" }, state, misfit{"setting Compress (--compress)", "bf16", "none"}, false},
		{"length", nil, func() *State {
			return NewState().Float32("w1", make([]float32, 7)).Float64("w2", make([]float64, 3)).Meta("opt", &meta{})
		}, misfit{`state entry "w1"`, "float32[7]", "float32[6]"}, false},
		{"kind", nil, func() *State {
			return NewState().Float32("w1", make([]float32, 6)).Float32("w2", make([]float32, 3)).Meta("opt", &meta{})
		}, misfit{`state entry "w2"`, "float32[3]", "float64[3]"}, false},
		{"name", nil, func() *State {
			return NewState().Float32("w1", make([]float32, 6)).Float64("w3", make([]float64, 3)).Meta("opt", &meta{})
		}, misfit{"state entry 1", `"w3"`, `"w2"`}, false},
		{"more entries", nil, func() *State { return state().Float32("extra", make([]float32, 1)) },
			misfit{"the number of state entries", "4", "3"}, false},
		{"fewer entries", nil, func() *State { return NewState().Float32("w1", make([]float32, 6)) },
			misfit{"the number of state entries", "1", "3"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			m := misfitOf(job, fittingOf(cfg, tc.state()))
			if m == nil || *m != tc.want {
				t.Fatalf("misfit %+v, want %+v", m, tc.want)
			}
		})
	}
	if m := misfitOf(job, fittingOf(Config{GlobalBatch: 64, BucketBytes: 25 << 20, Compress: "none"}, state())); m != nil {
		t.Fatalf("defaults written out differ: %+v", m)
	}
}

// TestMisfitPastTheDescribedEntries: a model with more entries than a
// request describes still has its difference found, by digest.
func TestMisfitPastTheDescribedEntries(t *testing.T) {
	build := func(last int) *State {
		s := NewState()
		for i := range maxDescribed + 5 {
			n := 2
			if i == maxDescribed+4 {
				n = last
			}
			s.Float32("t"+strconv.Itoa(i), make([]float32, n))
		}
		return s
	}
	job, same, other := fittingOf(Config{}, build(2)), fittingOf(Config{}, build(2)), fittingOf(Config{}, build(3))
	if len(job.Tensors) != maxDescribed {
		t.Fatalf("described %d entries, want %d", len(job.Tensors), maxDescribed)
	}
	if m := misfitOf(job, same); m != nil {
		t.Fatalf("equal layouts: %+v", m)
	}
	m := misfitOf(job, other)
	if m == nil || !strings.HasPrefix(m.What, "the state layout (past the first 1024 entries") {
		t.Fatalf("misfit %+v, want the layout digests to differ", m)
	}
}

func TestSettingsDigestCoversEverySetting(t *testing.T) {
	base := digestSettings(jobSettings(Config{}.WithDefaults(), nil))
	for _, c := range []Config{{GlobalBatch: 7}, {RNGSeed: 1}, {DatasetSize: 5}, {Balance: BalanceStatic},
		{BalanceAllowZero: true}, {RingOrder: RingOrderFixed}, {BucketBytes: 1024}, {Compress: "fp16"}, {Algo: AlgoRing}} {
		if digestSettings(jobSettings(c.WithDefaults(), nil)) == base {
			t.Errorf("%+v: same digest as the defaults", c)
		}
	}
	if digestSettings(jobSettings(Config{}.WithDefaults(), []int{1, 2})) == base {
		t.Error("static shares do not change the digest")
	}
}

// meta is metadata for layout tests.
type meta struct{ n uint64 }

func (m *meta) MarshalBinary() ([]byte, error) { return []byte{byte(m.n)}, nil }
func (m *meta) UnmarshalBinary(b []byte) error { m.n = uint64(b[0]); return nil }
