package admission

import (
	"strconv"
	"strings"
	"testing"

	"github.com/gyre-ml/gyre/internal/config"
	"github.com/gyre-ml/gyre/internal/state"
)

// fittingOf is the Fitting of a worker with cfg and s.
func fittingOf(cfg config.Config, s *state.Set) Fitting {
	return FittingOf(config.JobSettings(cfg.WithDefaults(), nil), s)
}

func TestMisfitOfNamesTheFirstDifference(t *testing.T) {
	base := config.Config{GlobalBatch: 64}
	model := func() *state.Set {
		return state.New().Float32("w1", make([]float32, 6)).Float64("w2", make([]float64, 3)).Meta("opt", &meta{})
	}
	job := fittingOf(base, model())
	for _, tc := range []struct {
		name   string
		cfg    func(*config.Config)
		state  func() *state.Set
		want   Misfit
		prefix bool // want.What is a prefix of the misfit's
	}{
		{"batch", func(c *config.Config) { c.GlobalBatch = 128 }, model, Misfit{"setting GlobalBatch (--batch)", "128", "64"}, false},
		{"rng seed", func(c *config.Config) { c.RNGSeed = 9 }, model, Misfit{"setting RNGSeed (--rng-seed)", "9", "0"}, false},
		{"dataset", func(c *config.Config) { c.DatasetSize = 1000 }, model, Misfit{"setting DatasetSize", "1000", "0"}, false},
		{"balance", func(c *config.Config) { c.Balance = config.BalanceStatic }, model, Misfit{"setting Balance (--balance)", "static", "lbbsp"}, false},
		{"allow zero", func(c *config.Config) { c.BalanceAllowZero = true }, model, Misfit{"setting BalanceAllowZero (--balance-allow-zero)", "true", "false"}, false},
		{"ring order", func(c *config.Config) { c.RingOrder = config.RingOrderFixed }, model, Misfit{"setting RingOrder (--ring-order)", "fixed", "auto"}, false},
		{"buckets", func(c *config.Config) { c.BucketBytes = 1 << 20 }, model, Misfit{"setting BucketBytes (--bucket-bytes)", "1048576", "26214400"}, false},
		{"compress", func(c *config.Config) { c.Compress = "bf16" }, model, Misfit{"setting Compress (--compress)", "bf16", "none"}, false},
		{"length", nil, func() *state.Set {
			return state.New().Float32("w1", make([]float32, 7)).Float64("w2", make([]float64, 3)).Meta("opt", &meta{})
		}, Misfit{`state entry "w1"`, "float32[7]", "float32[6]"}, false},
		{"kind", nil, func() *state.Set {
			return state.New().Float32("w1", make([]float32, 6)).Float32("w2", make([]float32, 3)).Meta("opt", &meta{})
		}, Misfit{`state entry "w2"`, "float32[3]", "float64[3]"}, false},
		{"name", nil, func() *state.Set {
			return state.New().Float32("w1", make([]float32, 6)).Float64("w3", make([]float64, 3)).Meta("opt", &meta{})
		}, Misfit{"state entry 1", `"w3"`, `"w2"`}, false},
		{"more entries", nil, func() *state.Set { return model().Float32("extra", make([]float32, 1)) },
			Misfit{"the number of state entries", "4", "3"}, false},
		{"fewer entries", nil, func() *state.Set { return state.New().Float32("w1", make([]float32, 6)) },
			Misfit{"the number of state entries", "1", "3"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			m := MisfitOf(job, fittingOf(cfg, tc.state()))
			if m == nil || *m != tc.want {
				t.Fatalf("misfit %+v, want %+v", m, tc.want)
			}
		})
	}
	if m := MisfitOf(job, fittingOf(config.Config{GlobalBatch: 64, BucketBytes: 25 << 20, Compress: "none"}, model())); m != nil {
		t.Fatalf("defaults written out differ: %+v", m)
	}
}

// TestMisfitPastTheDescribedEntries: a model with more entries than a
// request describes still has its difference found, by digest.
func TestMisfitPastTheDescribedEntries(t *testing.T) {
	build := func(last int) *state.Set {
		s := state.New()
		for i := range maxDescribed + 5 {
			n := 2
			if i == maxDescribed+4 {
				n = last
			}
			s.Float32("t"+strconv.Itoa(i), make([]float32, n))
		}
		return s
	}
	job, same, other := fittingOf(config.Config{}, build(2)), fittingOf(config.Config{}, build(2)), fittingOf(config.Config{}, build(3))
	if len(job.Tensors) != maxDescribed {
		t.Fatalf("described %d entries, want %d", len(job.Tensors), maxDescribed)
	}
	if m := MisfitOf(job, same); m != nil {
		t.Fatalf("equal layouts: %+v", m)
	}
	m := MisfitOf(job, other)
	if m == nil || !strings.HasPrefix(m.What, "the state layout (past the first 1024 entries") {
		t.Fatalf("misfit %+v, want the layout digests to differ", m)
	}
}

// meta is metadata for layout tests.
type meta struct{ n uint64 }

func (m *meta) MarshalBinary() ([]byte, error) { return []byte{byte(m.n)}, nil }
func (m *meta) UnmarshalBinary(b []byte) error { m.n = uint64(b[0]); return nil }
