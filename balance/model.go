package balance

import (
	"fmt"
	"math"
	"slices"

	"gonum.org/v1/gonum/stat"
	"gonum.org/v1/gonum/stat/distuv"
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
	// NoisePpm is how uncertain the model is, relative, in millionths
	// (1e6 until measured): see Estimator.Fit. Step moves no shares for
	// a predicted gain below it.
	NoisePpm int64
}

// noise is NoisePpm as a fraction.
func (m Model) noise() float64 { return float64(m.NoisePpm) / 1e6 }

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
	return m.secondsAt(float64(b))
}

// secondsAt is Seconds of a mean batch b, not a whole number.
func (m Model) secondsAt(b float64) float64 {
	if m.Flat {
		return max(m.fixed(), b/m.rate())
	}
	return m.fixed() + b/m.rate()
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
	f := "%.3gs + b/%.4g per s"
	if m.Flat {
		f = "max(%.3gs, b/%.4g per s)"
	}
	s := fmt.Sprintf(f, m.fixed(), m.rate())
	if m.NoisePpm > 0 {
		s += fmt.Sprintf(" ±%.1f%%", 100*m.noise())
	}
	return s
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
	// DefaultChangeEvidence is what those iterations' slow-downs (measured
	// over predicted time), multiplied, must reach as well: two
	// iterations at 2× or more (a cap cut from 50% to 15% is 3.3×), three
	// at 1.6×, four at 1.5×. Two spikes in a row at 1.6× are not enough.
	DefaultChangeEvidence = 4.0
	// DefaultSpeedUpEvidence is the same for speed-ups (predicted over
	// measured time): two iterations at 1.75× (a worker 2× faster, with
	// 15% noise), three at 1.5×. No spike makes an iteration fast.
	DefaultSpeedUpEvidence = 3.0
	// DefaultSpeedUpMinSeconds is the shortest predicted time of an
	// iteration whose speed-up counts towards a change. Under a CFS quota
	// (granted per 100 ms period) an iteration that fits in one period's
	// quota runs at full speed, and one of k quotas is charged as few as
	// k-2 periods of waiting, not k (one starting late in a period, with
	// its quota unused, runs twice before the next): short iterations
	// read as speed-ups that do not last. From 6 periods on, that reads
	// as 1.5× at most, within ChangeRatio. The prediction, not the
	// measured time, decides: a worker whose cap was raised from 15% to
	// 50% runs a 1 s iteration in 0.3 s.
	DefaultSpeedUpMinSeconds = 0.6
	// DefaultChangeMinSeconds is the least predicted time that the slow
	// iterations counted towards a change must span together. On a busy
	// machine, iterations of a millisecond or less run slow in bursts of
	// tens of them while another process holds the core: seen in the
	// default 4-worker job on 2 cores, where a tenth of iterations took
	// over 2.5× the median and two slow ones in a row jumped the shares
	// about 90 times in 700 iterations. A shorter run is charged to the
	// worker through the duty (DefaultDutySeconds); a lasting slow-down
	// is a change once its iterations were predicted to take 0.6 s
	// together, which at a slow-down of k× is 0.6·k s of wall time.
	DefaultChangeMinSeconds = 0.6
	// DefaultDutySeconds is the least half-life, in predicted time, of
	// the duty: how much longer than the fit the iterations take on
	// average, runs of slow ones that were no change included, which
	// scales the published model. The fit follows the iterations between
	// slow runs; the duty charges the runs to the worker, so one slowed
	// in bursts (a co-tenant that wakes now and then) gets fewer samples,
	// as its mean speed says. A single slow iteration, a spike, is not
	// charged. At iterations of a second, HalfLife iterations are the
	// longer half-life.
	DefaultDutySeconds = 1.0
	// minSpread is the smallest relative spread of batch sizes (weighted
	// standard deviation over mean) that lets the fit separate the fixed
	// cost from the rate; below it the rate is fitted through the origin.
	minSpread = 0.05
	// fixedLevel is the one-sided significance level at which a fitted
	// fixed cost is kept (Student's t over the effective observations).
	// It is strict because the recency weights keep a fit that chance let
	// through for many iterations.
	fixedLevel = 0.001
)

