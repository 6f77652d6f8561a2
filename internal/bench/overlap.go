package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"time"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/internal/mlp"
	"github.com/gyre-ml/gyre/internal/train"
)

// Targets of the overlap scenario (issue: `gyre bench overlap`).
const (
	// OverlapBoundTarget bounds the overlapped iteration time as a multiple
	// of forward + max(backward, communication): forward cannot overlap,
	// backward and communication can.
	OverlapBoundTarget = 1.15
	// OverlapSpeedupTarget is the least speed-up of the overlapped
	// iteration over the one that communicates after backward.
	OverlapSpeedupTarget = 1.25
	// OverlapCommLow and OverlapCommHigh bound communication/backward in
	// the scenario: comparable, with communication the shorter, so a
	// perfect overlap hides it completely.
	OverlapCommLow, OverlapCommHigh = 0.5, 1.0
)

// The modes of an overlap round, in the order each round runs them.
const (
	// ModeOverlap submits each layer's gradient from the Backward callback.
	ModeOverlap = "overlap"
	// ModeNoOverlap submits every gradient after the whole backward pass.
	ModeNoOverlap = "no-overlap"
	// ModeCompute is forward, backward and step, with no communication.
	ModeCompute = "compute"
	// ModeComm submits the same gradient tensors in the same order and
	// waits, with no compute.
	ModeComm = "comm"
)

// OverlapModes lists the modes in the order each round runs them.
var OverlapModes = []string{ModeOverlap, ModeNoOverlap, ModeCompute, ModeComm}

// OverlapOptions describe one `gyre bench overlap` run. Every rank must
// pass the same options.
type OverlapOptions struct {
	// Hidden are the hidden layer widths; the model is
	// mlp.InputDim → Hidden... → mlp.NumClasses.
	Hidden []int
	// Warmup is the number of untimed rounds, Iters the number of timed
	// ones. A round runs one iteration of every mode.
	Warmup, Iters int
	// ModelSeed draws the initial weights (rank 0's are broadcast);
	// DataSeed is the synthetic dataset's.
	ModelSeed, DataSeed uint64
	// ComputeProcs bounds the goroutines of the model's matrix products
	// (mlp.Model.SetProcs); 0 lets gonum use every GOMAXPROCS.
	ComputeProcs int
}

// Validate reports options that cannot run.
func (o OverlapOptions) Validate() error {
	var errs []error
	if len(o.Hidden) == 0 {
		errs = append(errs, errors.New("bench: overlap: need at least one hidden layer"))
	}
	for _, h := range o.Hidden {
		if h <= 0 {
			errs = append(errs, fmt.Errorf("bench: overlap: hidden width %d is not positive", h))
		}
	}
	if o.ComputeProcs < 0 {
		errs = append(errs, fmt.Errorf("bench: overlap: compute procs %d is negative", o.ComputeProcs))
	}
	if o.Warmup < 0 || o.Iters <= 0 {
		errs = append(errs, fmt.Errorf("bench: overlap: warmup %d and iters %d: want warmup >= 0 and iters > 0", o.Warmup, o.Iters))
	}
	return errors.Join(errs...)
}

// Sizes returns the model's layer sizes, input first.
func (o OverlapOptions) Sizes() []int {
	s := append([]int{mlp.InputDim}, o.Hidden...)
	return append(s, mlp.NumClasses)
}

// LargestGradBytes is the size of the largest layer's float64 gradient.
// As a bucket size it puts every large layer in a bucket of its own, sent
// as soon as backward hands it over; the 25 MiB default would fuse the
// whole model into one bucket that leaves only after the last layer, and
// nothing would overlap.
func (o OverlapOptions) LargestGradBytes() int {
	s := o.Sizes()
	largest := 0
	for l := range len(s) - 1 {
		largest = max(largest, 8*(s[l]*s[l+1]+s[l+1]))
	}
	return largest
}

