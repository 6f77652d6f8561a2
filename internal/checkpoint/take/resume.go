package take

import (
	"encoding/json"
	"fmt"

	"github.com/gyre-ml/gyre/balance"
	"github.com/gyre-ml/gyre/internal/checkpoint"
	"github.com/gyre-ml/gyre/internal/config"
	"github.com/gyre-ml/gyre/internal/errs"
	"github.com/gyre-ml/gyre/internal/state"
	"github.com/gyre-ml/gyre/transport"
)

// Newest returns the newest valid checkpoint of this worker's directory,
// logging each newer one that is not valid, and the highest job epoch
// any file of the directory names. The snapshot holds no values; a nil
// Taker has none.
func (c *Taker) Newest() (snap *checkpoint.Snapshot, name string, dirEpoch uint64) {
	if c == nil {
		return nil, "", 0
	}
	snap, name, bad := c.dir.Newest()
	for _, err := range bad {
		c.log.Error().Err(err).Msg("checkpoint unreadable; an older one is tried")
	}
	return snap, name, c.dir.HighestEpoch()
}

// resumeSettings are the settings a checkpoint must share with the job:
// the ones that decide which samples each iteration takes.
var resumeSettings = []string{"GlobalBatch (--batch)", "RNGSeed (--rng-seed)", "DatasetSize"}

// Load reads the checkpoint name of this worker's directory, checks that
// it fits set and settings (config.JobSettings), then copies it into the
// registered values. It returns the checkpoint's iteration and, with
// lbbsp, if it was taken with as many workers as the view holds, its
// balance models (else nil).
func (c *Taker) Load(name string, set *state.Set, settings []config.Setting, workers int, lbbsp bool) (int64, map[transport.PeerID]balance.Worker, error) {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%w: checkpoint %s: %s", errs.Diverged, name, fmt.Sprintf(format, args...))
	}
	s, err := c.dir.Load(name)
	if err != nil {
		return 0, nil, fmt.Errorf("%w: %w", errs.Diverged, err) // it read as valid a moment ago
	}
	entries := set.Entries()
	if len(s.Entries) != len(entries) {
		return 0, nil, fail("holds %d entries, this worker registered %d", len(s.Entries), len(entries))
	}
	for i, e := range entries {
		ce := s.Entries[i]
		kind, n := checkpoint.Bytes, -1
		switch e.Kind {
		case state.F32:
			kind, n = checkpoint.Float32, len(e.F32)
		case state.F64:
			kind, n = checkpoint.Float64, len(e.F64)
		}
		if ce.Name != e.Name || ce.Kind != kind || n >= 0 && ce.Len != n {
			return 0, nil, fail("entry %d is %s, this worker registered %s", i, describeEntry(ce.Name, ce.Kind, ce.Len), describeEntry(e.Name, kind, n))
		}
	}
	have := map[string]string{}
	for _, st := range s.Settings {
		have[st.Name] = st.Value
	}
	for _, st := range settings {
		for _, name := range resumeSettings {
			if st.Name == name && have[name] != st.Value {
				return 0, nil, fail("was taken with %s %s, this job runs %s", name, have[name], st.Value)
			}
		}
	}
	for i, e := range entries {
		v := s.Values[i]
		switch e.Kind {
		case state.F32:
			copy(e.F32, v.F32)
		case state.F64:
			copy(e.F64, v.F64)
		case state.Meta:
			if err := e.Meta.UnmarshalBinary(v.Bytes); err != nil {
				return 0, nil, fail("decode %q: %v", e.Name, err)
			}
		}
	}
	if !lbbsp || s.Workers != workers || len(s.Balance) == 0 {
		return s.Iter, nil, nil
	}
	var fits map[string]balance.Worker
	if err := json.Unmarshal(s.Balance, &fits); err != nil {
		c.log.Warn().Err(err).Str("file", name).Msg("the checkpoint's balance models are unreadable; shares start equal")
		return s.Iter, nil, nil
	}
	out := make(map[transport.PeerID]balance.Worker, len(fits))
	for id, f := range fits {
		out[transport.PeerID(id)] = f
	}
	return s.Iter, out, nil
}

// describeEntry says what an entry is, for errors: "float32 w[100]".
func describeEntry(name string, kind checkpoint.Kind, n int) string {
	switch kind {
	case checkpoint.Float32:
		return fmt.Sprintf("float32 %q[%d]", name, n)
	case checkpoint.Float64:
		return fmt.Sprintf("float64 %q[%d]", name, n)
	}
	return fmt.Sprintf("metadata %q", name)
}
