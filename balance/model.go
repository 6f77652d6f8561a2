package balance

import (
	"fmt"
	"math"

	"gonum.org/v1/gonum/stat"
)

// Obs is one iteration of one worker: the samples it computed and the
// compute time, in seconds, without time spent waiting on the network.
type Obs struct {
	Samples int
	Seconds float64
}

// Model is a worker's fitted compute time, quantised: FixedNs in
// nanoseconds, RateMicro in millionths of a sample per second. On a CPU
// (Flat false) c(b) = Fixed + b/Rate. On a device (Flat true: a GPU) the
// time is flat and then linear, c(b) = max(Fixed, b/Rate): a batch up to
// the knee Fixed·Rate costs the same, as the device is not yet full. A
// zero RateMicro means unknown (no data yet).
type Model struct {
	FixedNs   int64
	RateMicro int64
	Flat      bool
}

// Known reports whether the model has a rate.
func (m Model) Known() bool { return m.RateMicro > 0 }

// rate and fixed are the model in float64 seconds, exact conversions of
// the integers (below 2^53).
func (m Model) rate() float64  { return float64(m.RateMicro) / 1e6 }
func (m Model) fixed() float64 { return float64(m.FixedNs) / 1e9 }

// Seconds predicts the compute time of b samples.
func (m Model) Seconds(b int) float64 {
	if b <= 0 {
		return 0
	}
	if m.Flat {
		return max(m.fixed(), float64(b)/m.rate())
	}
	return m.fixed() + float64(b)/m.rate()
}

// share is the most samples that fit in t seconds, unbounded: (t−Fixed)
// ·Rate, or for a flat model t·Rate once t reaches Fixed, and -Inf below
// it (no batch is that fast). The explicit float64 conversions keep the
// compiler from fusing a multiply and an add, which would round
// differently on CPUs with FMA.
func (m Model) share(t float64) float64 {
	if m.Flat {
		if t < m.fixed() {
			return math.Inf(-1)
		}
		return float64(t * m.rate())
	}
	return float64((t - m.fixed()) * m.rate())
}

func (m Model) String() string {
	if m.Flat {
		return fmt.Sprintf("max(%.3gs, b/%.4g per s)", m.fixed(), m.rate())
	}
	return fmt.Sprintf("%.3gs + b/%.4g per s", m.fixed(), m.rate())
}

// quantise rounds a fitted model to a Model.
func quantise(fixed, rate float64, flat bool) Model {
	return Model{FixedNs: int64(math.Round(max(fixed, 0) * 1e9)), RateMicro: max(int64(math.Round(rate*1e6)), 1), Flat: flat}
}

// Estimator parameters. The defaults suit iterations of a few
// milliseconds to seconds.
const (
	// DefaultWindow is how many recent iterations a fit uses.
	DefaultWindow = 32
	// DefaultHalfLife is the age, in iterations, at which an observation
	// weighs half as much as the newest.
	DefaultHalfLife = 8.0
	// DefaultChangeRatio is the relative error of the prediction beyond
	// which an iteration counts as a change of speed. It is wide because
	// short iterations on a CPU-capped host are noisy: a CFS quota is
	// granted per 100 ms period, so an iteration of a few periods runs
	// at full speed or stalls for the rest of one.
	DefaultChangeRatio = 0.5
	// DefaultChangeConfirm is how many iterations in a row must show the
	// change before the history is dropped.
	DefaultChangeConfirm = 2
	// minSpread is the smallest relative spread of batch sizes (weighted
	// standard deviation over mean) that lets the fit separate the fixed
	// cost from the rate; below it the rate is fitted through the origin.
	minSpread = 0.05
)

// Estimator fits one worker's model from its recent iterations. Use one
// per worker, fed from that worker's own measurements; it is not safe for
// concurrent use.
type Estimator struct {
	// Flat fits a device's flat-then-linear model (see Model) instead of
	// a CPU's fixed cost plus rate.
	Flat          bool
	Window        int     // default DefaultWindow
	HalfLife      float64 // default DefaultHalfLife
	ChangeRatio   float64 // default DefaultChangeRatio
	ChangeConfirm int     // default DefaultChangeConfirm

	obs    []Obs // oldest first, at most Window
	misses int   // iterations in a row slower than the model predicted
}

