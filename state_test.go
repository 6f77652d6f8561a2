package gyre

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestCommitRestore(t *testing.T) {
	a := []float32{1, 2, 3}
	b := []float64{4, 5}
	m := &counter{epoch: 1, label: "x"}
	s := NewState().Float32("a", a).Float64("b", b).Meta("m", m)
	if _, err := s.restore(); err == nil {
		t.Fatal("restore before any commit succeeded")
	}
	d0, _ := s.Digest()
	if err := s.commit(7); err != nil {
		t.Fatal(err)
	}
	a[0], b[1], m.epoch, m.label = 9, 9, 9, "changed"
	if d, _ := s.Digest(); d == d0 {
		t.Fatal("digest did not change with the state")
	}
	iter, err := s.restore()
	if err != nil || iter != 7 {
		t.Fatalf("restore = %d, %v", iter, err)
	}
	if !slices.Equal(a, []float32{1, 2, 3}) || !slices.Equal(b, []float64{4, 5}) || *m != (counter{1, "x"}) {
		t.Fatalf("restored %v %v %+v", a, b, *m)
	}
	if d, _ := s.Digest(); d != d0 {
		t.Fatal("digest differs after restore")
	}
}

func TestStateRegistrationErrors(t *testing.T) {
	for name, s := range map[string]*State{
		"empty name": NewState().Float32("", nil),
		"twice":      NewState().Float32("a", nil).Float64("a", nil),
		"nil meta":   NewState().Meta("m", nil),
	} {
		if !errors.Is(s.Err(), ErrConfig) {
			t.Errorf("%s: Err = %v, want ErrConfig", name, s.Err())
		}
	}
	if NewState().Float32("a", nil).layout() == NewState().Float64("a", nil).layout() {
		t.Error("layout ignores the kind")
	}
}

// toy is a linear least-squares model trained with SGD and momentum: small
// enough to check exactly, with state of every kind.
type toy struct {
	theta, mom []float64
	steps      *counter
}

const toyDim = 8

func newToy() *toy {
	return &toy{theta: make([]float64, toyDim), mom: make([]float64, toyDim), steps: &counter{}}
}

func (m *toy) state() *State {
	return NewState().Float64("theta", m.theta).Float64("momentum", m.mom).Meta("steps", m.steps)
}

// grad returns the mean gradient of ½(x·θ - y)² over the samples.
func (m *toy) grad(idx []int64) []float64 {
	g := make([]float64, toyDim)
	x := make([]float64, toyDim)
	for _, i := range idx {
		rng := rand.New(rand.NewPCG(uint64(i), 3))
		y := 0.0
		for j := range x {
			x[j] = rng.NormFloat64()
			y += x[j] * float64(j+1)
		}
		pred := 0.0
		for j := range x {
			pred += x[j] * m.theta[j]
		}
		for j := range g {
			g[j] += (pred - y) * x[j]
		}
	}
	for j := range g {
		g[j] /= float64(max(len(idx), 1))
	}
	return g
}

func (m *toy) step(g []float64) {
	for j := range m.theta {
		m.mom[j] = 0.9*m.mom[j] + g[j]
		m.theta[j] -= 0.05 * m.mom[j]
	}
	m.steps.epoch++
}

// train runs iters iterations of the toy on w. If failAt >= 0, the
// iteration failAt fails midway once, on every worker: after submitting
// half of the gradient and corrupting the model, as a trainer whose own
// code errs would; the trainer abandons it and redoes it.
func train(ctx context.Context, w *Worker, m *toy, iters, failAt int64, check func(*toy) error) error {
	failed := false
	var abandoned []int64 // the indices of the abandoned attempt
	for w.Iter() < iters {
		b := w.Batch()
		if w.Iter() == failAt && failed && !slices.Equal(b.Indices, abandoned) {
			return fmt.Errorf("the redone iteration %d got indices %v, the abandoned one %v", failAt, b.Indices, abandoned)
		}
		g := m.grad(b.Indices)
		if w.Iter() == failAt && !failed {
			failed = true
			abandoned = slices.Clone(b.Indices)
			committed := &toy{theta: slices.Clone(m.theta), mom: slices.Clone(m.mom), steps: &counter{m.steps.epoch, m.steps.label}}
			w.AllReduceAsync64(ctx, "g0", g[:toyDim/2])
			m.theta[0], m.mom[3], m.steps.epoch = 1e9, -1, 99
			if err := w.Abandon(ctx); err != nil {
				return err
			}
			if w.Iter() != failAt || !slices.Equal(m.theta, committed.theta) || !slices.Equal(m.mom, committed.mom) ||
				*m.steps != *committed.steps {
				return fmt.Errorf("Abandon did not restore the commit: iter %d", w.Iter())
			}
			continue
		}
		w.AllReduceAsync64(ctx, "g0", g[:toyDim/2])
		w.AllReduceAsync64(ctx, "g1", g[toyDim/2:])
		if err := w.Wait(ctx); err != nil {
			return err
		}
		m.step(g)
		if _, err := w.Boundary(ctx); err != nil {
			return err
		}
		if err := w.Commit(); err != nil {
			return err
		}
	}
	return nil
}

// TestAbandonAndRedo checks that an iteration abandoned midway and redone
// ends exactly where an uninterrupted run does, on every worker.
func TestAbandonAndRedo(t *testing.T) {
	shares := []int{7, 2, 0, 5}
	run := func(failAt int64) [][]float64 {
		models := make([]*toy, len(shares))
		ws := cluster{n: len(shares), adjust: func(_ int, c *Config) { c.Shares = shares; c.DatasetSize = 100 },
			options: func(r int) []Option {
				models[r] = newToy()
				return []Option{WithState(models[r].state())}
			}}.mustStart(t)
		errs := each(ws, func(r int, w *Worker) error {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			return train(ctx, w, models[r], 12, failAt, nil)
		})
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		out := make([][]float64, len(models))
		for r, m := range models {
			if m.steps.epoch != 12 {
				t.Fatalf("rank %d took %d steps, want 12", r, m.steps.epoch)
			}
			out[r] = m.theta
		}
		return out
	}
	clean, redone := run(-1), run(5)
	for r := range clean {
		if !slices.Equal(clean[r], clean[0]) || !slices.Equal(redone[r], clean[0]) {
			t.Fatalf("rank %d: uninterrupted %v, redone %v, rank 0 %v", r, clean[r], redone[r], clean[0])
		}
	}
}
