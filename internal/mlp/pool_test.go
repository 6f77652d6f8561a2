package mlp

import "testing"

// pool is a block of consecutive samples generated once.
type pool struct {
	n int
	x []float64
	y []int
}

func newPool(ds *Dataset, first int64, n int) *pool {
	idx := make([]int64, n)
	for i := range idx {
		idx[i] = first + int64(i)
	}
	x, y := ds.Batch(idx, nil, nil)
	return &pool{n: n, x: x, y: y}
}

func (p *pool) accuracy(m *Model) float64 { return m.AccuracyOn(p.x, p.y) }

// train is trainLocal over the pool, cycling through it in order; n must
// be a multiple of batch.
func (p *pool) train(tb testing.TB, m *Model, opt *SGD, first, iters, batch, every int, report func(iter int)) {
	tb.Helper()
	for k := range iters {
		s := (first + k*batch) % p.n
		sgdStep(tb, m, opt, p.x[s*InputDim:(s+batch)*InputDim], p.y[s:s+batch])
		if every > 0 && (k+1)%every == 0 {
			report(k + 1)
		}
	}
}
