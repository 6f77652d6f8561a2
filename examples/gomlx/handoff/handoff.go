// Package handoff trains a GoMLX model data-parallel under Gyre. It splits
// a training step in two compiled graphs and hands the gradients to Gyre
// between them:
//
//  1. the gradient graph computes the local loss and the gradient of every
//     trainable variable over this worker's share of the batch;
//  2. the gradients are copied to host slices and averaged across the job
//     with Worker.AllReduceAsync, weighted by the workers' shares;
//  3. the update graph applies the averaged gradients with the optimizer
//     (its UpdateGraphWithGradients), exactly as a single process would.
//
// Every variable of the context (parameters, the optimizer's moments, its
// step counters, the random state) is mirrored into a gyre.State, so a
// Redo, a joiner and a restart from a checkpoint continue the same model
// and the same optimizer. Float tensors are registered as such; the
// integer ones (step counters, the random state) as metadata that carries
// their bytes exactly.
//
// Each distinct batch shape is a new compile. LB-BSP changes the shares,
// so Step pads the batch up to a multiple of Options.Bucket rows with a
// mask: the loss is still the mean over the real rows, and the gradient
// weighting stays exact.
package handoff

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	mlctx "github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"

	"github.com/gyre-ml/gyre"
)

// ErrCollective marks a Step error from Gyre's collectives (a lost
// worker): the trainer goes on to Boundary, which recovers. Any other
// Step error is this worker's own, and the trainer must stop: its peers
// then recover without it, as from any lost worker.
var ErrCollective = errors.New("handoff: the gradients' allreduce failed")

// LossFn builds the per-example loss: given the model's context and the
// batch's inputs (batch axis first), it returns a float32 tensor of shape
// [batch]. Padded rows are masked out after it, so it needs no mask.
type LossFn func(ctx *mlctx.Context, inputs []*graph.Node) *graph.Node

// GradientUpdater is an optimizer that can apply gradients computed
// elsewhere: GoMLX's Adam and SGD are.
type GradientUpdater interface {
	UpdateGraphWithGradients(ctx *mlctx.Context, grads []*graph.Node, lossDType dtypes.DType)
}

// Options tunes a Trainer.
type Options struct {
	// Bucket rounds the rows of each step up to a multiple of itself, so
	// that shares that differ by less share one compiled graph. 0 or 1
	// compiles every share's exact shape.
	Bucket int
}

// Timings says where a Trainer's completed steps spent their time.
type Timings struct {
	Steps    int
	Compiles int           // new batch shapes compiled
	Compile  time.Duration // compiling them
	Parts
}

// Parts are one step's times, or their sums.
type Parts struct {
	Gradient time.Duration // the gradient graph
	CopyOut  time.Duration // gradients to host slices
	Reduce   time.Duration // AllReduceAsync and Wait
	CopyIn   time.Duration // averaged gradients back to tensors
	Update   time.Duration // the update graph
	Mirror   time.Duration // variables into the gyre.State slices
}

// Trainer runs the two graphs and the hand-off between them.
type Trainer struct {
	backend backends.Backend
	ctx     *mlctx.Context
	opts    Options

	grad, update *mlctx.Exec
	trainable    []*mlctx.Variable // in the gradients' order
	gradHost     [][]float32       // per trainable variable
	gradTensor   []*tensors.Tensor // the same, as the update graph's inputs
	mirror       []mirrored
	compiled     map[int]bool // bucketed row counts compiled

	timings Timings
	last    Parts
}

// mirrored is one variable and the slice or metadata that holds it in the
// gyre.State.
type mirrored struct {
	v   *mlctx.Variable
	f32 []float32
	f64 []float64
	raw *rawBytes
}