// NewOverlapJob returns the model, its optimizer and its data. Its State
// goes to gyre.Join, so every rank starts from rank 0's weights.
func NewOverlapJob(o OverlapOptions) (*train.Job, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	job, err := train.NewSizedJob(o.Sizes(), mlp.DefaultLR, o.ModelSeed, o.DataSeed)
	if err != nil {
		return nil, err
	}
	job.Model.SetProcs(o.ComputeProcs)
	return job, nil
}

// Phases are the times of one iteration's phases, in microseconds. A
// phase a mode does not run is 0.
type Phases struct {
	// Iteration runs from the start of forward to the end of the step
	// (compute), or from the first submission to the end of Wait (comm).
	Iteration float64 `json:"iteration_us"`
	Forward   float64 `json:"forward_us"`
	// Backward includes submitting the gradients in ModeOverlap.
	Backward float64 `json:"backward_us"`
	// Wait runs from the end of backward to the end of Worker.Wait:
	// submitting the gradients still held (ModeNoOverlap), flushing the
	// last bucket and waiting for every allreduce. ModeComm leaves it 0:
	// its Iteration is that and nothing else.
	Wait float64 `json:"wait_us"`
	Step float64 `json:"step_us"`
}

// phaseNames are the table's names of the Phases fields, in order.
var phaseNames = []string{"iteration", "forward", "backward", "wait", "step"}

func (p Phases) values() []float64 {
	return []float64{p.Iteration, p.Forward, p.Backward, p.Wait, p.Step}
}

func phasesOf(v []float64) Phases {
	return Phases{Iteration: v[0], Forward: v[1], Backward: v[2], Wait: v[3], Step: v[4]}
}

// medianPhases is the median of each phase over samples, taken apart.
func medianPhases(samples []Phases) Phases {
	return phasesOf(columnMedians(samples, len(phaseNames), Phases.values))
}

// columnMedians is the median of each of the n columns of the rows values
// gives.
func columnMedians[T any](rows []T, n int, values func(T) []float64) []float64 {
	cols := make([][]float64, n)
	for _, row := range rows {
		for i, x := range values(row) {
			cols[i] = append(cols[i], x)
		}
	}
	med := make([]float64, len(cols))
	for i, c := range cols {
		med[i] = Median(c)
	}
	return med
}

// OverlapMode is one mode's result.
type OverlapMode struct {
	Mode string `json:"mode"`
	// Median is the mean over ranks of each rank's median per phase.
	Median Phases `json:"median"`
	// RankMedians are each rank's medians, in rank order.
	RankMedians []Phases `json:"rank_medians"`
	// Samples are the reporting rank's timed iterations, in order.
	Samples []Phases `json:"samples"`
}

// OverlapFigures are the scenario's derived figures: one round's, or a
// summary of the rounds'.
type OverlapFigures struct {
	// CommOverBackward is the communication-only time over the
	// compute-only backward time.
	CommOverBackward float64 `json:"comm_over_backward"`
	// BoundUS is forward + max(backward, communication), from the
	// compute-only and communication-only iterations: the best an
	// overlapped iteration could do without the step.
	BoundUS float64 `json:"bound_us"`
	// OverlapOverBound is the overlapped iteration over BoundUS; the
	// target is at most OverlapBoundTarget.
	OverlapOverBound float64 `json:"overlap_over_bound"`
	// Speedup is the no-overlap iteration over the overlapped one; the
	// target is at least OverlapSpeedupTarget.
	Speedup float64 `json:"speedup"`
}

// DeriveOverlap computes the derived figures from one round's iterations
// of the four modes. A ratio whose denominator is 0 is 0.
func DeriveOverlap(overlap, noOverlap, compute, comm Phases) OverlapFigures {
	ratio := func(a, b float64) float64 {
		if b <= 0 {
			return 0
		}
		return a / b
	}
	f := OverlapFigures{
		CommOverBackward: ratio(comm.Iteration, compute.Backward),
		BoundUS:          compute.Forward + max(compute.Backward, comm.Iteration),
	}
	f.OverlapOverBound = ratio(overlap.Iteration, f.BoundUS)
	f.Speedup = ratio(noOverlap.Iteration, overlap.Iteration)
	return f
}

