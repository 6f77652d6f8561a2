package mlp

import (
	"fmt"
	"testing"
)

// BenchmarkStep times one forward and backward pass over a batch already
// generated, the compute a worker does per iteration, and reports
// samples/s. Run with: go test -run '^$' -bench Step ./internal/mlp/
func BenchmarkStep(b *testing.B) {
	ds := NewDataset(1)
	for _, sizes := range [][]int{DefaultSizes(), {InputDim, 128, 128, NumClasses}} {
		for _, batch := range []int{64, DefaultBatch} {
			b.Run(fmt.Sprintf("sizes=%v/batch=%d", sizes, batch), func(b *testing.B) {
				m, err := New(sizes, 1)
				if err != nil {
					b.Fatal(err)
				}
				x, y := newPool(ds, 0, batch).x, newPool(ds, 0, batch).y
				b.ReportAllocs()
				for b.Loop() {
					if _, err := m.Forward(x, y); err != nil {
						b.Fatal(err)
					}
					m.Backward(nil)
				}
				b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "samples/s")
			})
		}
	}
}

// BenchmarkSample times generating one sample, the data cost per sample of
// a worker.
func BenchmarkSample(b *testing.B) {
	ds := NewDataset(1)
	x := make([]float64, InputDim)
	var i int64
	for b.Loop() {
		ds.Sample(i, x)
		i++
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "samples/s")
}
