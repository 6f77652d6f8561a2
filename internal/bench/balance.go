package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// IterMetrics is one line of `gyre train --metrics-file`.
type IterMetrics struct {
	Iter          int64   `json:"iter"`
	Shares        []int   `json:"shares"`
	Seconds       float64 `json:"seconds"`
	SamplesPerSec float64 `json:"samples_per_sec"`
	Start         float64 `json:"start"` // seconds since 1970
}

// ReadMetrics reads a --metrics-file.
func ReadMetrics(r io.Reader) ([]IterMetrics, error) {
	var out []IterMetrics
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var m IterMetrics
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			return nil, fmt.Errorf("bench: metrics line %d: %w", n, err)
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

// BalanceOptions say how to judge the runs of `gyre bench balance`.
type BalanceOptions struct {
	// Steady is the first iteration of the steady state (the issue: 20).
	Steady int64
	// ChangeAt, if positive, is the first iteration run entirely under a
	// changed CPU cap in the run named Changed. ChangeTime, if positive
	// and ChangeAt is not, is when the cap changed (seconds since 1970):
	// ChangeAt is then the first iteration that began after it.
	ChangeAt   int64
	ChangeTime float64
	Changed    string
}

// BalanceRun is one job's figures.
type BalanceRun struct {
	Name       string        `json:"name"`
	Iterations []IterMetrics `json:"iterations"`
	// SteadySamplesPerSec is the median over iterations Steady onward
	// (before ChangeAt, in the changed run).
	SteadySamplesPerSec float64 `json:"steady_samples_per_sec"`
	// MaxMove is the largest change of one worker's share between
	// consecutive iterations of the steady state, in samples.
	MaxMove int `json:"max_move"`
	// Settled, in the changed run, is how many iterations after ChangeAt
	// every share lies within 10% of its new steady state (the median
	// share over iterations ChangeAt+10 to ChangeAt+20) and stays there
	// through ChangeAt+20; -1 if never, 0 if not measured.
	Settled int `json:"settled"`
	// ChangeAt is the first iteration under the changed cap (-1: the
	// change came after the run).
	ChangeAt int64 `json:"change_at,omitempty"`
}

// BalanceReport is the result of `gyre bench balance`.
type BalanceReport struct {
	Command string    `json:"command"`
	Date    time.Time `json:"date"`
	Machine Machine   `json:"machine"`
	// Solo is each host's rate alone (one worker, its cap, the global
	// batch; the median over its solo runs' iterations after their
	// warm-up), and Ideal their sum.
	Solo  []float64    `json:"solo_samples_per_sec"`
	Ideal float64      `json:"ideal_samples_per_sec"`
	Runs  []BalanceRun `json:"runs"`
}

// AnalyseBalance computes the figures of runs, each a name and its rank
// 0 metrics, against the solo runs of each host.
func AnalyseBalance(o BalanceOptions, solo [][]IterMetrics, names []string, runs [][]IterMetrics) (BalanceReport, error) {
	rep := BalanceReport{Date: time.Now().UTC(), Machine: ThisMachine()}
	for i, s := range solo {
		if len(s) == 0 {
			return rep, fmt.Errorf("bench: solo run %d has no iterations", i+1)
		}
		// A solo run is short: skip its first iterations, the warm-up. A
		// host's solo iterations may pool several runs, each from 0.
		var iters int64
		for _, m := range s {
			iters = max(iters, m.Iter+1)
		}
		r := medianRate(s, min(iters/3, o.Steady))
		rep.Solo = append(rep.Solo, r)
		rep.Ideal += r
	}
	for i, its := range runs {
		run := BalanceRun{Name: names[i], Iterations: its}
		steady := its
		at := o.ChangeAt
		if at <= 0 && o.ChangeTime > 0 && names[i] == o.Changed {
			at = -1
			for _, m := range its {
				if m.Start >= o.ChangeTime {
					at = m.Iter
					break
				}
			}
			run.ChangeAt = at
		}
		if at > 0 && names[i] == o.Changed {
			steady = slices.DeleteFunc(slices.Clone(its), func(m IterMetrics) bool { return m.Iter >= at })
			run.Settled = settled(its, at)
			run.ChangeAt = at
		}
		run.SteadySamplesPerSec = medianRate(steady, o.Steady)
		run.MaxMove = maxMove(steady, o.Steady)
		rep.Runs = append(rep.Runs, run)
	}
	return rep, nil
}

// medianRate is the median samples/s of iterations from on.
func medianRate(its []IterMetrics, from int64) float64 {
	var v []float64
	for _, m := range its {
		if m.Iter >= from && m.Seconds > 0 {
			v = append(v, m.SamplesPerSec)
		}
	}
	if len(v) == 0 {
		return 0
	}
	return Median(v)
}

// maxMove is the largest share change between consecutive iterations from
// on.
func maxMove(its []IterMetrics, from int64) int {
	best := 0
	for k := 1; k < len(its); k++ {
		a, b := its[k-1], its[k]
		if a.Iter < from || len(a.Shares) != len(b.Shares) {
			continue
		}
		for i := range a.Shares {
			best = max(best, int(math.Abs(float64(b.Shares[i]-a.Shares[i]))))
		}
	}
	return best
}

// settled is how many iterations after at every share is within 10% of
// its median over at+10 to at+20 and stays there through at+20; -1 if
// never. Touching the band and leaving it again is not settling.
func settled(its []IterMetrics, at int64) int {
	byIter := map[int64][]int{}
	for _, m := range its {
		byIter[m.Iter] = m.Shares
	}
	var window [][]int
	for k := at + 10; k <= at+20; k++ {
		if s, ok := byIter[k]; ok {
			window = append(window, s)
		}
	}
	if len(window) == 0 {
		return -1
	}
	target := make([]float64, len(window[0]))
	for i := range target {
		col := make([]float64, 0, len(window))
		for _, s := range window {
			if i < len(s) {
				col = append(col, float64(s[i]))
			}
		}
		target[i] = Median(col)
	}
	within := func(s []int) bool {
		if len(s) != len(target) {
			return false
		}
		for i, v := range s {
			if math.Abs(float64(v)-target[i]) > 0.1*target[i] {
				return false
			}
		}
		return true
	}
	from := int64(-1)
	for k := at; k <= at+20; k++ {
		s, ok := byIter[k]
		switch {
		case !ok:
		case !within(s):
			from = -1
		case from < 0:
			from = k
		}
	}
	if from < 0 {
		return -1
	}
	return int(from - at)
}

// SetCommand records the command line that produced the report.
func (r *BalanceReport) SetCommand(cmd string) { r.Command = cmd }

// WriteJSON writes the report, every iteration included.
func (r BalanceReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable prints each run's iterations (shares, time, samples/s), then
// the figures the issue judges: steady-state rates against the ideal and
// each other, the largest share move, and the reaction to a cap change.
func (r BalanceReport) WriteTable(w io.Writer) error {
	m := r.Machine
	fmt.Fprintf(w, "# %s\n# date %s  host %s  %s/%s  cpus %d  %s\n", r.Command,
		r.Date.UTC().Format(time.RFC3339), m.Host, m.OS, m.Arch, m.CPUs, m.Go)
	for _, run := range r.Runs {
		fmt.Fprintf(w, "# run %s\n%6s %9s %12s  %s\n", run.Name, "iter", "seconds", "samples/s", "shares")
		for _, it := range run.Iterations {
			fmt.Fprintf(w, "%6d %9.3f %12.0f  %v\n", it.Iter, it.Seconds, it.SamplesPerSec, it.Shares)
		}
	}
	fmt.Fprintf(w, "# solo rates %v, ideal %.0f samples/s\n", roundAll(r.Solo), r.Ideal)
	for _, run := range r.Runs {
		line := fmt.Sprintf("# %-8s steady %8.0f samples/s", run.Name, run.SteadySamplesPerSec)
		switch {
		case run.SteadySamplesPerSec == 0:
			line = fmt.Sprintf("# %-8s no steady state: no iteration from the steady start before the cap change", run.Name)
		case r.Ideal > 0:
			line += fmt.Sprintf("  %.3f of ideal", run.SteadySamplesPerSec/r.Ideal)
		}
		line += fmt.Sprintf("  largest share move %d", run.MaxMove)
		switch {
		case run.Settled > 0:
			line += fmt.Sprintf("  settled %d iterations after the cap change (iteration %d)", run.Settled, run.ChangeAt)
		case run.Settled < 0:
			line += "  never settled after the cap change"
		}
		fmt.Fprintln(w, line)
	}
	if len(r.Runs) >= 2 && r.Runs[0].SteadySamplesPerSec > 0 && r.Runs[1].SteadySamplesPerSec > 0 {
		_, err := fmt.Fprintf(w, "# %s / %s: %.2f\n", r.Runs[0].Name, r.Runs[1].Name,
			r.Runs[0].SteadySamplesPerSec/r.Runs[1].SteadySamplesPerSec)
		return err
	}
	return nil
}

func roundAll(v []float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = math.Round(x)
	}
	return out
}
