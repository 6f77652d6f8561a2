package gyre

import (
	"fmt"
	"testing"

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
