package take

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/checkpoint"
	"github.com/gyre-ml/gyre/internal/config"
	"github.com/gyre-ml/gyre/internal/errs"
	"github.com/gyre-ml/gyre/internal/state"
	"github.com/gyre-ml/gyre/transport"
)

// BenchmarkCheckpointSnapshot measures the stall a checkpoint adds to the
// Commit that takes it: copying the committed state into the writer's
// snapshot (its buffers reused, as from the second checkpoint on), at the
// state sizes bench/RESULTS.md records the stall for. The state is a
// parameter tensor and a momentum tensor of float64, as gyre train's.
func BenchmarkCheckpointSnapshot(b *testing.B) {
	for _, mb := range []int{100, 1000} {
		b.Run(fmt.Sprintf("%dMB", mb), func(b *testing.B) {
			n := mb * 1e6 / 16
			s := state.New().Float64("params", make([]float64, n)).Float64("momentum", make([]float64, n))
			if err := s.Commit(1); err != nil {
				b.Fatal(err)
			}
			j := Job{State: s, Epoch: 1, Members: []transport.PeerID{"a", "b"}}
			c := &Taker{}
			if err := c.fill(j); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(mb) * 1e6)
			for b.Loop() {
				if err := c.fill(j); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestFinishEndsWithItsContext: Leave's wait for a write that does not
// end (a hung mount; here a report that blocks) ends with its context.
func TestFinishEndsWithItsContext(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	c := &Taker{dir: checkpoint.Dir{Path: t.TempDir()}}
	c.writer = checkpoint.NewWriter(c.dir, 1, func(checkpoint.Result) { <-release })
	s := state.New().Float64("w", make([]float64, 4))
	if err := s.Commit(10); err != nil {
		t.Fatal(err)
	}
	job := func() Job { return Job{State: s, Epoch: 1, Members: []transport.PeerID{"a"}} }
	if err := c.fill(job()); err != nil || !c.writer.Start(&c.snap, nil) {
		t.Fatalf("could not start a write: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := c.Finish(ctx, 10, job); !errors.Is(err, errs.Checkpoint) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Finish = %v; want errs.Checkpoint and the context's deadline", err)
	}
}

// TestFillResetsTheSnapshot: a snapshot filled again holds the new
// commit's settings and models once, not the previous ones as well.
func TestFillResetsTheSnapshot(t *testing.T) {
	s := state.New().Float64("w", make([]float64, 2))
	if err := s.Commit(1); err != nil {
		t.Fatal(err)
	}
	settings := []config.Setting{{Name: "a", Value: "1"}, {Name: "b", Value: "2"}}
	c := &Taker{}
	for range 3 {
		if err := c.fill(Job{State: s, Epoch: 1, Members: []transport.PeerID{"a"}, Settings: settings}); err != nil {
			t.Fatal(err)
		}
	}
	if len(c.snap.Settings) != len(settings) || c.snap.Balance != nil {
		t.Fatalf("after three fills: %d settings (want %d), balance %q (want none)", len(c.snap.Settings), len(settings), c.snap.Balance)
	}
}

// TestRequiredFailureSaysTheJobEnds: a failed write logs that training
// goes on, except with --checkpoint-required, whose failure ends the job:
// then the line says so, and the failure is kept for the boundary.
func TestRequiredFailureSaysTheJobEnds(t *testing.T) {
	for _, required := range []bool{false, true} {
		var out bytes.Buffer
		c := &Taker{required: required, log: zerolog.New(&out)}
		c.written(checkpoint.Result{Name: "ckpt-1-10", Err: errors.New("disk full")})
		line := out.String()
		goesOn := strings.Contains(line, "training goes on")
		ends := strings.Contains(line, "--checkpoint-required ends the job")
		if goesOn == required || ends != required || c.RequiredFailed() != required {
			t.Errorf("required=%v: logged %q (training goes on: %v, ends the job: %v); RequiredFailed %v",
				required, line, goesOn, ends, c.RequiredFailed())
		}
	}
}