const numFigures = 4

func (f OverlapFigures) values() []float64 {
	return []float64{f.CommOverBackward, f.BoundUS, f.OverlapOverBound, f.Speedup}
}

func figuresOf(v []float64) OverlapFigures {
	return OverlapFigures{CommOverBackward: v[0], BoundUS: v[1], OverlapOverBound: v[2], Speedup: v[3]}
}

// medianFigures is the median of each figure over rounds, taken apart.
func medianFigures(rounds []OverlapFigures) OverlapFigures {
	return figuresOf(columnMedians(rounds, numFigures, OverlapFigures.values))
}

// OverlapReport is the result of RunOverlap, complete on every rank.
type OverlapReport struct {
	Command    string    `json:"command"`
	Date       time.Time `json:"date"`
	Machine    Machine   `json:"machine"`
	GOMAXPROCS int       `json:"gomaxprocs"`
	// ComputeProcs bounds the model's matrix products' goroutines; 0 is
	// every GOMAXPROCS.
	ComputeProcs int    `json:"compute_procs"`
	Ranks        int    `json:"ranks"`
	Transport    string `json:"transport"`
	// Sizes are the layer sizes, input first; Params the parameter count.
	Sizes       []int         `json:"sizes"`
	Params      int           `json:"params"`
	GlobalBatch int           `json:"global_batch"`
	Shares      []int         `json:"shares"`
	BucketBytes int           `json:"bucket_bytes"`
	Warmup      int           `json:"warmup"`
	Iters       int           `json:"iters"`
	Modes       []OverlapMode `json:"modes"`
	// Figures are each rank's median over rounds of the round's figures,
	// then the mean over ranks; RoundFigures are the reporting rank's
	// rounds.
	Figures      OverlapFigures   `json:"figures"`
	RoundFigures []OverlapFigures `json:"round_figures"`
}

// Mode returns the named mode's result, or a zero one.
func (r *OverlapReport) Mode(name string) OverlapMode {
	for _, m := range r.Modes {
		if m.Mode == name {
			return m
		}
	}
	return OverlapMode{Mode: name}
}

// RunOverlap runs o's rounds on w, which must have joined with job's
// State, and returns the report. Each round runs one iteration of every
// mode, one after the other, so all modes see the same conditions; every
// iteration ends at Worker.Boundary, the ranks' synchronization point,
// which is not timed. Every rank returns the same medians and figures,
// with its own iterations as Samples and RoundFigures; Command, Transport
// and BucketBytes are the caller's to fill.
func RunOverlap(ctx context.Context, w *gyre.Worker, job *train.Job, o OverlapOptions) (OverlapReport, error) {
	if err := o.Validate(); err != nil {
		return OverlapReport{}, err
	}
	r := &overlapRun{w: w, job: job}
	for l := range job.Model.Layers() {
		r.names = append(r.names, fmt.Sprintf("grad%d", l))
	}
	samples := make(map[string][]Phases)
	for round := range o.Warmup + o.Iters {
		for _, mode := range OverlapModes {
			p, err := r.iteration(ctx, mode)
			if err != nil {
				return OverlapReport{}, fmt.Errorf("bench: overlap: %s iteration %d: %w", mode, w.Iter(), err)
			}
			if round >= o.Warmup {
				samples[mode] = append(samples[mode], p)
			}
		}
	}
	// Every rank summarises its own iterations: per-phase medians, and the
	// median over rounds of each round's figures (a ratio within one round
	// compares modes run back to back, so load that comes and goes on a
	// shared machine hits both sides alike).
	local := make([]float64, 0, len(OverlapModes)*len(phaseNames)+numFigures)
	for _, mode := range OverlapModes {
		local = append(local, medianPhases(samples[mode]).values()...)
	}
	rounds := make([]OverlapFigures, o.Iters)
	for i := range rounds {
		rounds[i] = DeriveOverlap(samples[ModeOverlap][i], samples[ModeNoOverlap][i],
			samples[ModeCompute][i], samples[ModeComm][i])
	}
	local = append(local, medianFigures(rounds).values()...)
	ranks, err := w.AllGather64(ctx, local)
	if err != nil {
		return OverlapReport{}, fmt.Errorf("bench: overlap: gather the medians: %w", err)
	}
	rep := OverlapReport{
		Date: time.Now(), Machine: ThisMachine(), GOMAXPROCS: runtime.GOMAXPROCS(0), Ranks: w.Size(),
		ComputeProcs: job.Model.Procs(),
		Sizes:        o.Sizes(), Params: job.Model.NumParams(), Shares: w.Shares(), Warmup: o.Warmup, Iters: o.Iters,
		RoundFigures: rounds,
	}
	for _, s := range rep.Shares {
		rep.GlobalBatch += s
	}
	mean := meanRows(ranks)
	for i, mode := range OverlapModes {
		m := OverlapMode{Mode: mode, Samples: samples[mode], Median: phasesOf(mean[i*len(phaseNames):])}
		for _, row := range ranks {
			m.RankMedians = append(m.RankMedians, phasesOf(row[i*len(phaseNames):]))
		}
		rep.Modes = append(rep.Modes, m)
	}
	rep.Figures = figuresOf(mean[len(OverlapModes)*len(phaseNames):])
	return rep, nil
}

