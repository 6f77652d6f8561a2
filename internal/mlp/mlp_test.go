package mlp

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// trainLocal runs iters single-process SGD steps on the training stream:
// batch k is indices first + [k·batch, (k+1)·batch), fresh samples every step, the
// way a data-parallel run with the same global batch sees them. If every is
// positive it calls report(k+1) after every `every` steps.
func trainLocal(tb testing.TB, m *Model, opt *SGD, ds *Dataset, first int64, iters, batch, every int, report func(iter int)) {
	tb.Helper()
	idx := make([]int64, batch)
	var x []float64
	var y []int
	for k := range iters {
		for i := range idx {
			idx[i] = first + int64(k*batch+i)
		}
		x, y = ds.Batch(idx, x, y)
		sgdStep(tb, m, opt, x, y)
		if every > 0 && (k+1)%every == 0 {
			report(k + 1)
		}
	}
}

// sgdStep is one forward, backward and optimizer step on the batch x, y.
func sgdStep(tb testing.TB, m *Model, opt *SGD, x []float64, y []int) {
	tb.Helper()
	if _, err := m.Forward(x, y); err != nil {
		tb.Fatal(err)
	}
	m.Backward(nil)
	if err := opt.Step(m.Params(), m.Grads()); err != nil {
		tb.Fatal(err)
	}
}

// randomBatch returns n random inputs of width in and labels below classes.
func randomBatch(n, in, classes int, seed uint64) ([]float64, []int) {
	r := rand.New(rand.NewPCG(seed, 1))
	x := make([]float64, n*in)
	for i := range x {
		x[i] = r.NormFloat64()
	}
	y := make([]int, n)
	for i := range y {
		y[i] = r.IntN(classes)
	}
	return x, y
}

func cloneAll(ts [][]float64) [][]float64 {
	out := make([][]float64, len(ts))
	for i, t := range ts {
		out[i] = slices.Clone(t)
	}
	return out
}

func TestGradientMatchesFiniteDifferences(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sizes []int
		act   Activation
	}{
		{"tanh", []int{4, 5, 6, 3}, Tanh},
		{"relu", []int{4, 5, 6, 3}, ReLU},
		{"linear", []int{4, 3}, Tanh},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewWithActivation(tc.sizes, tc.act, 7)
			if err != nil {
				t.Fatal(err)
			}
			// Non-zero biases, so their gradients are exercised away from 0.
			r := rand.New(rand.NewPCG(3, 3))
			for _, p := range m.Params() {
				for i := range p {
					p[i] += 0.1 * r.NormFloat64()
				}
			}
			x, y := randomBatch(6, tc.sizes[0], tc.sizes[len(tc.sizes)-1], 11)
			if _, err := m.Forward(x, y); err != nil {
				t.Fatal(err)
			}
			m.Backward(nil)
			grads := cloneAll(m.Grads())
			const h = 1e-6
			for l, p := range m.Params() {
				for i := range p {
					orig := p[i]
					p[i] = orig + h
					up, _ := m.Forward(x, y)
					p[i] = orig - h
					down, _ := m.Forward(x, y)
					p[i] = orig
					num := (up - down) / (2 * h)
					if d := math.Abs(num - grads[l][i]); d > 1e-7*max(1, math.Abs(num)) {
						t.Errorf("layer %d param %d: backward %.10g, finite difference %.10g", l, i, grads[l][i], num)
					}
				}
			}
		})
	}
}

func TestBackwardCallsLayersLastToFirst(t *testing.T) {
	m, err := New([]int{InputDim, 8, 8, NumClasses}, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, 5} {
		x, y := randomBatch(n, InputDim, NumClasses, 2)
		if _, err := m.Forward(x, y); err != nil {
			t.Fatal(err)
		}
		var order []int
		m.Backward(func(l int, g []float64) {
			if &g[0] != &m.Grads()[l][0] || len(g) != len(m.Grads()[l]) {
				t.Errorf("n=%d: layer %d handed a slice that is not Grads()[%d]", n, l, l)
			}
			order = append(order, l)
		})
		if !slices.Equal(order, []int{2, 1, 0}) {
			t.Errorf("n=%d: onLayer order %v, want [2 1 0]", n, order)
		}
	}
}

// TestBackwardLeavesHandedGradientAlone checks that a gradient handed to
// onLayer is final: zeroing it there (as an in-place allreduce may
// overwrite it) changes no other layer's gradient.
func TestBackwardLeavesHandedGradientAlone(t *testing.T) {
	m, _ := New([]int{InputDim, 8, 8, NumClasses}, 1)
	x, y := randomBatch(9, InputDim, NumClasses, 4)
	m.Forward(x, y)
	m.Backward(nil)
	want := cloneAll(m.Grads())
	m.Forward(x, y)
	got := make([][]float64, m.Layers())
	m.Backward(func(l int, g []float64) {
		got[l] = slices.Clone(g)
		clear(g)
	})
	for l := range want {
		if !slices.Equal(got[l], want[l]) {
			t.Errorf("layer %d: gradient differs when later layers are overwritten", l)
		}
	}
}

