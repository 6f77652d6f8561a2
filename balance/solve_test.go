package balance

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// randomTable draws n workers with rates spread over two decades, fixed
// costs of up to 50 ms (or none), a third of them flat-then-linear
// (devices), and bounds that leave the table feasible for B.
func randomTable(rng *rand.Rand, n, B int) []Worker {
	ws := make([]Worker, n)
	for i := range ws {
		ws[i].Model = Model{RateMicro: int64(rng.Float64()*990e6) + 10e6, Flat: rng.IntN(3) == 0}
		if rng.IntN(2) == 0 {
			ws[i].Model.FixedNs = rng.Int64N(50e6)
		}
		ws[i].Min = 1
		if rng.IntN(4) == 0 {
			ws[i].Max = B/n + rng.IntN(B/n+1)
		}
	}
	return ws
}

func sum(v []int) int {
	s := 0
	for _, x := range v {
		s += x
	}
	return s
}

// TestSolveProperties checks, over thousands of random tables: the shares
// sum to B exactly; every bound holds; a worker at least as fast as
// another (no larger fixed cost, no smaller rate) never gets fewer
// samples unless its own cap binds; and the same table gives the same
// shares.
func TestSolveProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 3000 {
		n := 1 + rng.IntN(12)
		B := n + rng.IntN(2000)
		ws := randomTable(rng, n, B)
		got, err := Solve(ws, B)
		if err != nil {
			if errors.Is(err, ErrInfeasible) {
				continue // caps too tight for this B
			}
			t.Fatalf("trial %d: %v", trial, err)
		}
		if s := sum(got); s != B {
			t.Fatalf("trial %d: shares %v sum to %d, want %d", trial, got, s, B)
		}
		for i, w := range ws {
			hi := w.Max
			if hi == 0 {
				hi = B
			}
			if got[i] < w.Min || got[i] > hi {
				t.Fatalf("trial %d: worker %d got %d outside [%d, %d]", trial, i, got[i], w.Min, hi)
			}
			for j, v := range ws {
				faster := w.Model.Flat == v.Model.Flat && w.Model.FixedNs <= v.Model.FixedNs && w.Model.RateMicro >= v.Model.RateMicro
				if faster && got[i] < got[j] && got[i] != hi {
					t.Fatalf("trial %d: worker %d (%v) is at least as fast as %d (%v) but got %d < %d",
						trial, i, w.Model, j, v.Model, got[i], got[j])
				}
			}
		}
		again, _ := Solve(slices.Clone(ws), B)
		if !slices.Equal(got, again) {
			t.Fatalf("trial %d: %v then %v", trial, got, again)
		}
	}
}

// TestSolveEqualSpeeds: equal models give shares that differ by at most 1.
func TestSolveEqualSpeeds(t *testing.T) {
	for n := 1; n <= 9; n++ {
		for B := n; B < 200; B += 7 {
			ws := make([]Worker, n)
			for i := range ws {
				ws[i] = Worker{Model: Model{FixedNs: 1e6, RateMicro: 123456789}, Min: 1}
			}
			got, err := Solve(ws, B)
			if err != nil {
				t.Fatal(err)
			}
			if slices.Max(got)-slices.Min(got) > 1 || sum(got) != B {
				t.Fatalf("n=%d B=%d: %v", n, B, got)
			}
		}
	}
}

// TestSolveProportional: with no fixed cost and no caps, shares follow
// the rates, each within one sample of B·vᵢ/Σv.
func TestSolveProportional(t *testing.T) {
	rates := []int64{50e6, 50e6, 50e6, 15e6}
	ws := make([]Worker, len(rates))
	var total float64
	for i, r := range rates {
		ws[i] = Worker{Model: Model{RateMicro: r}, Min: 1}
		total += float64(r)
	}
	const B = 1000
	got, err := Solve(ws, B)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rates {
		if want := B * float64(r) / total; math.Abs(float64(got[i])-want) > 1 {
			t.Fatalf("shares %v: worker %d got %d, want %.1f", got, i, got[i], want)
		}
	}
}