func (e *Estimator) defaults() {
	if e.Window <= 0 {
		e.Window = DefaultWindow
	}
	if e.HalfLife <= 0 {
		e.HalfLife = DefaultHalfLife
	}
	if e.ChangeRatio <= 0 {
		e.ChangeRatio = DefaultChangeRatio
	}
	if e.ChangeConfirm <= 0 {
		e.ChangeConfirm = DefaultChangeConfirm
	}
}

// Add records an iteration and reports whether the worker slowed down:
// this and the previous ChangeConfirm-1 iterations took over ChangeRatio
// longer than the model fitted before them predicted. Then the history is
// cut to those iterations, so the next Fit follows the new speed at once,
// and the shares may jump rather than creep, since everyone waits for a
// straggler. A worker that gets faster is followed by the recency weights
// alone: on a CPU-capped host a small share fits in one period's quota
// and runs at full speed, which is no lasting change. Iterations with no
// samples or no time carry no information and are skipped.
func (e *Estimator) Add(o Obs) (changed bool) {
	e.defaults()
	if o.Samples <= 0 || !(o.Seconds > 0) || math.IsInf(o.Seconds, 0) {
		return false
	}
	if m, ok := e.Fit(); ok {
		if pred := m.Seconds(o.Samples); o.Seconds > (1+e.ChangeRatio)*pred {
			e.misses++
		} else {
			e.misses = 0
		}
	}
	e.obs = append(e.obs, o)
	if len(e.obs) > e.Window {
		e.obs = append(e.obs[:0], e.obs[len(e.obs)-e.Window:]...)
	}
	if e.misses >= e.ChangeConfirm {
		e.obs = append(e.obs[:0], e.obs[len(e.obs)-e.misses:]...)
		e.misses = 0
		return true
	}
	return false
}

// Reset forgets every observation.
func (e *Estimator) Reset() { e.obs, e.misses = e.obs[:0], 0 }

// Len is the number of observations kept.
func (e *Estimator) Len() int { return len(e.obs) }

// Fit returns the model of the kept observations, false with none. The
// weights halve every HalfLife iterations of age. With enough spread in
// batch sizes it fits the fixed cost and the rate by weighted least
// squares; otherwise, or when that fit is not physical (a negative fixed
// cost or a non-positive rate), it fits the rate through the origin, the
// CPU case where the fixed cost is close to 0.
func (e *Estimator) Fit() (Model, bool) {
	e.defaults()
	n := len(e.obs)
	if n == 0 {
		return Model{}, false
	}
	if e.Flat {
		return e.fitFlat(), true
	}
	x, y, w := make([]float64, n), make([]float64, n), make([]float64, n)
	for i, o := range e.obs {
		x[i], y[i] = float64(o.Samples), o.Seconds
		w[i] = math.Exp2(-float64(n-1-i) / e.HalfLife)
	}
	if n >= 3 {
		mean, std := stat.MeanStdDev(x, w)
		if std > minSpread*mean {
			fixed, slope := stat.LinearRegression(x, y, w, false)
			if fixed >= 0 && slope > 0 && !math.IsNaN(fixed) {
				return quantise(fixed, 1/slope, false), true
			}
		}
	}
	var sx, sy float64
	for i := range x {
		sx += w[i] * x[i]
		sy += w[i] * y[i]
	}
	return quantise(0, sx/sy, false), true
}

// fitFlat fits c(b) = max(Fixed, b/Rate) to the kept observations, the
// newest weighing most: the rate is the fastest per-sample rate seen (a
// batch past the knee runs at it; one below it at less), and the flat
// time the shortest time seen, which is the floor if a batch below the
// knee was seen and an upper bound of it otherwise: the solver then
// never expects a smaller batch to be faster than one it has timed.
// Observations older than HalfLife·2 are used only while no newer one
// exists, so a change of device speed is followed.
func (e *Estimator) fitFlat() Model {
	recent := e.obs[max(0, len(e.obs)-int(2*e.HalfLife)):]
	var rate, floor float64
	for i, o := range recent {
		if r := float64(o.Samples) / o.Seconds; i == 0 || r > rate {
			rate = r
		}
		if i == 0 || o.Seconds < floor {
			floor = o.Seconds
		}
	}
	return quantise(floor, rate, true)
}
