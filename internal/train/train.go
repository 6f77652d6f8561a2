// Package train is the distributed training loop of the built-in MLP job,
// shared by `gyre train`, examples/mlp and `gyre bench overlap`. It follows
// the loop the gyre package documents: batch, forward, backward with each
// layer's gradient handed to AllReduceAsync as soon as it is ready, wait,
// step, boundary, commit.
package train

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/internal/mlp"
)

// Options configures Run.
type Options struct {
	// Iters stops training after this many iterations (counted from 0, so
	// the last is Iters-1). Required.
	Iters int64
	// TargetAcc stops training once the test accuracy reaches it. 0 never
	// stops early.
	TargetAcc float64
	// EvalEvery is how often, in iterations, the test accuracy is measured
	// and Progress called. Default 50.
	EvalEvery int64
	// TestSize is the number of test samples. Default mlp.DefaultTestSize
	// (all 10,000 of MNIST's).
	TestSize int
	// NoOverlap submits the gradients only after the whole backward pass,
	// for comparison; by default each layer's gradient is submitted as soon
	// as it is ready.
	NoOverlap bool
	// Progress, if set, is called after each evaluation, on every worker.
	Progress func(Progress)
	// OnIteration, if set, is called at the end of every committed
	// iteration, on every worker.
	OnIteration func(Iteration)
	// OnEvent, if set, is called on every worker at each membership
	// event: as Run starts (Joined, and Resumed if the job resumed from a
	// checkpoint), at a boundary that changes the view
	// (ViewChanged), after a recovery from lost workers (Recovered) or
	// one that left this worker out until it came back (Rejoined), and
	// as Run returns a lost worker's error (Lost).
	// Event.Lead picks one worker to show the job's events.
	OnEvent func(Event)
}

// Iteration is what OnIteration reports of one iteration.
type Iteration struct {
	Iter    int64
	Loss    float64   // the global mean loss
	Shares  []int     // the shares it ran with, in rank order
	Rank    int       // this worker's rank in it
	Seconds float64   // wall time from Batch to the end of its Boundary (no evaluation)
	Start   time.Time // when it began (Batch)
	// Epoch is the view it ran and was committed in; Global is the global
	// batch B, and Positions this worker's part [first, end) of the
	// iteration's sample positions [Iter·B, (Iter+1)·B).
	Epoch     uint64
	Global    int
	Positions [2]int64
}

// Progress is a report at an evaluation.
type Progress struct {
	Iter          int64   // iterations done
	Loss          float64 // the global mean loss of the last iteration
	Acc           float64 // test accuracy
	SamplesPerSec float64 // global samples per second since the start
	Shares        []int
	Elapsed       time.Duration
}

// Job is a model, its optimizer and its data: what one worker trains.
type Job struct {
	Model *mlp.Model
	Opt   *mlp.SGD
	Data  mlp.Data
}

// NewJob returns the default job: the default MLP with weights drawn from
// modelSeed, its default optimizer, and the dataset of dataSeed.
func NewJob(modelSeed, dataSeed uint64) *Job {
	m := mlp.NewDefault(modelSeed)
	return &Job{Model: m, Opt: mlp.NewDefaultSGD(m), Data: mlp.NewDataset(dataSeed)}
}

// NewSizedJob is NewJob with the MLP's layer sizes given (inputs, which
// must be mlp.InputDim, hidden widths, classes, mlp.NumClasses) and SGD's
// learning rate lr, with the default momentum.
func NewSizedJob(sizes []int, lr float64, modelSeed, dataSeed uint64) (*Job, error) {
	m, err := mlp.New(sizes, modelSeed)
	if err != nil {
		return nil, err
	}
	return &Job{Model: m, Opt: mlp.NewSGD(m.Params(), lr, mlp.DefaultMomentum), Data: mlp.NewDataset(dataSeed)}, nil
}

// NewDataJob returns a job that trains on data with recipe r: the model
// r.Sizes(data.InputWidth()) with r.Act, weights drawn from modelSeed, and
// momentum SGD at r.LR and r.Mu. r's batch and budgets are the caller's.
func NewDataJob(data mlp.Data, r mlp.Recipe, modelSeed uint64) (*Job, error) {
	m, err := mlp.NewWithActivation(r.Sizes(data.InputWidth()), r.Act, modelSeed)
	if err != nil {
		return nil, err
	}
	return &Job{Model: m, Opt: mlp.NewSGD(m.Params(), r.LR, r.Mu), Data: data}, nil
}

// State returns the job's state for gyre.WithState: every layer's
// parameters and momentum buffer.
func (j *Job) State() *gyre.State {
	s := gyre.NewState()
	for l, p := range j.Model.Params() {
		s.Float64(fmt.Sprintf("layer%d", l), p)
	}
	for l, v := range j.Opt.Momentum() {
		s.Float64(fmt.Sprintf("momentum%d", l), v)
	}
	return s
}

// Result is the outcome of Run.
type Result struct {
	Iters   int64   // iterations done
	Loss    float64 // the last iteration's global mean loss
	Acc     float64 // the final test accuracy
	Elapsed time.Duration
	// SamplesPerSec is global samples per second over the run.
	SamplesPerSec float64
	// Left says the worker left the job at its request (RequestLeave).
	Left bool
}

