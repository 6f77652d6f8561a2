package balance

import (
	"math"
	"math/rand/v2"
	"testing"

	"gonum.org/v1/gonum/stat"
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

// TestChangeDetection: a slow iteration is held out of the fit until the
// next says what it was; one, or two moderate ones in a row, are no
// change and stay out of the fit (one is a spike; two in a row are
// charged to the duty); a slow-down confirmed by enough evidence is a
// change, and the history then holds the slow iterations but the first,
// which may have straddled the change. The window bounds the history.
func TestChangeDetection(t *testing.T) {
	var e Estimator
	for range 20 {
		if e.Add(Obs{Samples: 100, Seconds: 1}) {
			t.Fatal("a change at constant speed")
		}
	}
	steady := func(when string) {
		t.Helper()
		if m, _ := e.fit(); m.FixedNs != 0 || m.RateMicro != 100e6 {
			t.Fatalf("%s: fit %v, want b/100 per s", when, m)
		}
	}
	published := func() float64 { m, _ := e.Fit(); return m.rate() }
	n := e.Len()
	if e.Add(Obs{Samples: 100, Seconds: 3}) {
		t.Fatal("one outlier counted as a change")
	}
	steady("with an outlier held")
	if e.Add(Obs{Samples: 100, Seconds: 1}) || e.Len() != n+1 {
		t.Fatalf("after the outlier passed: a change, or %d observations (want %d: the outlier dropped)", e.Len(), n+1)
	}
	steady("after the outlier")
	if r := published(); r != 100 {
		t.Fatalf("after the outlier: published %v per s, want 100: a spike is not charged", r)
	}
	first := e.Add(Obs{Samples: 100, Seconds: 1.6})
	if second := e.Add(Obs{Samples: 100, Seconds: 1.6}); first || second {
		t.Fatal("two spikes of 1.6x in a row counted as a change")
	}
	e.Add(Obs{Samples: 100, Seconds: 1})
	steady("after two spikes")
	if r := published(); !(r < 97 && r > 85) {
		t.Fatalf("after two slow iterations: published %.1f per s, want them charged: about 90", r)
	}
	if e.Add(Obs{Samples: 100, Seconds: 0.3}) || e.Add(Obs{Samples: 100, Seconds: 3}) || e.Add(Obs{Samples: 100, Seconds: 0.3}) ||
		e.Add(Obs{Samples: 100, Seconds: 1}) || e.Add(Obs{Samples: 100, Seconds: 3}) {
		t.Fatal("noise both ways counted as a change")
	}
	for range 10 {
		e.Add(Obs{Samples: 100, Seconds: 1})
	}
	// The speed drops to a third part way through an iteration: that one
	// takes 2 s, the next 3 s.
	if e.Add(Obs{Samples: 100, Seconds: 2}) {
		t.Fatal("a change after one slow iteration")
	}
	if !e.Add(Obs{Samples: 100, Seconds: 3}) {
		t.Fatal("a slow-down to a third, two iterations in a row, is not a change")
	}
	if m, _ := e.Fit(); e.Len() != 1 || m.RateMicro != int64(math.Round(100/3.0*1e6)) {
		t.Fatalf("after the change: %d observations, fit %v; want the 3 s iteration alone", e.Len(), m)
	}
	for range 3 * DefaultWindow {
		e.Add(Obs{Samples: 100, Seconds: 3})
	}
	if e.Len() != DefaultWindow {
		t.Fatalf("%d observations kept, want %d", e.Len(), DefaultWindow)
	}

	// A lasting slow-down of 1.6x is a change on its third iteration.
	var m Estimator
	for range 10 {
		m.Add(Obs{Samples: 100, Seconds: 1})
	}
	first, second := m.Add(Obs{Samples: 100, Seconds: 1.6}), m.Add(Obs{Samples: 100, Seconds: 1.6})
	if third := m.Add(Obs{Samples: 100, Seconds: 1.6}); first || second || !third {
		t.Fatal("three iterations at 1.6x are not a change")
	}
}

// TestSpeedUpDetection: the mirror of a slow-down. Two iterations in a
// row at 2× the fitted speed are a change, and the history becomes them;
// a straddling first one, nearer the old speed, is dropped; a spike (or
// noise) inside the run neither counts nor restarts it; and speed-ups of
// iterations predicted shorter than SpeedUpMinSeconds never count, as a
// CFS quota fakes them.
func TestSpeedUpDetection(t *testing.T) {
	steady := func(sec float64) *Estimator {
		e := new(Estimator)
		for range 20 {
			e.Add(Obs{Samples: 100, Seconds: sec})
		}
		return e
	}
	rate := func(e *Estimator) int64 { m, _ := e.Fit(); return m.RateMicro }

	e := steady(2)
	if e.Add(Obs{Samples: 100, Seconds: 1}) {
		t.Fatal("one fast iteration counted as a change")
	}
	if rate(e) != 50e6 {
		t.Fatalf("with a fast iteration held: rate %d, want the old 50 per s", rate(e))
	}
	if !e.Add(Obs{Samples: 100, Seconds: 1}) {
		t.Fatal("two iterations at 2x are not a change")
	}
	if e.Len() != 2 || rate(e) != 100e6 {
		t.Fatalf("after the change: %d observations, rate %d; want the 2 fast ones, 100 per s", e.Len(), rate(e))
	}

	e = steady(3)
	if e.Add(Obs{Samples: 100, Seconds: 2}) || !e.Add(Obs{Samples: 100, Seconds: 1}) {
		t.Fatal("a straddling 1.5x then 3x is not a change")
	}
	if e.Len() != 1 || rate(e) != 100e6 {
		t.Fatalf("after the change: %d observations, rate %d; want the 3x one alone", e.Len(), rate(e))
	}

	e = steady(2)
	if e.Add(Obs{Samples: 100, Seconds: 1}) || e.Add(Obs{Samples: 100, Seconds: 1.6}) || !e.Add(Obs{Samples: 100, Seconds: 1}) {
		t.Fatal("fast, a spike, fast: not a change on the third")
	}
	if e.Len() != 2 || rate(e) != 100e6 {
		t.Fatalf("after the change: %d observations, rate %d; want the 2 fast ones without the spike", e.Len(), rate(e))
	}

	e = steady(2)
	if e.Add(Obs{Samples: 100, Seconds: 1}) || e.Add(Obs{Samples: 100, Seconds: 2}) || e.Add(Obs{Samples: 100, Seconds: 1}) {
		t.Fatal("fast, as before, fast: a change, though the run ended")
	}

	e = steady(0.5)
	for range 10 {
		if e.Add(Obs{Samples: 100, Seconds: 0.15}) {
			t.Fatalf("3.3x speed-ups of iterations predicted at 0.5 s, under SpeedUpMinSeconds, counted as a change")
		}
	}
}

// TestNoise: NoisePpm says how uncertain the published speed is. It is
// unknownNoisePpm before minNoiseObs judged iterations; for a steady
// worker with ±10% uniform noise it is a few percent, and larger at ±30%;
// after a change of speed the old noise stands until the new speed's is
// measured.
func TestNoise(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	noise := func(e *Estimator) float64 { m, _ := e.Fit(); return float64(m.NoisePpm) / 1e6 }
	steady := func(spread float64) *Estimator {
		e := new(Estimator)
		for k := range 200 {
			e.Add(Obs{Samples: 100, Seconds: 1 + spread*(2*rng.Float64()-1)})
			switch judged := k - 1; {
			case judged == minNoiseObs-1 && noise(e) != unknownNoisePpm/1e6:
				t.Fatalf("noise %v after %d judged iterations, want %v: unknown", noise(e), judged, unknownNoisePpm/1e6)
			case judged == minNoiseObs && noise(e) == unknownNoisePpm/1e6:
				t.Fatalf("noise still unknown after %d judged iterations", judged)
			}
		}
		return e
	}
	quiet, loud := steady(0.1), steady(0.3)
	if n := noise(quiet); n < 0.005 || n > 0.05 {
		t.Fatalf("noise %.3f at ±10%% uniform, want a few percent", n)
	}
	if noise(loud) <= 2*noise(quiet) {
		t.Fatalf("noise %.3f at ±30%%, %.3f at ±10%%: want the first over twice the second", noise(loud), noise(quiet))
	}
	before := noise(quiet)
	quiet.Add(Obs{Samples: 100, Seconds: 3})
	if !quiet.Add(Obs{Samples: 100, Seconds: 3}) {
		t.Fatal("two iterations at 3x are not a change")
	}
	if got := noise(quiet); got != before {
		t.Fatalf("right after a change the noise is %.3f, want the old %.3f", got, before)
	}
}

// TestShortSlowDowns: slow iterations count towards a change only once
// those counted span ChangeMinSeconds of predicted time. A shorter burst
// stays out of the fit, but the duty charges its time: the published
// speed is the mean one.
func TestShortSlowDowns(t *testing.T) {
	var e Estimator
	for range 20 {
		e.Add(Obs{Samples: 100, Seconds: 0.01})
	}
	for range 30 { // a burst: 0.3 s predicted
		if e.Add(Obs{Samples: 100, Seconds: 0.03}) {
			t.Fatal("a 0.3 s burst of slow iterations counted as a change")
		}
	}
	e.Add(Obs{Samples: 100, Seconds: 0.01}) // the burst ends
	base, _ := e.fit()
	published, _ := e.Fit()
	// 49 judged iterations, 30 of them 3× slow: 4900 samples in 1.09 s,
	// 4495 per s, before the weights, which halve every second.
	if base.RateMicro != 10000e6 || !near(published.rate(), 4495, 0.1) {
		t.Fatalf("after the burst: fit %v, published %v; want b/10000 per s, and about b/4495 per s", base, published)
	}
	need := int(math.Ceil(DefaultChangeMinSeconds / 0.01))
	for k := 1; k <= need+1; k++ {
		if e.Add(Obs{Samples: 100, Seconds: 0.03}) {
			if k < need {
				t.Fatalf("a change at slow iteration %d of 10 ms predicted; want it at about the %dth", k, need)
			}
			if m, _ := e.fit(); e.Len() != DefaultWindow || !near(m.rate(), 3333, 0.01) {
				t.Fatalf("after the change: %d observations, fit %v; want the newest %d, b/3333 per s", e.Len(), m, DefaultWindow)
			}
			return
		}
	}
	t.Fatalf("no change after %d slow iterations of 10 ms predicted", need+1)
}

// TestFlatDuty: a device's duty compares its iterations with the
// predictions they met: batches on both sides of the knee, timed as the
// model says, leave the published model as fitted (within 1%: the first
// fits, of an iteration or two, mispredicted a little). Against the fit
// of now, as on a CPU, they would read as 1.25× slow.
func TestFlatDuty(t *testing.T) {
	e := Estimator{Flat: true}
	for k := range 40 {
		b := 50 + 100*(k%2) // the knee is at 100
		e.Add(Obs{Samples: b, Seconds: max(1, float64(b)/100)})
	}
	base, _ := e.fit()
	published, _ := e.Fit()
	if !near(published.rate(), base.rate(), 0.01) || !near(published.fixed(), base.fixed(), 0.01) {
		t.Fatalf("published %v, fitted %v: want the same, within 1%%", published, base)
	}
}

// TestWarmUp: a worker's first iteration, slow with first touches, stands
// only until the second replaces it; Reset starts over.
func TestWarmUp(t *testing.T) {
	var e Estimator
	e.Add(Obs{Samples: 100, Seconds: 4})
	if m, _ := e.Fit(); m.RateMicro != 25e6 {
		t.Fatalf("first iteration alone: fit %v, want b/25 per s", m)
	}
	e.Add(Obs{Samples: 100, Seconds: 1})
	if m, _ := e.Fit(); e.Len() != 1 || m.RateMicro != 100e6 {
		t.Fatalf("after the second: %d observations, fit %v; want the second alone", e.Len(), m)
	}
	e.Add(Obs{Samples: 100, Seconds: 1})
	if e.Len() != 2 {
		t.Fatalf("%d observations after three iterations, want 2", e.Len())
	}
	e.Reset()
	e.Add(Obs{Samples: 100, Seconds: 4})
	e.Add(Obs{Samples: 100, Seconds: 2})
	if m, _ := e.Fit(); e.Len() != 1 || m.RateMicro != 50e6 {
		t.Fatalf("after Reset: %d observations, fit %v; want the second alone", e.Len(), m)
	}
}

// TestFitIgnoresNoiseAsFixedCost: a CPU worker (no fixed cost) whose
// share converges from the equal split to its balance and then varies by
// a few percent, timed with a few percent of noise, is fitted through the
// origin, at its rate, at every iteration. The rule this replaced (any
// positive fixed cost once shares spread by 5%) read the noise as a fixed
// cost and a faster rate at many of these iterations.
func TestFitIgnoresNoiseAsFixedCost(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	fooled := 0
	for trial := range 200 {
		var e Estimator
		var x, y []float64
		b := 6144.0
		for i := range 24 {
			share := int(b * (1 + 0.06*(rng.Float64()-0.5)))
			sec := float64(share) / 3700 * (1 + 0.06*(rng.Float64()-0.5))
			b += (7500 - b) / 2 // damped steps to the balance
			e.Add(Obs{Samples: share, Seconds: sec})
			if i == 0 {
				continue // the warm-up
			}
			x, y = append(x, float64(share)), append(y, sec)
			w := make([]float64, len(x))
			for k := range w {
				w[k] = math.Exp2(-float64(len(x)-1-k) / DefaultHalfLife)
			}
			if len(x) >= 3 {
				mean, std := stat.MeanStdDev(x, w)
				if fixed, slope := stat.LinearRegression(x, y, w, false); std > minSpread*mean && fixed > 0.2 && slope > 0 {
					fooled++
				}
			}
			if m, _ := e.Fit(); m.FixedNs != 0 || !near(m.rate(), 3700, 0.04) {
				t.Fatalf("trial %d, iteration %d: fit %v, want about b/3700 per s", trial, i, m)
			}
		}
	}
	if fooled == 0 {
		t.Fatal("the old rule was never fooled: the histories show nothing")
	}
	t.Logf("the old rule read noise as a fixed cost over 0.2 s at %d of 4400 iterations", fooled)
}
