package mlp

import (
	"fmt"

	"gonum.org/v1/gonum/floats"
)

// SGD is stochastic gradient descent with momentum and optional weight
// decay, in PyTorch's formulation:
//
//	v ← μ·v + g + λ·p
//	p ← p − η·v
//
// The update is elementwise, so it is deterministic and every worker that
// holds the same parameters, momentum and (allreduced) gradient computes
// the same bits.
type SGD struct {
	LR          float64 // η, the learning rate
	Mu          float64 // μ, the momentum coefficient; 0 is plain SGD
	WeightDecay float64 // λ; 0 (the default) disables it
	velocity    [][]float64
}

// NewSGD returns an optimizer for parameters shaped like params, with zero
// momentum buffers.
func NewSGD(params [][]float64, lr, momentum float64) *SGD {
	v := make([][]float64, len(params))
	for l, p := range params {
		v[l] = make([]float64, len(p))
	}
	return &SGD{LR: lr, Mu: momentum, velocity: v}
}

// Momentum returns the momentum buffers, shaped like the parameters. They
// are the optimizer's own storage: a trainer registers them as state next
// to the parameters, so a commit or restore covers them too.
func (o *SGD) Momentum() [][]float64 { return o.velocity }

// Step applies one update to params from grads. Both must be shaped like
// the parameters NewSGD was given.
func (o *SGD) Step(params, grads [][]float64) error {
	if len(params) != len(o.velocity) || len(grads) != len(o.velocity) {
		return fmt.Errorf("%w: %d params, %d grads, %d momentum tensors", ErrShape, len(params), len(grads), len(o.velocity))
	}
	for l, v := range o.velocity {
		if len(params[l]) != len(v) || len(grads[l]) != len(v) {
			return fmt.Errorf("%w: layer %d: %d params, %d grads, %d momentum", ErrShape, l, len(params[l]), len(grads[l]), len(v))
		}
	}
	for l, v := range o.velocity {
		p, g := params[l], grads[l]
		floats.Scale(o.Mu, v)
		floats.Add(v, g)
		if o.WeightDecay != 0 {
			floats.AddScaled(v, o.WeightDecay, p)
		}
		floats.AddScaled(p, -o.LR, v)
	}
	return nil
}