// Estimator fits one worker's model from its recent iterations. Use one
// per worker, fed from that worker's own measurements; it is not safe for
// concurrent use.
type Estimator struct {
	// Flat fits a device's flat-then-linear model (see Model) instead of
	// a CPU's fixed cost plus rate.
	Flat           bool
	Window         int     // default DefaultWindow
	HalfLife       float64 // default DefaultHalfLife
	ChangeRatio    float64 // default DefaultChangeRatio
	ChangeConfirm  int     // default DefaultChangeConfirm
	ChangeEvidence float64 // default DefaultChangeEvidence
	// SpeedUpMinSeconds: default DefaultSpeedUpMinSeconds.
	SpeedUpMinSeconds float64
	// SpeedUpEvidence: default DefaultSpeedUpEvidence.
	SpeedUpEvidence float64
	// ChangeMinSeconds: default DefaultChangeMinSeconds.
	ChangeMinSeconds float64
	// DutySeconds: default DefaultDutySeconds.
	DutySeconds float64

	obs     []Obs     // oldest first, at most Window
	held    []Obs     // slow (or fast) iterations in a row, not yet a change, kept out of obs
	factors []float64 // each held iteration's slow-down (speed-up); 0: it only keeps a fast run going
	heldDir int8      // +1: the held iterations are slow; -1: fast
	// The run's evidence: the sum of the logarithms of its factors, how
	// many count, the least after the first, and their predicted time.
	heldLogEvidence float64
	heldCounted     int
	heldLeast       float64
	heldSeconds     float64
	// The duty's sums, and those of the held run, charged to it if the
	// run is no change; the wander of the logarithm of the published time
	// per sample, and the measured over predicted times.
	dutySums, pending sums
	wander, ratios    ewStats
	noiseBefore       knownNoise // the noise before the last change of speed
	runNoise          int64      // the noise before the held run began
	warmed            bool       // the first iteration, a warm-up, has been replaced
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
	if e.ChangeEvidence <= 0 {
		e.ChangeEvidence = DefaultChangeEvidence
	}
	if e.SpeedUpMinSeconds <= 0 {
		e.SpeedUpMinSeconds = DefaultSpeedUpMinSeconds
	}
	if e.SpeedUpEvidence <= 0 {
		e.SpeedUpEvidence = DefaultSpeedUpEvidence
	}
	if e.ChangeMinSeconds <= 0 {
		e.ChangeMinSeconds = DefaultChangeMinSeconds
	}
	if e.DutySeconds <= 0 {
		e.DutySeconds = DefaultDutySeconds
	}
}

// Add records an iteration and reports whether the worker changed
// speed: this and at least the previous ChangeConfirm-1 iterations each
// took over ChangeRatio longer than the model fitted before them
// predicted, their slow-downs multiplied reach ChangeEvidence, and
// their predicted times add up to ChangeMinSeconds; or, the mirror, each
// ran over ChangeRatio faster (predicted over measured time) where at
// least SpeedUpMinSeconds was predicted, and their speed-ups multiplied
// reach SpeedUpEvidence.
//
// A slow (or fast) iteration is held out of the fit until the next one
// says what it was. If that one is slow (fast) too, and the run is long
// enough, the worker changed speed: the history is cut to the held
// iterations, and the next Fit follows the new speed at once, so the
// shares may jump rather than creep: everyone waits for a straggler, and
// a worker that got faster idles until the shares move. The first held
// iteration is dropped too if it is nearer the old speed than every
// later one: it may have straddled the change. If the next one is not
// slow (fast), the held iteration was a spike (a collector cycle, a
// trainer growing its buffers at a larger share, a page-fault storm)
// and is dropped: fitted, one such iteration at a new batch size set
// the slope of the fit. Longer runs that are no change (too little
// evidence, or shorter than ChangeMinSeconds: at iterations of
// milliseconds, preemptions come in bursts of tens of them) stay out of
// the fit too, but the duty charges their time (DefaultDutySeconds).
//
// Speed-ups of iterations predicted shorter than SpeedUpMinSeconds never
// count: on a CPU-capped host a small share fits in one period's quota
// and runs at full speed, which is no lasting change
// (DefaultSpeedUpMinSeconds).
// Such an iteration, or one faster than the fit but short of
// ChangeRatio, is fitted as it comes, unless it falls in a run of fast
// ones: then it neither adds evidence nor ends the run (for up to
// ChangeConfirm+2 held iterations), and is dropped, since noise and a
// spike on a worker that got faster must not restart the count. A
// speed-up needs less evidence than a slow-down: nothing but a quota
// makes a single iteration run fast, and SpeedUpMinSeconds rules that
// out.
//
// The first iteration is a warm-up (buffers allocated and touched for the
// first time, cold caches) and stands only until the second replaces it.
// Iterations with no samples or no time carry no information and are
// skipped.
func (e *Estimator) Add(o Obs) (changed bool) {
	e.defaults()
	if o.Samples <= 0 || !(o.Seconds > 0) || math.IsInf(o.Seconds, 0) {
		return false
	}
	if len(e.obs) == 1 && !e.warmed {
		e.obs[0], e.warmed = o, true
		return false
	}
	if m, ok := e.fit(); ok {
		predicted := m.Seconds(o.Samples)
		dir, factor := e.judge(o.Seconds, predicted)
		e.account(m, o, predicted, dir)
		if dir != 0 {
			return e.hold(o, dir, factor, predicted)
		}
	}
	e.clearHeld()
	e.obs = append(e.obs, o)
	if len(e.obs) > e.Window {
		e.obs = append(e.obs[:0], e.obs[len(e.obs)-e.Window:]...)
	}
	return false
}

