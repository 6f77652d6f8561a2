package balance

import (
	"math"
	"math/rand/v2"
	"testing"
)

func near(got, want, rel float64) bool { return math.Abs(got-want) <= rel*math.Abs(want) }

// TestFitRecoversTheModel: with batch sizes that vary, the fit finds both
// the fixed cost and the rate under 1% noise; with a constant batch size
// it fits the rate through the origin.
func TestFitRecoversTheModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	var e Estimator
	for i := range 32 {
		b := 100 + 20*(i%7)
		e.Add(Obs{Samples: b, Seconds: (0.05 + float64(b)/400) * (1 + 0.01*(rng.Float64()-0.5))})
	}
	m, ok := e.Fit()
	if !ok || !near(m.fixed(), 0.05, 0.1) || !near(m.rate(), 400, 0.02) {
		t.Fatalf("fit %v, want 0.05 s + b/400", m)
	}

	var flat Estimator
	for range 10 {
		flat.Add(Obs{Samples: 64, Seconds: 64.0 / 250})
	}
	if m, ok := flat.Fit(); !ok || m.FixedNs != 0 || !near(m.rate(), 250, 1e-6) {
		t.Fatalf("constant batch: fit %v, want b/250", m)
	}
	var none Estimator
	if _, ok := none.Fit(); ok {
		t.Fatal("a fit with no data")
	}
	if none.Add(Obs{Samples: 0, Seconds: 1}) || none.Add(Obs{Samples: 5, Seconds: 0}) || none.Len() != 0 {
		t.Fatal("empty iterations were kept")
	}
}

// TestFitWeighsRecentIterations: after the speed halves, the fit moves
// to the new speed faster than an unweighted mean would.
func TestFitWeighsRecentIterations(t *testing.T) {
	e := Estimator{ChangeRatio: 10} // no change detection here
	for range 16 {
		e.Add(Obs{Samples: 100, Seconds: 1})
	}
	for range 8 {
		e.Add(Obs{Samples: 100, Seconds: 2})
	}
	m, _ := e.Fit()
	// Unweighted: 2400 samples in 32 s, 75 per second. Recency-weighted
	// with a half-life of 8 iterations the newer half weighs twice the
	// older: about 60 per second.
	if r := m.rate(); !(r < 65 && r > 55) {
		t.Fatalf("rate %.1f, want about 60", r)
	}
}

// TestChangeDetection: one outlier is not a change; two mispredicted
// iterations in a row are, and the history then holds only them, so the
// fit follows the new speed at once. The window bounds the history.
func TestChangeDetection(t *testing.T) {
	var e Estimator
	for range 20 {
		if e.Add(Obs{Samples: 100, Seconds: 1}) {
			t.Fatal("a change at constant speed")
		}
	}
	if e.Add(Obs{Samples: 100, Seconds: 3}) {
		t.Fatal("one outlier counted as a change")
	}
	if e.Add(Obs{Samples: 100, Seconds: 1}) {
		t.Fatal("a change after the outlier passed")
	}
	if e.Add(Obs{Samples: 100, Seconds: 0.3}) || e.Add(Obs{Samples: 100, Seconds: 3}) || e.Add(Obs{Samples: 100, Seconds: 0.3}) ||
		e.Add(Obs{Samples: 100, Seconds: 0.3}) {
		t.Fatal("faster iterations, or noise both ways, counted as a change")
	}
	for range 10 {
		e.Add(Obs{Samples: 100, Seconds: 1})
	}
	if e.Add(Obs{Samples: 100, Seconds: 3.3}) {
		t.Fatal("a change after one slow iteration")
	}
	if !e.Add(Obs{Samples: 100, Seconds: 3.3}) {
		t.Fatal("two slow iterations in a row are not a change")
	}
	if m, _ := e.Fit(); e.Len() != 2 || !near(m.rate(), 100/3.3, 1e-6) {
		t.Fatalf("after the change: %d observations, fit %v", e.Len(), m)
	}
	for range 3 * DefaultWindow {
		e.Add(Obs{Samples: 100, Seconds: 3.3})
	}
	if e.Len() != DefaultWindow {
		t.Fatalf("%d observations kept, want %d", e.Len(), DefaultWindow)
	}
}

// TestFitFlat: a device's iterations on both sides of its knee give its
// floor and its rate; a model of a flat device predicts the floor below
// the knee and the rate beyond.
func TestFitFlat(t *testing.T) {
	e := Estimator{Flat: true}
	for _, b := range []int{50, 200, 150, 80, 300} {
		e.Add(Obs{Samples: b, Seconds: max(0.1, float64(b)/1000)})
	}
	m, ok := e.Fit()
	if !ok || !m.Flat || !near(m.fixed(), 0.1, 1e-9) || !near(m.rate(), 1000, 1e-9) {
		t.Fatalf("fit %v (ok %v), want max(0.1 s, b/1000)", m, ok)
	}
	if got := m.Seconds(20); !near(got, 0.1, 1e-9) {
		t.Fatalf("Seconds(20) = %v, want the floor 0.1", got)
	}
	if got := m.Seconds(400); !near(got, 0.4, 1e-9) {
		t.Fatalf("Seconds(400) = %v, want 0.4", got)
	}
}
