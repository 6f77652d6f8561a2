package ring

import "testing"

// BenchmarkPlan measures plan construction. Executors cache plans per
// (collective, n, rank, length, chunk), so this is paid once per shape, but
// it should still cost little: one allocation and a few dozen nanoseconds per
// message.
func BenchmarkPlan(b *testing.B) {
	const (
		length = 64 << 20 / 4 // 64 MiB of float32
		chunk  = 1 << 20 / 4  // 1 MiB chunks
	)
	benches := []struct {
		name  string
		build func() (Plan, error)
	}{
		{"ring-allreduce/n=64", func() (Plan, error) { return RingAllReduce(64, 17, length, chunk) }},
		{"ring-allreduce/n=8", func() (Plan, error) { return RingAllReduce(8, 3, length, chunk) }},
		{"ring-allreduce/n=64/chunk=64KiB", func() (Plan, error) { return RingAllReduce(64, 17, length, chunk/16) }},
		{"ring-broadcast/n=64", func() (Plan, error) { return RingBroadcast(64, 17, 0, length, chunk) }},
		{"recursive-doubling/n=64", func() (Plan, error) { return RecursiveDoubling(64, 17, 1024) }},
		{"recursive-doubling/n=63", func() (Plan, error) { return RecursiveDoubling(63, 17, 1024) }},
		{"barrier/n=64", func() (Plan, error) { return Barrier(64, 17) }},
	}
	for _, bb := range benches {
		b.Run(bb.name, func(b *testing.B) {
			b.ReportAllocs()
			var p Plan
			for b.Loop() {
				var err error
				if p, err = bb.build(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(p.Sends)+len(p.Recvs)), "msgs/plan")
		})
	}
}
