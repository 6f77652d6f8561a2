package mlp

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas64"
)

// Activation is the non-linearity of the hidden layers.
type Activation int

const (
	// Tanh is the hyperbolic tangent, the teacher's own non-linearity.
	Tanh Activation = iota
	// ReLU is max(0, x).
	ReLU
)

// ErrShape reports sizes or buffers whose dimensions do not fit.
var ErrShape = errors.New("mlp: shape mismatch")

// Model is a fully connected classifier: hidden layers with an Activation,
// a linear output layer, and softmax cross-entropy loss.
//
// Layer l maps sizes[l] inputs to sizes[l+1] outputs. Its parameters are
// one flat slice, W (sizes[l]×sizes[l+1], row-major) followed by b
// (sizes[l+1]), so each layer's gradient is one tensor for the allreduce.
//
// A Model is not safe for concurrent use. Its results depend only on its
// parameters and inputs: the same inputs give bit-identical outputs.
type Model struct {
	sizes  []int
	act    Activation
	params [][]float64
	grads  [][]float64
	train  workspace // Forward's activations, kept for Backward
	eval   workspace // Accuracy's scratch, so evaluating never clobbers train
	procs  int       // goroutines per matrix product; 0: gonum's GOMAXPROCS
}

// workspace holds one batch's activations. a[0] is the input, a[l+1] the
// output of layer l after its activation; the last is the softmax output.
type workspace struct {
	n      int
	a      [][]float64
	labels []int
	d0, d1 []float64 // backward deltas, alternating
}

// New returns a model with the given layer sizes (input first, number of
// classes last; at least two) and tanh hidden layers. Weights are drawn
// from N(0, 1/fan_in) (LeCun initialisation, the right scale for tanh)
// with a source seeded by seed; biases start at zero.
func New(sizes []int, seed uint64) (*Model, error) {
	return NewWithActivation(sizes, Tanh, seed)
}

// NewWithActivation is New with a choice of hidden activation. ReLU layers
// are drawn from N(0, 2/fan_in) (He initialisation).
func NewWithActivation(sizes []int, act Activation, seed uint64) (*Model, error) {
	if len(sizes) < 2 {
		return nil, fmt.Errorf("%w: need at least 2 sizes, got %d", ErrShape, len(sizes))
	}
	for _, s := range sizes {
		if s <= 0 {
			return nil, fmt.Errorf("%w: sizes must be positive, got %v", ErrShape, sizes)
		}
	}
	if act != Tanh && act != ReLU {
		return nil, fmt.Errorf("mlp: unknown activation %d", act)
	}
	m := &Model{sizes: append([]int(nil), sizes...), act: act}
	r := rand.New(rand.NewPCG(mix(seed), 0x1417_0000_0000_0001))
	for l := 0; l < len(sizes)-1; l++ {
		in, out := sizes[l], sizes[l+1]
		p := make([]float64, in*out+out)
		gain := 1.0
		if act == ReLU && l < len(sizes)-2 {
			gain = math.Sqrt2
		}
		std := gain / math.Sqrt(float64(in))
		for i := range p[:in*out] {
			p[i] = std * r.NormFloat64()
		}
		m.params = append(m.params, p)
		m.grads = append(m.grads, make([]float64, len(p)))
	}
	return m, nil
}

// NewLinear returns softmax regression on the task (no hidden layer), the
// baseline the MLP has to beat.
func NewLinear(seed uint64) *Model {
	m, err := New([]int{InputDim, NumClasses}, seed)
	if err != nil {
		panic(err) // unreachable: the sizes are constants
	}
	return m
}

// SetProcs bounds the goroutines each matrix product runs on, the caller's
// included; procs <= 0 (the default) lets gonum run up to GOMAXPROCS. A
// trainer leaves CPU to the transport with SetProcs(ComputeProcs()).
// Results do not depend on procs: every setting sums in the same order.
func (m *Model) SetProcs(procs int) { m.procs = max(procs, 0) }

// Procs returns the bound SetProcs set (0: gonum's own, GOMAXPROCS).
func (m *Model) Procs() int { return m.procs }

// Sizes returns the layer sizes.
func (m *Model) Sizes() []int { return append([]int(nil), m.sizes...) }

// Layers returns the number of layers (len(Sizes())-1), which is also the
// number of parameter and gradient tensors.
func (m *Model) Layers() int { return len(m.params) }