// meanRows is the mean of the rows, element by element.
func meanRows(rows [][]float64) []float64 {
	mean := make([]float64, len(rows[0]))
	for _, row := range rows {
		for j, v := range row {
			mean[j] += v / float64(len(rows))
		}
	}
	return mean
}

// overlapRun is one rank's state across the iterations.
type overlapRun struct {
	w      *gyre.Worker
	job    *train.Job
	names  []string // gradient tensor names, by layer
	x      []float64
	labels []int
}

// iteration runs one iteration of mode and returns its phase times.
func (r *overlapRun) iteration(ctx context.Context, mode string) (Phases, error) {
	var p Phases
	m := r.job.Model
	b := r.w.Batch()
	if mode != ModeComm {
		// Generating the synthetic batch stands for data loading, which is
		// not what this benchmark measures.
		r.x, r.labels = r.job.Data.Batch(b.Indices, r.x, r.labels)
	}
	start := time.Now()
	lap := func(since time.Time) (float64, time.Time) {
		now := time.Now()
		return float64(now.Sub(since)) / float64(time.Microsecond), now
	}
	t := start
	if mode != ModeComm {
		if _, err := m.Forward(r.x, r.labels); err != nil {
			return p, err
		}
		p.Forward, t = lap(t)
		m.Backward(func(l int, grad []float64) {
			if mode == ModeOverlap {
				r.w.AllReduceAsync64(ctx, r.names[l], grad)
			}
		})
		p.Backward, t = lap(t)
	}
	if mode != ModeCompute {
		if mode != ModeOverlap {
			// The order backward hands them over: last layer first.
			grads := m.Grads()
			for l := len(grads) - 1; l >= 0; l-- {
				r.w.AllReduceAsync64(ctx, r.names[l], grads[l])
			}
		}
		if err := r.w.Wait(ctx); err != nil {
			return p, err
		}
		if mode == ModeOverlap || mode == ModeNoOverlap {
			p.Wait, t = lap(t) // in ModeComm it is the whole iteration
		}
	}
	if mode != ModeComm {
		if err := r.job.Opt.Step(m.Params(), m.Grads()); err != nil {
			return p, err
		}
		p.Step, _ = lap(t)
	}
	p.Iteration, _ = lap(start)
	if mode == ModeCompute {
		// The step used this rank's own gradient: undo it, so that the
		// ranks keep identical state.
		if err := r.w.Restore(); err != nil {
			return p, err
		}
	}
	if _, err := r.w.Boundary(ctx); err != nil {
		return p, err
	}
	return p, r.w.Commit()
}