// New returns a Trainer of the model whose per-example loss is loss, with
// the optimizer opt (for example optimizers.Adam().Done()). Call Register
// next. The optimizer's own variables must start at zero, as those of
// GoMLX's Adam, RMSProp and SGD do (see compileUpdate).
func New(backend backends.Backend, ctx *mlctx.Context, loss LossFn, opt optimizers.Interface, opts Options) (*Trainer, error) {
	up, ok := opt.(GradientUpdater)
	if !ok {
		return nil, fmt.Errorf("handoff: optimizer %T cannot apply gradients computed apart (it lacks UpdateGraphWithGradients)", opt)
	}
	t := &Trainer{backend: backend, ctx: ctx, opts: opts, compiled: make(map[int]bool)}
	var err error
	t.grad, err = mlctx.NewExec(backend, ctx, func(ctx *mlctx.Context, in []*graph.Node) []*graph.Node {
		// The last two inputs are the mask (1 for real rows) and the real
		// row count, so one graph serves every share of a bucket.
		mask, count := in[len(in)-2], in[len(in)-1]
		perExample := loss(ctx, in[:len(in)-2])
		l := graph.Div(graph.ReduceAllSum(graph.Mul(perExample, mask)), count)
		return append([]*graph.Node{l}, ctx.BuildTrainableVariablesGradientsGraph(l)...)
	})
	if err != nil {
		return nil, fmt.Errorf("handoff: gradient graph: %w", err)
	}
	// GoMLX fails a step past 32 cached shapes; exact shapes can reach B.
	t.grad.SetMaxCache(-1)
	t.update, err = mlctx.NewExec(backend, ctx, func(ctx *mlctx.Context, grads []*graph.Node) *graph.Node {
		g := grads[0].Graph()
		// The optimizer updates the trainable variables this graph uses,
		// in context order: the gradient graph's order.
		for _, v := range t.trainable {
			v.ValueGraph(g)
		}
		up.UpdateGraphWithGradients(ctx, grads, dtypes.Float32)
		return graph.ScalarZero(g, dtypes.Float32)
	})
	if err != nil {
		return nil, fmt.Errorf("handoff: update graph: %w", err)
	}
	return t, nil
}

// Register builds both graphs once, for example inputs of rows rows
// (batch axis first), so that every variable exists: the model's, created
// by the gradient graph, and the optimizer's, created by the update graph.
// It then registers them all in state, in the context's order, under
// their scoped names. It runs nothing, so the variables keep their
// initial values until Join replaces them with the job's.
func (t *Trainer) Register(state *gyre.State, inputs ...*tensors.Tensor) error {
	if len(inputs) == 0 {
		return errors.New("handoff: Register needs example inputs")
	}
	rows := inputs[0].Shape().Dimensions[0]
	if err := t.compileFor(rows, inputs); err != nil {
		return err
	}
	for v := range t.ctx.IterVariables() {
		if v.Trainable {
			t.trainable = append(t.trainable, v)
			t.gradHost = append(t.gradHost, make([]float32, v.Shape().Size()))
			t.gradTensor = append(t.gradTensor, tensors.FromShape(v.Shape()))
		}
	}
	if len(t.trainable) == 0 {
		return errors.New("handoff: the model has no trainable variables")
	}
	for _, v := range t.trainable {
		if v.DType() != dtypes.Float32 {
			return fmt.Errorf("handoff: trainable variable %s is %s; only float32 gradients are averaged", v.ScopeAndName(), v.DType())
		}
	}
	if err := t.compileUpdate(); err != nil {
		return err
	}
	for v := range t.ctx.IterVariables() {
		m := mirrored{v: v}
		name := v.ScopeAndName()
		switch v.DType() {
		case dtypes.Float32:
			m.f32 = make([]float32, v.Shape().Size())
			state.Float32(name, m.f32)
		case dtypes.Float64:
			m.f64 = make([]float64, v.Shape().Size())
			state.Float64(name, m.f64)
		default: // step counters, the random state: carried exactly, as bytes
			m.raw = &rawBytes{name: name, b: make([]byte, v.Shape().Memory())}
			state.Meta(name, m.raw)
		}
		t.mirror = append(t.mirror, m)
	}
	return t.Store()
}

// compileUpdate builds the update graph, which creates the optimizer's
// variables. GoMLX's PreCompile hands the graph the buffers of the
// variables it updates, as a run would, and leaves them without values:
// the model's parameters get back the values they had, and the
// optimizer's new variables start at zero, as the moments and step
// counters of GoMLX's Adam, RMSProp and SGD do.
func (t *Trainer) compileUpdate() error {
	before := map[*mlctx.Variable]*tensors.Tensor{}
	for v := range t.ctx.IterVariables() {
		val, err := v.Value()
		if err != nil {
			return fmt.Errorf("handoff: %s: %w", v.ScopeAndName(), err)
		}
		if before[v], err = cloneTensor(val); err != nil {
			return fmt.Errorf("handoff: %s: %w", v.ScopeAndName(), err)
		}
	}
	if err := t.update.PreCompile(toAny(t.gradTensor)...); err != nil {
		return fmt.Errorf("handoff: update graph: %w", err)
	}
	for v := range t.ctx.IterVariables() {
		if v.HasValue() {
			continue
		}
		val, ok := before[v]
		if !ok {
			val = tensors.FromShape(v.Shape()) // zeros
		}
		if err := v.SetValue(val); err != nil {
			return fmt.Errorf("handoff: %s: %w", v.ScopeAndName(), err)
		}
	}
	return nil
}

