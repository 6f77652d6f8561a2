package mlp

import (
	"fmt"
	"runtime"
	"testing"
	"time"
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

// BenchmarkFirstPassStall measures how long the first forward and
// backward at a new batch size keep other goroutines from running, with
// GOMAXPROCS=1: a ticker goroutine beside them records its longest gap
// between 5 ms ticks (max-stall-ms). Heartbeats run on such a goroutine,
// and a CPU quota stretches the stall by 1/quota. Each iteration builds a
// fresh model, so every pass meets fresh buffers.
//
//	go test -run '^$' -bench FirstPassStall -benchtime 3x ./internal/mlp
func BenchmarkFirstPassStall(b *testing.B) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const n, hidden = 6144, 2048
	x := make([]float64, n*InputDim)
	labels := make([]int, n)
	var worst time.Duration
	for range b.N {
		m, err := New([]int{InputDim, hidden, NumClasses}, 1)
		if err != nil {
			b.Fatal(err)
		}
		worst = max(worst, longestStall(func() {
			m.Forward(x, labels)
			m.Backward(nil)
		}))
	}
	b.ReportMetric(float64(worst)/1e6, "max-stall-ms")
}

// longestStall runs f and returns the longest gap between the 5 ms ticks
// of a goroutine running beside it.
func longestStall(f func()) time.Duration {
	stop, gap := make(chan struct{}), make(chan time.Duration)
	go func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		last, worst := time.Now(), time.Duration(0)
		for {
			select {
			case <-stop:
				gap <- worst
				return
			case now := <-tick.C:
				worst, last = max(worst, now.Sub(last)), now
			}
		}
	}()
	time.Sleep(20 * time.Millisecond) // the ticker is running
	f()
	close(stop)
	return <-gap
}