// Params returns the parameters, one flat slice per layer (W then b). The
// slices are the model's own storage, so a trainer can register them as
// state, broadcast into them or restore them in place.
func (m *Model) Params() [][]float64 { return m.params }

// Grads returns the gradient buffers, with the same shapes as Params.
// After Backward they hold the mean gradient over the last Forward's batch.
func (m *Model) Grads() [][]float64 { return m.grads }

// NumParams returns the total number of parameters.
func (m *Model) NumParams() int {
	n := 0
	for _, p := range m.params {
		n += len(p)
	}
	return n
}

// Forward runs the model on a batch of len(labels) samples, x holding them
// row-major (len(labels)×Sizes()[0]), keeps the activations for Backward,
// and returns the mean cross-entropy loss. An empty batch is allowed and
// has loss 0.
func (m *Model) Forward(x []float64, labels []int) (float64, error) {
	return m.forward(&m.train, x, labels)
}

func (m *Model) forward(ws *workspace, x []float64, labels []int) (float64, error) {
	n := len(labels)
	if len(x) != n*m.sizes[0] {
		return 0, fmt.Errorf("%w: %d labels need %d inputs, got %d", ErrShape, n, n*m.sizes[0], len(x))
	}
	classes := m.sizes[len(m.sizes)-1]
	for _, y := range labels {
		if y < 0 || y >= classes {
			return 0, fmt.Errorf("mlp: label %d outside [0, %d)", y, classes)
		}
	}
	ws.n = n
	ws.labels = labels
	if len(ws.a) == 0 {
		ws.a = make([][]float64, len(m.sizes))
	}
	ws.a[0] = x
	if n == 0 {
		return 0, nil
	}
	last := len(m.params) - 1
	for l, p := range m.params {
		in, out := m.sizes[l], m.sizes[l+1]
		z := grow(ws.a[l+1], n*out)
		ws.a[l+1] = z
		w, b := p[:in*out], p[in*out:]
		for r := 0; r < n; r++ {
			copy(z[r*out:(r+1)*out], b)
		}
		// z = a·W + 1·bᵀ: gonum's Dgemm runs blocks in goroutines for large
		// shapes, but each output block sums over k in a fixed order, so
		// the result depends only on the shapes, never on scheduling.
		gemm(m.procs, blas.NoTrans, blas.NoTrans,
			general(n, in, ws.a[l]), general(in, out, w), 1, general(n, out, z))
		if l < last {
			m.activate(z)
		}
	}
	return softmaxLoss(ws.a[len(ws.a)-1], labels, classes), nil
}

func (m *Model) activate(z []float64) {
	switch m.act {
	case Tanh:
		for i, v := range z {
			z[i] = math.Tanh(v)
		}
	case ReLU:
		for i, v := range z {
			z[i] = max(v, 0)
		}
	}
}

// softmaxLoss replaces each row of logits by its softmax and returns the
// mean of −log p[label]. It subtracts the row maximum first so exp never
// overflows, and takes the log from the log-sum-exp, not from a rounded p.
func softmaxLoss(z []float64, labels []int, classes int) float64 {
	var loss float64
	for r, y := range labels {
		row := z[r*classes : (r+1)*classes]
		mx := row[0]
		for _, v := range row[1:] {
			mx = max(mx, v)
		}
		zy := row[y] - mx // read before the row is overwritten by exp
		var sum float64
		for j, v := range row {
			e := math.Exp(v - mx)
			row[j] = e
			sum += e
		}
		loss += math.Log(sum) - zy
		inv := 1 / sum
		for j := range row {
			row[j] *= inv
		}
	}
	return loss / float64(len(labels))
}