// sums are exponentially weighted sums over iterations: their weight,
// samples, measured seconds and the seconds the fit of the time predicted.
type sums struct{ weight, samples, seconds, predicted float64 }

func (s *sums) age(decay float64) {
	s.weight, s.samples, s.seconds, s.predicted = s.weight*decay, s.samples*decay, s.seconds*decay, s.predicted*decay
}

func (s *sums) add(o sums) {
	s.weight, s.samples, s.seconds, s.predicted = s.weight+o.weight, s.samples+o.samples, s.seconds+o.seconds, s.predicted+o.predicted
}

// account adds an iteration o, where the fit m predicted predicted and
// judge said dir, to the duty and the noise. Their weights halve every
// HalfLife iterations or DutySeconds of predicted time, whichever is
// longer. A held iteration waits in pending: it is charged to the duty
// once its run ends without being a change of speed, and dropped if it
// is one, as the new speed's history then starts with it.
func (e *Estimator) account(m Model, o Obs, predicted float64, dir int8) {
	decay := math.Exp2(-min(1/e.HalfLife, predicted/e.DutySeconds))
	e.dutySums.age(decay)
	e.pending.age(decay)
	it := sums{1, float64(o.Samples), o.Seconds, predicted}
	switch {
	case dir == 0:
		e.dutySums.add(it)
		e.endRun()
	case len(e.held) == 0 || dir != e.heldDir: // a new run
		e.endRun()
		e.runNoise = e.noisePpm() // should the run be a change
		e.pending = it
	default:
		e.pending.add(it)
	}
	d := e.duty(m)
	ref := float64(o.Samples)
	if e.dutySums.weight > 0 {
		ref = e.dutySums.samples / e.dutySums.weight
	}
	e.wander.add(math.Log(d*m.secondsAt(ref)/ref), decay)
	e.ratios.add(o.Seconds/predicted, decay)
}

// endRun charges the held run, if any, that ended with no change of
// speed to the duty, unless it was a single iteration: a spike (a
// collector cycle, a trainer growing its buffers) is a moment, not the
// worker's speed.
func (e *Estimator) endRun() {
	if e.pending.weight > 0 && len(e.held) > 1 {
		e.dutySums.add(e.pending)
	}
	e.pending = sums{}
}

// duty is how much longer the duty's iterations took than the fit m
// predicts for them: 1 with none. On a CPU, measured against the fit of
// now, not the fits the iterations met, so that a fit following a new
// speed is not charged its lag as well. A device's flat-then-linear time
// is not linear in the samples, so its duty is against the predictions
// the iterations met.
func (e *Estimator) duty(m Model) float64 {
	predicted := e.dutySums.predicted
	if !m.Flat {
		predicted = m.fixed()*e.dutySums.weight + e.dutySums.samples/m.rate()
	}
	if !(e.dutySums.seconds > 0) || !(predicted > 0) {
		return 1
	}
	return e.dutySums.seconds / predicted
}

