package balance

import (
	"errors"
	"fmt"
	"slices"
)

// Worker is one worker's row of the decision: its model and the bounds
// of its share. Max 0 means no cap of its own (B is the cap).
type Worker struct {
	Model    Model
	Min, Max int
}

// ErrInfeasible is matched by every error Solve returns for bounds that no
// shares can meet.
var ErrInfeasible = errors.New("balance: no shares meet the bounds")

// bisections is the number of halvings of the water level's bracket: far
// more than float64 resolution needs, and fixed, so every worker runs
// exactly the same operations.
const bisections = 200

// Solve returns the shares, in the order of ws, that minimise the
// predicted iteration time max cᵢ(bᵢ) subject to Σbᵢ = B and
// Minᵢ ≤ bᵢ ≤ Maxᵢ. Every model must be Known. It water-fills: it finds
// the lowest level T at which Σ clamp(bᵢ(T), Minᵢ, Maxᵢ) reaches B, where
// bᵢ(T) is what worker i computes in T ((T−aᵢ)·vᵢ, or T·vᵢ for a flat
// model once T reaches its flat time), then rounds by largest remainder
// (ties to the lower index). The result depends only on its integer
// inputs.
func Solve(ws []Worker, B int) ([]int, error) {
	lo, hi, err := bounds(ws, B)
	if err != nil {
		return nil, err
	}
	for i, w := range ws {
		if !w.Model.Known() {
			return nil, fmt.Errorf("balance: worker %d has no model yet", i)
		}
	}
	// S(T) = Σ fill(T) is nondecreasing; S(0) = Σ Min ≤ B and S(top) =
	// Σ Max ≥ B. It is continuous but for flat models, which jump from
	// Min to their knee where T reaches their flat time.
	var top float64
	for i, w := range ws {
		top = max(top, w.Model.Seconds(hi[i]))
	}
	low, high := 0.0, top
	x := make([]float64, len(ws))
	for range bisections {
		mid := low + (high-low)/2
		if fill(ws, lo, hi, mid, x) >= float64(B) {
			high = mid
		} else {
			low = mid
		}
	}
	// Just below the level the shares sum to under B, at it to B or (at a
	// flat model's jump) more: blend the two so they sum to B. A worker
	// whose share lies in its flat part costs the level either way.
	xl := make([]float64, len(ws))
	sl, sh := fill(ws, lo, hi, low, xl), fill(ws, lo, hi, high, x)
	if sh > float64(B) && sh > sl {
		f := float64((float64(B) - sl) / (sh - sl))
		for i := range x {
			x[i] = float64(xl[i] + float64(f*(x[i]-xl[i])))
		}
	}
	return roundToSum(x, B, lo, hi), nil
}

// bounds checks the bounds and returns them with Max 0 read as B.
func bounds(ws []Worker, B int) (lo, hi []int, err error) {
	if len(ws) == 0 {
		return nil, nil, fmt.Errorf("%w: no workers", ErrInfeasible)
	}
	if B < 0 {
		return nil, nil, fmt.Errorf("%w: negative global batch %d", ErrInfeasible, B)
	}
	lo, hi = make([]int, len(ws)), make([]int, len(ws))
	sumLo, sumHi := 0, 0
	for i, w := range ws {
		lo[i], hi[i] = w.Min, w.Max
		if hi[i] == 0 || hi[i] > B {
			hi[i] = B
		}
		if lo[i] < 0 || lo[i] > hi[i] {
			return nil, nil, fmt.Errorf("%w: worker %d has bounds [%d, %d] (global batch %d)", ErrInfeasible, i, w.Min, hi[i], B)
		}
		sumLo += lo[i]
		sumHi += hi[i]
	}
	switch {
	case sumLo > B:
		return nil, nil, fmt.Errorf("%w: the %d workers' minimum shares sum to %d, more than the global batch %d", ErrInfeasible, len(ws), sumLo, B)
	case sumHi < B:
		return nil, nil, fmt.Errorf("%w: the %d workers' maximum shares sum to %d, less than the global batch %d", ErrInfeasible, len(ws), sumHi, B)
	}
	return lo, hi, nil
}

// fill sets x to each worker's share at water level t and returns the sum.
func fill(ws []Worker, lo, hi []int, t float64, x []float64) float64 {
	var sum float64
	for i, w := range ws {
		x[i] = min(max(w.Model.share(t), float64(lo[i])), float64(hi[i]))
		sum = float64(sum + x[i])
	}
	return sum
}

// roundToSum rounds x to integers within [lo, hi] that sum to B: the
// floors (clamped), then one more to the largest remainders (one less
// from the smallest, should the floors exceed B), ties to the lower
// index. x must lie within the bounds and sum to about B.
func roundToSum(x []float64, B int, lo, hi []int) []int {
	out := make([]int, len(x))
	sum := 0
	for i, v := range x {
		out[i] = min(max(int(v), lo[i]), hi[i])
		sum += out[i]
	}
	order := make([]int, len(x))
	for i := range order {
		order[i] = i
	}
	rem := func(i int) float64 { return x[i] - float64(out[i]) }
	slices.SortStableFunc(order, func(a, b int) int {
		switch ra, rb := rem(a), rem(b); {
		case ra > rb:
			return -1
		case ra < rb:
			return 1
		}
		return 0
	})
	for sum < B {
		moved := false
		for _, i := range order {
			if sum < B && out[i] < hi[i] {
				out[i]++
				sum++
				moved = true
			}
		}
		if !moved {
			break // unreachable with feasible bounds
		}
	}
	for sum > B {
		moved := false
		for k := len(order) - 1; k >= 0; k-- {
			if i := order[k]; sum > B && out[i] > lo[i] {
				out[i]--
				sum--
				moved = true
			}
		}
		if !moved {
			break // unreachable with feasible bounds
		}
	}
	return out
}

// Predict is the predicted iteration time of shares: the slowest
// worker's compute time.
func Predict(ws []Worker, shares []int) float64 {
	var t float64
	for i, w := range ws {
		t = max(t, w.Model.Seconds(shares[i]))
	}
	return t
}