// Run trains j on w until o.Iters iterations are done or the test accuracy
// reaches o.TargetAcc. Every worker evaluates the same test samples with
// the same parameters, so all of them stop at the same iteration without
// exchanging a word.
func Run(ctx context.Context, w *gyre.Worker, j *Job, o Options) (Result, error) {
	if o.Iters <= 0 {
		return Result{}, errors.New("train: Iters must be positive")
	}
	if o.OnEvent == nil {
		o.OnEvent = func(Event) {}
	}
	o.OnEvent(newEvent(Joined, w))
	if r, ok := w.Resumed(); ok {
		e := newEvent(Resumed, w)
		e.From = r
		o.OnEvent(e)
	}
	res, err := run(ctx, w, j, o)
	if e, ok := lostEvent(w, err); ok {
		o.OnEvent(e)
	}
	return res, err
}

// run is Run's loop.
func run(ctx context.Context, w *gyre.Worker, j *Job, o Options) (Result, error) {
	if o.EvalEvery <= 0 {
		o.EvalEvery = 50
	}
	if o.TestSize <= 0 {
		o.TestSize = mlp.DefaultTestSize
	}
	testX, testLabels := j.Data.TestSet(o.TestSize) // made once
	layers := j.Model.Layers()
	names := make([]string, layers)
	for l := range names {
		names[l] = fmt.Sprintf("grad%d", l)
	}
	var (
		x       []float64
		labels  []int
		loss    = make([]float64, 1)
		ready   = make([]int, 0, layers)
		start   = time.Now()
		startIt = w.Iter()
		res     Result
	)
	for w.Iter() < o.Iters {
		began := time.Now()
		b := w.Batch()
		shares, rank, epoch := w.Shares(), w.Rank(), w.View().Epoch
		x, labels = j.Data.Batch(b.Indices, x, labels)
		end := w.StartSpan(gyre.SpanForward)
		l, err := j.Model.Forward(x, labels)
		end()
		if err != nil {
			return res, err
		}
		end = w.StartSpan(gyre.SpanBackward)
		ready = ready[:0]
		j.Model.Backward(func(layer int, grad []float64) {
			if o.NoOverlap {
				ready = append(ready, layer)
				return
			}
			w.AllReduceAsync64(ctx, names[layer], grad)
		})
		end()
		grads := j.Model.Grads()
		for _, layer := range ready {
			w.AllReduceAsync64(ctx, names[layer], grads[layer])
		}
		loss[0] = l
		w.AllReduceAsync64(ctx, "loss", loss)
		if err := w.Wait(ctx); err != nil && ctx.Err() != nil {
			return res, err
		} // else a lost worker: Boundary recovers, or says why it cannot
		end = w.StartSpan(gyre.SpanStep)
		err = j.Opt.Step(j.Model.Params(), grads)
		end()
		if err != nil {
			return res, err
		}
		change, err := w.Boundary(ctx)
		if err != nil {
			return res, err
		}
		switch {
		case change.Redo && slices.Contains(change.Admitted, ID(w)):
			o.OnEvent(newEvent(Rejoined, w))
		case change.Redo:
			e := newEvent(Recovered, w)
			e.Departed, e.Pending = change.Lost, change.Pending
			o.OnEvent(e)
		case change.ViewChanged && !change.Left:
			e := newEvent(ViewChanged, w)
			e.Admitted, e.Departed = change.Admitted, change.Departed
			o.OnEvent(e)
		}
		if change.Left {
			res.Iters, res.Loss, res.Left = change.Iter, loss[0], true
			return res, nil
		}
		if err := w.Commit(); err != nil { // after a Redo too: the state adopted in the new view
			return res, err
		}
		if change.Redo {
			continue // nothing was completed: the iteration at change.Iter runs next
		}
		res.Iters, res.Loss = w.Iter(), loss[0]
		w.ReportLoss(loss[0])
		if o.OnIteration != nil {
			o.OnIteration(Iteration{Iter: w.Iter() - 1, Loss: loss[0], Shares: shares, Rank: rank, Seconds: time.Since(began).Seconds(),
				Start: began, Epoch: epoch, Global: b.Global, Positions: [2]int64{b.Start, b.Start + int64(b.Share)}})
		}
		last := w.Iter() == o.Iters
		if w.Iter()%o.EvalEvery != 0 && !last {
			continue
		}
		end = w.StartSpan(gyre.SpanEval)
		res.Acc = j.Model.AccuracyOn(testX, testLabels)
		end()
		res.Elapsed = time.Since(start)
		res.SamplesPerSec = float64(w.Iter()-startIt) * float64(b.Global) / res.Elapsed.Seconds()
		if o.Progress != nil {
			o.Progress(Progress{Iter: w.Iter(), Loss: res.Loss, Acc: res.Acc, SamplesPerSec: res.SamplesPerSec,
				Shares: w.Shares(), Elapsed: res.Elapsed})
		}
		if o.TargetAcc > 0 && res.Acc >= o.TargetAcc {
			break
		}
	}
	return res, nil
}