func cloneTensor(t *tensors.Tensor) (*tensors.Tensor, error) {
	c := tensors.FromShape(t.Shape())
	err := t.ConstBytes(func(src []byte) {
		err := c.MutableBytes(func(dst []byte) { copy(dst, src) })
		if err != nil {
			panic(err)
		}
	})
	return c, err
}

// Bucketed is the number of rows Step needs for a share of rows real ones.
func (t *Trainer) Bucketed(rows int) int {
	b := max(t.opts.Bucket, 1)
	return max((rows+b-1)/b*b, b)
}

// Step runs one iteration over this worker's share: inputs hold
// Bucketed(share) rows (batch axis first), of which the first share are
// real and the rest padding. It computes the gradients, averages them
// across the job under w, applies them, and mirrors every variable into
// the state. It returns the local mean loss. On an error from the
// collectives (errors.Is(err, ErrCollective)) the update is skipped; the
// trainer goes on to Boundary, which recovers, and calls Load after a
// Redo. Any other error leaves this worker out of step with the others
// (it submitted no gradients, or its update failed): the trainer must
// stop.
func (t *Trainer) Step(ctx context.Context, w *gyre.Worker, share int, inputs ...*tensors.Tensor) (float64, error) {
	rows := t.Bucketed(share)
	if len(inputs) == 0 || inputs[0].Shape().Dimensions[0] != rows {
		return 0, fmt.Errorf("handoff: step of share %d wants inputs of %d rows (Bucketed)", share, rows)
	}
	if !t.compiled[rows] {
		if err := t.compileFor(rows, inputs); err != nil {
			return 0, err
		}
	}
	args := append(make([]any, 0, len(inputs)+2), toAny(inputs)...)
	args = append(args, mask(rows, share), tensors.FromScalar(float32(max(share, 1))))

	t.last = Parts{}
	start := time.Now()
	out, err := t.grad.Exec(args...)
	if err != nil {
		return 0, fmt.Errorf("handoff: gradient graph: %w", err)
	}
	loss := float64(tensors.ToScalar[float32](out[0]))
	lap := time.Now()
	t.last.Gradient = lap.Sub(start)

	if len(out)-1 != len(t.trainable) {
		return 0, fmt.Errorf("handoff: the loss has gradients for %d variables, the context %d trainable ones: "+
			"a trainable variable the loss does not use must be made untrainable", len(out)-1, len(t.trainable))
	}
	for i, g := range out[1:] {
		if g.Shape().Size() != len(t.gradHost[i]) {
			return 0, fmt.Errorf("handoff: gradient %d is %s, variable %s is %s", i, g.Shape(), t.trainable[i].ScopeAndName(), t.trainable[i].Shape())
		}
		if err := tensors.ConstFlatData(g, func(flat []float32) { copy(t.gradHost[i], flat) }); err != nil {
			return 0, fmt.Errorf("handoff: gradient of %s: %w", t.trainable[i].ScopeAndName(), err)
		}
		if err := g.FinalizeAll(); err != nil {
			return 0, fmt.Errorf("handoff: gradient of %s: %w", t.trainable[i].ScopeAndName(), err)
		}
	}
	lap = t.since(lap, &t.last.CopyOut)

	for i, g := range t.gradHost {
		w.AllReduceAsync(ctx, t.trainable[i].ScopeAndName(), g)
	}
	err = w.Wait(ctx)
	lap = t.since(lap, &t.last.Reduce)
	if err != nil {
		return loss, fmt.Errorf("%w: %w", ErrCollective, err)
	}

	for i, g := range t.gradTensor {
		if err := tensors.MutableFlatData(g, func(flat []float32) { copy(flat, t.gradHost[i]) }); err != nil {
			return loss, fmt.Errorf("handoff: gradient of %s: %w", t.trainable[i].ScopeAndName(), err)
		}
	}
	lap = t.since(lap, &t.last.CopyIn)

	if _, err := t.update.Exec(toAny(t.gradTensor)...); err != nil {
		return loss, fmt.Errorf("handoff: update graph: %w", err)
	}
	lap = t.since(lap, &t.last.Update)

	if err := t.Store(); err != nil {
		return loss, err
	}
	t.since(lap, &t.last.Mirror)
	t.timings.Steps++
	t.timings.Parts = t.timings.plus(t.last)
	return loss, nil
}

