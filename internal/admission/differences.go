package admission

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/gyre-ml/gyre/internal/errs"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/transport"
)

// Differences gathers every member's fitting on ctrl, the control
// communicator of a view of ids in which this worker, at rank, fits as
// fit, and names, for each rank that differs from rank 0, the first
// difference with both values: the field or tensor the user must fix, not
// a list of suspects. Every member must call it, as every collective.
func Differences(ctx context.Context, ctrl *ring.Comm, ids []transport.PeerID, rank int, fit Fitting) ([]error, error) {
	// A worker that cannot encode its own still takes part in both
	// gathers, with nothing, so that none is left waiting.
	own, ownErr := json.Marshal(fit)
	if ownErr != nil {
		own = nil
	}
	n := len(ids)
	lens := make([]int64, n)
	lens[rank] = int64(len(own))
	if err := ring.AllGather(ctx, ctrl, lens); err != nil {
		return nil, err
	}
	width := slices.Max(lens)
	if width > maxFittingBytes {
		return nil, fmt.Errorf("a worker's settings take %d bytes, more than %d", width, maxFittingBytes)
	}
	table := make([]byte, n*int(width))
	copy(table[rank*int(width):], own)
	if err := ctrl.AllGather(ctx, wire.DTypeBytes, table); err != nil {
		return nil, err
	}
	if ownErr != nil {
		return nil, ownErr
	}
	fits := make([]Fitting, n)
	for r := range fits {
		at := r * int(width)
		if lens[r] <= 0 || lens[r] > width {
			return nil, fmt.Errorf("rank %d sent no settings", r)
		}
		if err := json.Unmarshal(table[at:at+int(lens[r])], &fits[r]); err != nil {
			return nil, fmt.Errorf("rank %d's settings: %w", r, err)
		}
	}
	var out []error
	for r := 1; r < n; r++ {
		if m := MisfitOf(fits[0], fits[r]); m != nil {
			out = append(out, fmt.Errorf("%w: rank %d (%s) differs from rank 0 (%s) in %s: %s at rank %d, %s at rank 0",
				errs.Diverged, r, ids[r], ids[0], m.What, m.Joiner, r, m.Job))
		}
	}
	return out, nil
}

// maxFittingBytes bounds a worker's encoded fitting, which describes at
// most maxDescribed tensors.
const maxFittingBytes = 1 << 20
