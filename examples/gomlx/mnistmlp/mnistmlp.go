// Package mnistmlp is the GoMLX model and data of the example trainer: a
// 784-128-128-10 ReLU MLP with softmax cross-entropy, trained with Adam on
// MNIST, one shuffled pass after another.
package mnistmlp

import (
	"fmt"
	"math/rand/v2"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	mlctx "github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/gomlx/gomlx/pkg/ml/layers/activations"

	"github.com/gyre-ml/gyre/datasets/mnist"
)

// Hidden is the width of the two hidden layers.
const Hidden = 128

// Logits builds the model over images [batch, 784] of pixels in [0, 1].
func Logits(ctx *mlctx.Context, images *graph.Node) *graph.Node {
	h := activations.Relu(layers.DenseWithBias(ctx.In("dense0"), images, Hidden))
	h = activations.Relu(layers.DenseWithBias(ctx.In("dense1"), h, Hidden))
	return layers.DenseWithBias(ctx.In("logits"), h, mnist.Classes)
}

// Loss is the per-example cross-entropy, the handoff.LossFn of the model:
// inputs are the images and their labels (int32).
func Loss(ctx *mlctx.Context, inputs []*graph.Node) *graph.Node {
	logp := graph.LogSoftmax(Logits(ctx, inputs[0]), -1)
	return graph.Neg(graph.ReduceSum(graph.Mul(graph.OneHot(inputs[1], mnist.Classes, dtypes.Float32), logp), -1))
}

// Sampler maps the job's sample indices to training images: index i is
// image perm_e[i mod N] of pass e = i / N, where perm_e is a permutation
// drawn from (seed, e). Every worker maps an index alike, whatever the
// number of workers.
type Sampler struct {
	set   *mnist.Set
	seed  uint64
	pass  int64
	perm  []int
	valid bool
}

// NewSampler returns a Sampler over set.
func NewSampler(set *mnist.Set, seed uint64) *Sampler { return &Sampler{set: set, seed: seed} }

// Image returns the training image of sample index i.
func (s *Sampler) Image(i int64) int {
	n := int64(s.set.N)
	if pass := i / n; !s.valid || pass != s.pass {
		s.perm = rand.New(rand.NewPCG(s.seed, uint64(pass))).Perm(s.set.N)
		s.pass, s.valid = pass, true
	}
	return s.perm[i%n]
}

// Batch holds the inputs of one step: rows images and labels, of which
// the first ones are real and the rest zero padding.
type Batch struct {
	Images, Labels *tensors.Tensor
	pixels         []float32
	labels         []int32
}

// NewBatch allocates a batch of rows rows.
func NewBatch(rows int) *Batch {
	return &Batch{pixels: make([]float32, rows*mnist.Pixels), labels: make([]int32, rows)}
}

// Rows is the batch's row count.
func (b *Batch) Rows() int { return len(b.labels) }

// Fill puts the images of sample indices idx (at most Rows of them) in the
// first rows, zeroes the rest, and builds the tensors.
func (b *Batch) Fill(set *mnist.Set, s *Sampler, idx []int64) error {
	if len(idx) > b.Rows() {
		return fmt.Errorf("mnistmlp: %d samples for a batch of %d rows", len(idx), b.Rows())
	}
	clear(b.pixels)
	clear(b.labels)
	for r, i := range idx {
		img := s.Image(i)
		Pixels(set, img, b.pixels[r*mnist.Pixels:(r+1)*mnist.Pixels])
		b.labels[r] = int32(set.Labels[img])
	}
	b.Images = tensors.FromFlatDataAndDimensions(b.pixels, b.Rows(), mnist.Pixels)
	b.Labels = tensors.FromFlatDataAndDimensions(b.labels, b.Rows())
	return nil
}

// Pixels writes image img of set into dst, scaled to [0, 1].
func Pixels(set *mnist.Set, img int, dst []float32) {
	for j, p := range set.Image(img) {
		dst[j] = float32(p) / 255
	}
}

// Evaluator measures test accuracy with a forward-only graph.
type Evaluator struct {
	exec  *mlctx.Exec
	set   *mnist.Set
	batch int
}

// NewEvaluator returns an Evaluator of the model in ctx over set, in
// batches of 1000 images (the last one may be shorter: a second compile).
func NewEvaluator(backend backends.Backend, ctx *mlctx.Context, set *mnist.Set) (*Evaluator, error) {
	exec, err := mlctx.NewExec(backend, ctx.Reuse(), func(ctx *mlctx.Context, images *graph.Node) *graph.Node {
		return graph.ArgMax(Logits(ctx, images), -1, dtypes.Int32)
	})
	if err != nil {
		return nil, err
	}
	return &Evaluator{exec: exec, set: set, batch: 1000}, nil
}

// Accuracy is the fraction of the set the model classifies right.
func (e *Evaluator) Accuracy() (float64, error) {
	right := 0
	buf := make([]float32, e.batch*mnist.Pixels)
	for start := 0; start < e.set.N; start += e.batch {
		n := min(e.batch, e.set.N-start)
		for r := range n {
			Pixels(e.set, start+r, buf[r*mnist.Pixels:(r+1)*mnist.Pixels])
		}
		out, err := e.exec.Exec(tensors.FromFlatDataAndDimensions(buf[:n*mnist.Pixels], n, mnist.Pixels))
		if err != nil {
			return 0, err
		}
		pred := tensors.MustCopyFlatData[int32](out[0])
		for r, p := range pred {
			if byte(p) == e.set.Labels[start+r] {
				right++
			}
		}
	}
	return float64(right) / float64(e.set.N), nil
}