func (t *Trainer) since(lap time.Time, d *time.Duration) time.Time {
	now := time.Now()
	*d += now.Sub(lap)
	return now
}

// compileFor compiles the gradient graph for rows rows, timing it apart
// from the steps.
func (t *Trainer) compileFor(rows int, inputs []*tensors.Tensor) error {
	start := time.Now()
	args := append(toAny(inputs), mask(rows, rows), tensors.FromScalar(float32(rows)))
	if err := t.grad.PreCompile(args...); err != nil {
		return fmt.Errorf("handoff: gradient graph for %d rows: %w", rows, err)
	}
	t.compiled[rows] = true
	t.timings.Compiles++
	t.timings.Compile += time.Since(start)
	return nil
}

// Store copies every variable's value into its gyre.State slice or
// metadata. Step does it after each update.
func (t *Trainer) Store() error {
	for _, m := range t.mirror {
		val, err := m.v.Value()
		if err != nil {
			return fmt.Errorf("handoff: store %s: %w", m.v.ScopeAndName(), err)
		}
		switch {
		case m.f32 != nil:
			err = tensors.ConstFlatData(val, func(flat []float32) { copy(m.f32, flat) })
		case m.f64 != nil:
			err = tensors.ConstFlatData(val, func(flat []float64) { copy(m.f64, flat) })
		default:
			err = val.ConstBytes(func(b []byte) { copy(m.raw.b, b) })
		}
		if err != nil {
			return fmt.Errorf("handoff: store %s: %w", m.v.ScopeAndName(), err)
		}
	}
	return nil
}

// Load copies the gyre.State's values into the variables. Call it after
// Join (which gives a joiner the job's state, and a restarted job its
// checkpoint's) and after every Boundary that returned Redo.
func (t *Trainer) Load() error {
	for _, m := range t.mirror {
		var val *tensors.Tensor
		dims := m.v.Shape().Dimensions
		switch {
		case m.f32 != nil:
			val = tensors.FromFlatDataAndDimensions(m.f32, dims...)
		case m.f64 != nil:
			val = tensors.FromFlatDataAndDimensions(m.f64, dims...)
		default:
			val = tensors.FromShape(m.v.Shape())
			if err := val.MutableBytes(func(b []byte) { copy(b, m.raw.b) }); err != nil {
				return fmt.Errorf("handoff: load %s: %w", m.v.ScopeAndName(), err)
			}
		}
		if err := m.v.SetValue(val); err != nil {
			return fmt.Errorf("handoff: load %s: %w", m.v.ScopeAndName(), err)
		}
	}
	return nil
}

// Timings returns the time spent so far, by part.
func (t *Trainer) Timings() Timings { return t.timings }

// Gradients returns the host slices that hold the last step's averaged
// gradients, one per trainable variable, in the context's order. They are
// reused by the next step.
func (t *Trainer) Gradients() [][]float32 { return t.gradHost }

// Last returns the last step's times.
func (t *Trainer) Last() Parts { return t.last }

// plus is the sum of p and q, part by part.
func (p Parts) plus(q Parts) Parts {
	return Parts{Gradient: p.Gradient + q.Gradient, CopyOut: p.CopyOut + q.CopyOut, Reduce: p.Reduce + q.Reduce,
		CopyIn: p.CopyIn + q.CopyIn, Update: p.Update + q.Update, Mirror: p.Mirror + q.Mirror}
}

// Variables names the mirrored variables, in the state's order.
func (t *Trainer) Variables() []string {
	names := make([]string, len(t.mirror))
	for i, m := range t.mirror {
		names[i] = m.v.ScopeAndName()
	}
	return names
}

func mask(rows, share int) *tensors.Tensor {
	m := make([]float32, rows)
	for i := range min(share, rows) {
		m[i] = 1
	}
	return tensors.FromFlatDataAndDimensions(m, rows)
}

func toAny(ts []*tensors.Tensor) []any {
	out := make([]any, len(ts))
	for i, t := range ts {
		out[i] = t
	}
	return out
}

// rawBytes carries a non-float variable exactly, as gyre.Metadata.
type rawBytes struct {
	name string
	b    []byte
}

func (r *rawBytes) MarshalBinary() ([]byte, error) { return slices.Clone(r.b), nil }

func (r *rawBytes) UnmarshalBinary(b []byte) error {
	if len(b) != len(r.b) {
		return fmt.Errorf("handoff: %s holds %d bytes here and %d in the job's state", r.name, len(r.b), len(b))
	}
	copy(r.b, b)
	return nil
}
