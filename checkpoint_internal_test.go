package gyre

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/internal/checkpoint"
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
			s := NewState().Float64("params", make([]float64, n)).Float64("momentum", make([]float64, n))
			if err := s.commit(1); err != nil {
				b.Fatal(err)
			}
			w := &Worker{state: s, cur: &viewState{view: View{Epoch: 1}, ids: []transport.PeerID{"a", "b"}}, cfg: Config{GlobalBatch: 16}}
			c := &checkpointer{}
			if err := c.fill(w); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(mb) * 1e6)
			for b.Loop() {
				if err := c.fill(w); err != nil {
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
	c := &checkpointer{dir: checkpoint.Dir{Path: t.TempDir()}}
	c.writer = checkpoint.NewWriter(c.dir, 1, func(checkpoint.Result) { <-release })
	s := NewState().Float64("w", make([]float64, 4))
	if err := s.commit(10); err != nil {
		t.Fatal(err)
	}
	w := &Worker{state: s, cur: &viewState{view: View{Epoch: 1}, ids: []transport.PeerID{"a"}}}
	if err := c.fill(w); err != nil || !c.writer.Start(&c.snap, nil) {
		t.Fatalf("could not start a write: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := c.finish(ctx, w); !errors.Is(err, ErrCheckpoint) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("finish = %v; want ErrCheckpoint and the context's deadline", err)
	}
}