// TestSolveNearOptimal compares with every integer split of B among 3
// workers: the predicted time is within one sample's time of the best.
func TestSolveNearOptimal(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 300 {
		const n = 3
		B := n + rng.IntN(40)
		ws := randomTable(rng, n, B)
		for i := range ws {
			ws[i].Min, ws[i].Max = rng.IntN(2), 0
		}
		got, err := Solve(ws, B)
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		best, slack := math.Inf(1), 0.0
		for i := range ws {
			slack = max(slack, 1/ws[i].Model.rate())
		}
		for b0 := ws[0].Min; b0 <= B; b0++ {
			for b1 := ws[1].Min; b0+b1 <= B; b1++ {
				if b2 := B - b0 - b1; b2 >= ws[2].Min {
					best = min(best, Predict(ws, []int{b0, b1, b2}))
				}
			}
		}
		if p := Predict(ws, got); p > best+slack*(1+1e-9) {
			t.Fatalf("trial %d: %v predicts %.6g s, the best split %.6g s (one sample: %.3g s)", trial, got, p, best, slack)
		}
	}
}

// TestSolveFlatDevices: devices whose time is flat up to a knee are
// filled up to it before anyone waits longer. Two GPUs with a 1 s floor
// and knees of 100 samples share 150 evenly at 1 s; a GPU (1 s floor,
// 1000 samples/s) beside a CPU (50 samples/s) takes all but the CPU's 1 s
// worth of 600.
func TestSolveFlatDevices(t *testing.T) {
	gpu := func(rate int64) Worker {
		return Worker{Model: Model{FixedNs: 1e9, RateMicro: rate * 1e6, Flat: true}, Min: 1}
	}
	cpu := Worker{Model: Model{RateMicro: 50e6}, Min: 1}
	for _, tc := range []struct {
		ws   []Worker
		B    int
		want []int
	}{
		{[]Worker{gpu(100), gpu(100)}, 150, []int{75, 75}},
		{[]Worker{gpu(1000), cpu}, 600, []int{550, 50}},
		{[]Worker{gpu(1000), cpu}, 2100, []int{2000, 100}}, // past the knee: 2 s each
	} {
		got, err := Solve(tc.ws, tc.B)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("Solve(%v, %d) = %v, %v; want %v", tc.ws, tc.B, got, err, tc.want)
		}
	}
}

// TestSolveZeroMinimum: with Min 0 a very slow worker may get nothing.
func TestSolveZeroMinimum(t *testing.T) {
	ws := []Worker{{Model: Model{RateMicro: 1e9}}, {Model: Model{FixedNs: 5e9, RateMicro: 1e6}}}
	got, err := Solve(ws, 10)
	if err != nil || !slices.Equal(got, []int{10, 0}) {
		t.Fatalf("got %v, %v; want [10 0]", got, err)
	}
}

// TestSolveRefusesInfeasible: bounds no shares can meet, and unknown
// models, give errors that say which.
func TestSolveRefusesInfeasible(t *testing.T) {
	m := Model{RateMicro: 1e6}
	for _, tt := range []struct {
		ws   []Worker
		B    int
		want string
	}{
		{[]Worker{{Model: m, Min: 1}, {Model: m, Min: 1}, {Model: m, Min: 1}}, 2, "minimum shares sum to 3, more than the global batch 2"},
		{[]Worker{{Model: m, Min: 1, Max: 3}, {Model: m, Min: 1, Max: 4}}, 10, "maximum shares sum to 7, less than the global batch 10"},
		{[]Worker{{Model: m, Min: 5, Max: 3}}, 10, "worker 0 has bounds [5, 3]"},
		{nil, 10, "no workers"},
		{[]Worker{{Model: m, Min: 1}, {Min: 1}}, 10, "worker 1 has no model yet"},
	} {
		_, err := Solve(tt.ws, tt.B)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v, B=%d: got %v, want %q", tt.ws, tt.B, err, tt.want)
		}
	}
}

// TestRoundToSum: the rounding keeps the sum and the bounds, and gives
// the extra samples to the largest remainders.
func TestRoundToSum(t *testing.T) {
	got := roundToSum([]float64{1.2, 2.7, 3.1, 2.0}, 9, []int{0, 0, 0, 0}, []int{9, 9, 9, 9})
	if !slices.Equal(got, []int{1, 3, 3, 2}) {
		t.Fatalf("got %v", got)
	}
	got = roundToSum([]float64{1.5, 1.5, 1.5, 1.5}, 6, []int{0, 0, 0, 0}, []int{9, 9, 9, 9})
	if !slices.Equal(got, []int{2, 2, 1, 1}) {
		t.Fatalf("ties: got %v, want the lower indices first", got)
	}
	got = roundToSum([]float64{2.9, 2.9, 0.2}, 6, []int{0, 0, 0}, []int{2, 9, 9})
	if !slices.Equal(got, []int{2, 3, 1}) {
		t.Fatalf("caps: got %v", got)
	}
}