// noisePpm is how uncertain the published speed is, in millionths: the
// larger of its wander (the weighted standard deviation of the logarithm
// of its time per sample, at the duty's mean share) and the standard
// error of the mean of measured over predicted times that it rests on.
// Before minNoiseObs iterations it is the noise before the last change
// of speed, or unknownNoisePpm without one.
func (e *Estimator) noisePpm() int64 {
	if e.wander.n < minNoiseObs {
		if e.noiseBefore.known {
			return e.noiseBefore.ppm
		}
		return unknownNoisePpm
	}
	return int64(math.Round(1e6 * max(e.wander.sd(), e.ratios.se()/e.ratios.mean())))
}

// unknownNoisePpm is the noise of a worker too new to have measured its
// own: 25%, so that its first models, from a few iterations, move no
// shares unless they differ widely, as heterogeneous hosts do.
const unknownNoisePpm = 250000

// ewStats are exponentially weighted statistics of a series.
type ewStats struct {
	w, w2, sum, squares float64 // weights, squared weights, values, squared values
	n                   int     // values seen
}

// add ages the statistics by decay and adds x.
func (s *ewStats) add(x, decay float64) {
	s.w = s.w*decay + 1
	s.w2 = s.w2*decay*decay + 1
	s.sum = s.sum*decay + x
	s.squares = s.squares*decay + x*x
	s.n++
}

func (s *ewStats) mean() float64 { return s.sum / s.w }

// sd is the weighted standard deviation.
func (s *ewStats) sd() float64 {
	m := s.mean()
	return math.Sqrt(max(s.squares/s.w-m*m, 0))
}

// se is the standard error of the weighted mean: sd over the square root
// of the effective number of values (Kish: w²/w2).
func (s *ewStats) se() float64 { return s.sd() / math.Sqrt(s.w*s.w/s.w2) }

// knownNoise is a noise in millionths, if known.
type knownNoise struct {
	ppm   int64
	known bool
}

// minNoiseObs is how many iterations the noise needs before it tells.
const minNoiseObs = 4

// judge classifies an iteration that took seconds where the fit
// predicted predicted: slow (dir +1) or fast (-1) with its slow-down or
// speed-up, fast with factor 0 for one that only keeps a run of fast
// ones going, or neither (0).
func (e *Estimator) judge(seconds, predicted float64) (dir int8, factor float64) {
	ratio := seconds / predicted
	fastRun := e.heldDir < 0 && len(e.held) > 0
	switch {
	case ratio > 1+e.ChangeRatio:
		return 1, ratio
	case 1/ratio > 1+e.ChangeRatio && predicted >= e.SpeedUpMinSeconds:
		return -1, 1 / ratio
	case fastRun && ratio < 1 && len(e.held) < e.ChangeConfirm+2:
		return -1, 0
	}
	return 0, 0
}

// hold adds a slow or fast iteration to the run held out of the fit, and
// reports whether the run is now a change of speed, which replaces the
// history with the run. It keeps the run's first iteration and its
// newest Window, and the evidence of all of them.
func (e *Estimator) hold(o Obs, dir int8, factor, predicted float64) bool {
	if len(e.held) == 0 || e.heldDir != dir {
		e.clearHeld()
		e.heldDir = dir
	}
	if factor > 0 {
		if len(e.held) > 0 {
			e.heldLeast = min(e.heldLeast, factor)
		}
		e.heldLogEvidence += math.Log(factor)
		e.heldCounted++
		e.heldSeconds += predicted
	}
	if len(e.held) > e.Window {
		e.held = slices.Delete(e.held, 1, 2)
		e.factors = slices.Delete(e.factors, 1, 2)
	}
	e.held, e.factors = append(e.held, o), append(e.factors, factor)
	need := e.ChangeEvidence
	if dir < 0 {
		need = e.SpeedUpEvidence
	}
	if e.heldCounted < e.ChangeConfirm || e.heldLogEvidence < math.Log(need) ||
		dir > 0 && e.heldSeconds < e.ChangeMinSeconds {
		return false
	}
	e.obs = e.obs[:0]
	for i, h := range e.held {
		if f := e.factors[i]; f > 0 && (i > 0 || f >= e.heldLeast || len(e.held) == 1) {
			e.obs = append(e.obs, h)
		}
	}
	if len(e.obs) > e.Window {
		e.obs = append(e.obs[:0], e.obs[len(e.obs)-e.Window:]...)
	}
	e.clearHeld()
	e.dutySums, e.pending = sums{}, sums{}       // a new speed: the old one's record says nothing
	e.noiseBefore = knownNoise{e.runNoise, true} // until the new speed's is measured
	e.wander, e.ratios = ewStats{}, ewStats{}
	return true
}