func TestZeroSizeBatch(t *testing.T) {
	m := NewDefault(1)
	opt := NewDefaultSGD(m)
	// A real step first, so stale gradients would show.
	x, y := randomBatch(4, InputDim, NumClasses, 5)
	m.Forward(x, y)
	m.Backward(nil)
	before := cloneAll(m.Params())

	loss, err := m.Forward(nil, nil)
	if err != nil || loss != 0 {
		t.Fatalf("Forward(empty) = %v, %v; want 0, nil", loss, err)
	}
	calls := 0
	m.Backward(func(int, []float64) { calls++ })
	if calls != m.Layers() {
		t.Errorf("onLayer called %d times, want %d", calls, m.Layers())
	}
	for l, g := range m.Grads() {
		for i, v := range g {
			if v != 0 {
				t.Fatalf("layer %d grad[%d] = %v after an empty batch, want 0", l, i, v)
			}
		}
	}
	if err := opt.Step(m.Params(), m.Grads()); err != nil {
		t.Fatal(err)
	}
	for l, p := range m.Params() {
		if !slices.Equal(p, before[l]) {
			t.Errorf("layer %d: a zero gradient with zero momentum moved the parameters", l)
		}
		for _, v := range p {
			if math.IsNaN(v) {
				t.Fatalf("layer %d: NaN parameter", l)
			}
		}
	}
	if got := m.Accuracy(NewDataset(1), nil); got != 0 {
		t.Errorf("Accuracy over no samples = %v, want 0", got)
	}
}

// TestSplitBatchMeanGradient checks the identity distributed training
// relies on: the full batch's mean gradient equals the share-weighted sum of
// the parts' mean gradients, Σ (bᵢ/B)·gᵢ.
func TestSplitBatchMeanGradient(t *testing.T) {
	ds := NewDataset(3)
	idx := make([]int64, 37)
	for i := range idx {
		idx[i] = int64(1000 + 7*i)
	}
	x, y := ds.Batch(idx, nil, nil)
	m, _ := New([]int{InputDim, 16, 12, NumClasses}, 9)
	meanGrad := func(x []float64, y []int) [][]float64 {
		if _, err := m.Forward(x, y); err != nil {
			t.Fatal(err)
		}
		m.Backward(nil)
		return cloneAll(m.Grads())
	}
	full := meanGrad(x, y)
	for _, cut := range []int{0, 1, 13, 36, 37} {
		a := meanGrad(x[:cut*InputDim], y[:cut])
		b := meanGrad(x[cut*InputDim:], y[cut:])
		wa, wb := float64(cut)/37, float64(37-cut)/37
		for l := range full {
			var scale, worst float64
			for i, v := range full[l] {
				scale = max(scale, math.Abs(v))
				worst = max(worst, math.Abs(wa*a[l][i]+wb*b[l][i]-v))
			}
			if worst > 1e-12*scale {
				t.Errorf("cut %d layer %d: weighted parts differ from the full batch by %g (max |g| %g)", cut, l, worst, scale)
			}
		}
	}
}

func TestTrainingIsDeterministic(t *testing.T) {
	run := func() (*Model, *SGD) {
		m := NewDefault(42)
		opt := NewDefaultSGD(m)
		trainLocal(t, m, opt, NewDataset(5), 0, 15, 64, 0, nil)
		return m, opt
	}
	m1, o1 := run()
	m2, o2 := run()
	for l := range m1.Params() {
		for i := range m1.Params()[l] {
			p1, p2 := m1.Params()[l][i], m2.Params()[l][i]
			v1, v2 := o1.Momentum()[l][i], o2.Momentum()[l][i]
			if math.Float64bits(p1) != math.Float64bits(p2) || math.Float64bits(v1) != math.Float64bits(v2) {
				t.Fatalf("layer %d element %d: runs differ (param %v vs %v, momentum %v vs %v)", l, i, p1, p2, v1, v2)
			}
		}
	}
	if m3 := NewDefault(43); slices.Equal(m3.Params()[0], NewDefault(42).Params()[0]) {
		t.Error("different model seeds gave the same initial weights")
	}
}

func TestSampleIsPureFunctionOfSeedAndIndex(t *testing.T) {
	a, b := NewDataset(7), NewDataset(7)
	idx := []int64{0, 1, 2, 99, TestStart, TestStart + 1, math.MaxInt64}
	xa := make([]float64, InputDim)
	xb := make([]float64, InputDim)
	// b visits the indices in reverse, after unrelated work, so any hidden
	// state carried between calls would show.
	b.Sample(12345, xb)
	for k := len(idx) - 1; k >= 0; k-- {
		ya := a.Sample(idx[k], xa)
		yb := b.Sample(idx[k], xb)
		if ya != yb || !slices.Equal(xa, xb) {
			t.Errorf("index %d: two Datasets of seed 7 disagree", idx[k])
		}
	}
	bx, by := a.Batch(idx, nil, nil)
	for k, i := range idx {
		y := a.Sample(i, xa)
		if y != by[k] || !slices.Equal(xa, bx[k*InputDim:(k+1)*InputDim]) {
			t.Errorf("Batch row %d differs from Sample(%d)", k, i)
		}
	}
	a.Sample(0, xa)
	a.Sample(1, xb)
	if slices.Equal(xa, xb) {
		t.Error("samples 0 and 1 are equal")
	}
	NewDataset(8).Sample(0, xb)
	if slices.Equal(xa, xb) {
		t.Error("seeds 7 and 8 give the same sample 0")
	}
}