// SetCommand records the command line that produced the report.
func (r *OverlapReport) SetCommand(cmd string) { r.Command = cmd }

// WriteTable prints the report: a '#' header, one row per mode and phase
// with the median time (mean over ranks) and its spread over ranks, then
// the derived figures against their targets.
func (r *OverlapReport) WriteTable(w io.Writer) error {
	ew := &ErrWriter{W: w}
	p := func(format string, args ...any) { fmt.Fprintf(ew, format, args...) }
	m := r.Machine
	p("# %s\n", r.Command)
	compute := "all"
	if r.ComputeProcs > 0 {
		compute = fmt.Sprint(r.ComputeProcs)
	}
	p("# date %s  host %s  %s/%s  cpus %d  GOMAXPROCS %d  compute procs %s  %s\n", r.Date.UTC().Format(time.RFC3339),
		m.Host, m.OS, m.Arch, m.CPUs, r.GOMAXPROCS, compute, m.Go)
	p("# ranks %d  transport %s  model %v (%d params, %d bytes of float64 gradient)  global batch %d (shares %v)\n",
		r.Ranks, r.Transport, r.Sizes, r.Params, 8*r.Params, r.GlobalBatch, r.Shares)
	p("# bucket %d bytes  warmup %d  iters %d (each round: %s, one iteration each)\n",
		r.BucketBytes, r.Warmup, r.Iters, strings.Join(OverlapModes, ", "))
	p("# time_us: each rank's median over iters, then the mean over ranks; spread_us: max-min of the ranks' medians\n")
	p("%12s %10s %12s %10s %6s\n", "mode", "phase", "time_us(med)", "spread_us", "iters")
	for _, md := range r.Modes {
		for j, name := range phaseNames {
			if !modeRuns(md.Mode, name) {
				continue
			}
			v := md.Median.values()[j]
			lo, hi := v, v
			for _, rk := range md.RankMedians {
				lo, hi = min(lo, rk.values()[j]), max(hi, rk.values()[j])
			}
			p("%12s %10s %12.0f %10.0f %6d\n", md.Mode, name, v, hi-lo, len(md.Samples))
		}
	}
	f := r.Figures
	p("#\n# derived: each rank's median over rounds of the round's ratio, then the mean over ranks\n")
	p("# %-52s %8s %10s\n", "figure", "value", "target")
	p("%-54s %8.3f %10s %s\n", "comm/backward (comm iteration / compute backward)", f.CommOverBackward,
		fmt.Sprintf("%.1f-%.1f", OverlapCommLow, OverlapCommHigh),
		verdict(f.CommOverBackward >= OverlapCommLow && f.CommOverBackward <= OverlapCommHigh))
	p("%-54s %8.3f %10s %s\n", "overlap/(forward+max(backward,comm))", f.OverlapOverBound,
		fmt.Sprintf("<=%.2f", OverlapBoundTarget), verdict(f.OverlapOverBound > 0 && f.OverlapOverBound <= OverlapBoundTarget))
	p("%-54s %8.3f %10s %s\n", "no-overlap/overlap (speed-up)", f.Speedup,
		fmt.Sprintf(">=%.2f", OverlapSpeedupTarget), verdict(f.Speedup >= OverlapSpeedupTarget))
	return ew.Err
}

// modeRuns reports whether mode has the phase: compute does not wait, and
// comm's iteration is all it has.
func modeRuns(mode, phase string) bool {
	switch mode {
	case ModeCompute:
		return phase != "wait"
	case ModeComm:
		return phase == "iteration"
	}
	return true
}

func verdict(ok bool) string {
	if ok {
		return "ok"
	}
	return "MISSED"
}

// WriteJSON writes the report as indented JSON.
func (r *OverlapReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}