// Backward computes the mean gradient over the last Forward's batch into
// Grads, layer by layer from the last to the first. It calls onLayer(l,
// Grads()[l]) as soon as layer l's gradient is complete, before any work on
// layer l−1, so a trainer can start that tensor's allreduce while the
// earlier layers are still being computed. Backward never reads or writes
// Grads()[l] again after handing it to onLayer, so the allreduce may
// work on it in place. onLayer may be nil.
//
// After an empty batch (or with no Forward at all) every gradient is zero
// and onLayer is still called for every layer, so every rank issues the
// same collectives.
func (m *Model) Backward(onLayer func(layer int, grad []float64)) {
	ws := &m.train
	n := ws.n
	if n == 0 {
		for l := len(m.grads) - 1; l >= 0; l-- {
			clear(m.grads[l])
			if onLayer != nil {
				onLayer(l, m.grads[l])
			}
		}
		return
	}
	// The output delta is (p − onehot(y)) / n: the 1/n of the batch mean is
	// applied once here and flows linearly into every layer's gradient.
	classes := m.sizes[len(m.sizes)-1]
	delta := grow(ws.d0, n*classes)
	ws.d0 = delta
	copy(delta, ws.a[len(ws.a)-1])
	inv := 1 / float64(n)
	for r, y := range ws.labels {
		delta[r*classes+y] -= 1
	}
	for i := range delta {
		delta[i] *= inv
	}
	other := ws.d1
	for l := len(m.params) - 1; l >= 0; l-- {
		in, out := m.sizes[l], m.sizes[l+1]
		g := m.grads[l]
		gw, gb := g[:in*out], g[in*out:]
		// dW = aᵀ·delta; db = column sums of delta, row by row in order.
		gemm(m.procs, blas.Trans, blas.NoTrans,
			general(n, in, ws.a[l]), general(n, out, delta), 0, general(in, out, gw))
		clear(gb)
		for r := 0; r < n; r++ {
			for j, v := range delta[r*out : (r+1)*out] {
				gb[j] += v
			}
		}
		if onLayer != nil {
			onLayer(l, g)
		}
		if l == 0 {
			break
		}
		// The delta for layer l−1's output: (delta·Wᵀ) ⊙ act'(a[l]).
		next := grow(other, n*in)
		gemm(m.procs, blas.NoTrans, blas.Trans,
			general(n, out, delta), general(in, out, m.params[l][:in*out]), 0, general(n, in, next))
		h := ws.a[l]
		switch m.act {
		case Tanh:
			for i, v := range h {
				next[i] *= 1 - v*v
			}
		case ReLU:
			for i, v := range h {
				if v <= 0 {
					next[i] = 0
				}
			}
		}
		delta, other = next, delta
	}
	ws.d0, ws.d1 = delta, other
}

// evalChunk bounds the batch Accuracy evaluates at once, and evalBytes
// the activations that batch holds: a wide layer evaluates fewer samples
// at once, so that evaluating never needs more memory than training a
// modest batch (1024 samples of a 1.45-million-wide layer were 12 GB).
const (
	evalChunk = 1024
	evalBytes = 64 << 20
)

// evalSamples is how many samples the model evaluates at once.
func (m *Model) evalSamples() int {
	return max(1, min(evalChunk, evalBytes/(8*slices.Max(m.sizes))))
}

// Accuracy returns the fraction of the samples with the given indices that
// the model classifies correctly (0 for no indices). It uses its own
// scratch space, so it may run between Forward and Backward.
func (m *Model) Accuracy(ds *Dataset, indices []int64) float64 {
	var x []float64
	var labels []int
	correct := 0
	step := m.evalSamples()
	for start := 0; start < len(indices); start += step {
		chunk := indices[start:min(start+step, len(indices))]
		x, labels = ds.Batch(chunk, x, labels)
		correct += m.correct(x, labels)
	}
	if len(indices) == 0 {
		return 0
	}
	return float64(correct) / float64(len(indices))
}

// AccuracyOn is Accuracy over samples already generated (x row-major, as
// Dataset.Batch fills it), for trainers that evaluate one cached test set
// many times. It returns 0 for no samples or mismatched shapes.
func (m *Model) AccuracyOn(x []float64, labels []int) float64 {
	in := m.sizes[0]
	if len(labels) == 0 || len(x) != len(labels)*in {
		return 0
	}
	correct := 0
	step := m.evalSamples()
	for start := 0; start < len(labels); start += step {
		end := min(start+step, len(labels))
		correct += m.correct(x[start*in:end*in], labels[start:end])
	}
	return float64(correct) / float64(len(labels))
}

// correct returns how many of the samples the model classifies correctly.
func (m *Model) correct(x []float64, labels []int) int {
	if _, err := m.forward(&m.eval, x, labels); err != nil {
		return 0 // shapes or labels that do not fit this model
	}
	classes := m.sizes[len(m.sizes)-1]
	p := m.eval.a[len(m.eval.a)-1]
	n := 0
	for r, y := range labels {
		if argmax(p[r*classes:(r+1)*classes]) == y {
			n++
		}
	}
	return n
}

// general views a row-major slice as a rows×cols blas64 matrix.
func general(rows, cols int, data []float64) blas64.General {
	return blas64.General{Rows: rows, Cols: cols, Stride: cols, Data: data[:rows*cols]}
}