// clearHeld ends the held run.
func (e *Estimator) clearHeld() {
	e.held, e.factors = e.held[:0], e.factors[:0]
	e.heldLogEvidence, e.heldCounted, e.heldLeast = 0, 0, math.Inf(1)
	e.heldSeconds = 0
}

// Reset forgets every observation; the next is a warm-up again.
func (e *Estimator) Reset() {
	e.clearHeld()
	e.obs, e.warmed = e.obs[:0], false
	e.dutySums, e.pending = sums{}, sums{}
	e.wander, e.ratios, e.noiseBefore = ewStats{}, ewStats{}, knownNoise{}
}

// Len is the number of observations the fit uses.
func (e *Estimator) Len() int { return len(e.obs) }

// Fit returns the model of the kept observations, false with none. The
// weights halve every HalfLife iterations of age. It fits the fixed cost
// and the rate by weighted least squares when the data show a fixed cost:
// batch sizes spread enough, and a fitted fixed cost that is positive and
// significant at fixedLevel. Otherwise it fits the rate through
// the origin, the CPU case, where the fixed cost is close to 0. The test
// matters because shares near their balance vary by a few percent, as
// much as the timing noise, and a free fit of that reads noise as a
// fixed cost: seen on a CPU-capped host, 3.17 s + b/13670 per s for a
// worker that computed 7000 samples in 4 s at about 1800 per s, which
// the solver took for a worker that could take many more samples.
//
// The fit is then scaled by the duty (DefaultDutySeconds), so that its
// level is the worker's mean speed, slow runs included, and NoisePpm set
// to how uncertain that is: the larger of the model's wander (the
// weighted standard deviation of the logarithm of its rate over the same
// span) and the standard error of the mean of measured over predicted
// times. Not the spread of single iterations: at iterations under a
// millisecond that is tens of times wider, and would keep a worker that
// is slow in half its iterations at the share of a fast one.
func (e *Estimator) Fit() (Model, bool) {
	m, ok := e.fit()
	if d := e.duty(m); ok && d != 1 {
		m = quantise(m.fixed()*d, m.rate()/d, m.Flat)
	}
	m.NoisePpm = e.noisePpm()
	return m, ok
}

// fit is Fit without the noise.
func (e *Estimator) fit() (Model, bool) {
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
			if slope > 0 && fixedSignificant(x, y, w, fixed, slope) {
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

// fixedSignificant reports whether the fixed cost of a weighted
// straight-line fit is above 0 at fixedLevel, by Student's t, with the
// weights scaled to the effective number of observations (Kish:
// (Σw)²/Σw²) so that recency weights do not count as extra data.
func fixedSignificant(x, y, w []float64, fixed, slope float64) bool {
	var sw, sw2 float64
	for _, v := range w {
		sw += v
		sw2 += v * v
	}
	neff := sw * sw / sw2
	if !(neff > 2) || !(fixed > 0) {
		return false
	}
	scale := neff / sw
	var mx float64
	for i := range x {
		mx += w[i] * x[i]
	}
	mx /= sw
	var sxx, rss float64
	for i := range x {
		d, r := x[i]-mx, y[i]-fixed-slope*x[i]
		sxx += scale * w[i] * d * d
		rss += scale * w[i] * r * r
	}
	if !(sxx > 0) {
		return false
	}
	se := math.Sqrt(rss / (neff - 2) * (1/neff + mx*mx/sxx))
	t := distuv.StudentsT{Mu: 0, Sigma: 1, Nu: neff - 2}
	return fixed > t.Quantile(1-fixedLevel)*se
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