func TestLabelDistribution(t *testing.T) {
	ds := NewDataset(1)
	for _, split := range []struct {
		name  string
		start int64
	}{{"train", 0}, {"test", TestStart}} {
		idx := make([]int64, 5000)
		for i := range idx {
			idx[i] = split.start + int64(i)
		}
		_, y := ds.Batch(idx, nil, nil)
		var counts [NumClasses]int
		for _, c := range y {
			counts[c]++
		}
		for c, n := range counts {
			if n == 0 || float64(n) > 0.4*float64(len(y)) {
				t.Errorf("%s: class %d has %d of %d samples: %v", split.name, c, n, len(y), counts)
			}
		}
		t.Logf("%s class counts %v", split.name, counts)
	}
}

func TestShapeErrors(t *testing.T) {
	for _, sizes := range [][]int{nil, {32}, {32, 0, 10}, {-1, 10}} {
		if _, err := New(sizes, 1); !errors.Is(err, ErrShape) {
			t.Errorf("New(%v) error %v, want ErrShape", sizes, err)
		}
	}
	m := NewDefault(1)
	if _, err := m.Forward(make([]float64, InputDim+1), []int{0}); !errors.Is(err, ErrShape) {
		t.Errorf("Forward with a short row: error %v, want ErrShape", err)
	}
	if _, err := m.Forward(make([]float64, InputDim), []int{NumClasses}); err == nil {
		t.Error("Forward accepted a label out of range")
	}
	opt := NewDefaultSGD(m)
	if err := opt.Step(m.Params(), m.Grads()[:1]); !errors.Is(err, ErrShape) {
		t.Errorf("Step with missing gradients: error %v, want ErrShape", err)
	}
	if err := opt.Step(NewLinear(1).Params(), NewLinear(1).Grads()); !errors.Is(err, ErrShape) {
		t.Errorf("Step with another model's tensors: error %v, want ErrShape", err)
	}
}

func TestSGDStep(t *testing.T) {
	p := [][]float64{{1, 2}}
	g := [][]float64{{0.5, -1}}
	opt := NewSGD(p, 0.1, 0.9)
	opt.WeightDecay = 0.01
	for range 2 {
		if err := opt.Step(p, g); err != nil {
			t.Fatal(err)
		}
	}
	// By hand: v1 = g + λp0, p1 = p0 − ηv1; v2 = μv1 + g + λp1, p2 = p1 − ηv2.
	for i, p0 := range []float64{1, 2} {
		v1 := g[0][i] + 0.01*p0
		p1 := p0 - 0.1*v1
		v2 := 0.9*v1 + g[0][i] + 0.01*p1
		p2 := p1 - 0.1*v2
		if math.Abs(p[0][i]-p2) > 1e-15 || math.Abs(opt.Momentum()[0][i]-v2) > 1e-15 {
			t.Errorf("element %d: p=%v v=%v, want p=%v v=%v", i, p[0][i], opt.Momentum()[0][i], p2, v2)
		}
	}
}

// TestGrowLeavesRoom: a buffer grown past its capacity gets a quarter to
// spare, zeroed, so shares creeping up reuse it; one that fits is reused.
func TestGrowLeavesRoom(t *testing.T) {
	s := grow(nil, 1000)
	if len(s) != 1000 || cap(s) < 1250 {
		t.Fatalf("grow(nil, 1000): len %d cap %d, want 1000 and at least 1250", len(s), cap(s))
	}
	for i, v := range s[:cap(s)] {
		if v != 0 {
			t.Fatalf("element %d of a new buffer is %v", i, v)
		}
	}
	s[0] = 7
	if r := grow(s, 1200); &r[0] != &s[0] || len(r) != 1200 || r[0] != 7 {
		t.Fatalf("grow within capacity reallocated or lost data")
	}
}

// TestEvalSamplesBoundMemory: a wide layer evaluates fewer samples at
// once, so that its activations stay within evalBytes.
func TestEvalSamplesBoundMemory(t *testing.T) {
	for _, tc := range []struct {
		sizes []int
		want  int
	}{{[]int{32, 128, 10}, evalChunk}, {[]int{32, 1450000, 10}, 5}, {[]int{32, 1 << 30, 10}, 1}} {
		m := &Model{sizes: tc.sizes}
		if got := m.evalSamples(); got != tc.want || got*8*tc.sizes[1] > evalBytes && got > 1 {
			t.Errorf("sizes %v: evaluates %d samples at once, want %d", tc.sizes, got, tc.want)
		}
	}
}
