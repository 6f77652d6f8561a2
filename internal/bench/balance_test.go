package bench

import (
	"bytes"
	"strings"
	"testing"
)

// synthetic is a run of n iterations: shares from sharesAt, seconds 1,
// samples/s rate.
func synthetic(n int, rate float64, sharesAt func(k int64) []int) []IterMetrics {
	out := make([]IterMetrics, n)
	for k := range out {
		out[k] = IterMetrics{Iter: int64(k), Shares: sharesAt(int64(k)), Seconds: 1, SamplesPerSec: rate, Start: float64(k)}
	}
	return out
}

// TestAnalyseBalance: steady rates, the ideal from the solo runs, the
// largest share move and the iterations a cap change takes to settle.
func TestAnalyseBalance(t *testing.T) {
	solo50 := synthetic(10, 100, func(int64) []int { return []int{40} })
	solo15 := synthetic(10, 30, func(int64) []int { return []int{40} })
	static := synthetic(40, 120, func(int64) []int { return []int{10, 10, 10, 10} })
	lbbsp := synthetic(60, 300, func(k int64) []int {
		switch {
		case k < 30:
			return []int{12, 12, 12, 4} // steady
		case k == 30:
			return []int{12, 12, 12, 4} // first iteration under the new cap: shares not yet moved
		case k == 31:
			return []int{6, 15, 15, 4} // the worker at 6 is over 10% from its 5
		}
		return []int{5, 15, 16, 4}
	})
	for k := 30; k < 60; k++ {
		lbbsp[k].SamplesPerSec = 200
	}
	rep, err := AnalyseBalance(BalanceOptions{Steady: 20, ChangeAt: 30, Changed: "lbbsp"},
		[][]IterMetrics{solo50, solo50, solo50, solo15}, []string{"lbbsp", "static"}, [][]IterMetrics{lbbsp, static})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Ideal != 330 {
		t.Fatalf("ideal %v, want 330", rep.Ideal)
	}
	lb, st := rep.Runs[0], rep.Runs[1]
	if lb.SteadySamplesPerSec != 300 || st.SteadySamplesPerSec != 120 {
		t.Fatalf("steady rates %v and %v, want 300 (before the change) and 120", lb.SteadySamplesPerSec, st.SteadySamplesPerSec)
	}
	if lb.MaxMove != 0 || lb.Settled != 2 || st.Settled != 0 {
		t.Fatalf("lbbsp: max move %d, settled %d; static settled %d", lb.MaxMove, lb.Settled, st.Settled)
	}
	// The same change given as a time: the first iteration that began
	// after it is 30.
	byTime, _ := AnalyseBalance(BalanceOptions{Steady: 20, ChangeTime: 29.5, Changed: "lbbsp"},
		nil, []string{"lbbsp"}, [][]IterMetrics{lbbsp})
	if r := byTime.Runs[0]; r.ChangeAt != 30 || r.Settled != 2 {
		t.Fatalf("by time: change at %d, settled %d", r.ChangeAt, r.Settled)
	}
	// Shares that reach the band and leave it again have not settled:
	// from 31 to 33 they are in it, at 34 out, back from 35.
	bounce := synthetic(60, 300, func(k int64) []int {
		switch {
		case k < 31:
			return []int{12, 12, 12, 4}
		case k == 34:
			return []int{8, 13, 14, 5}
		}
		return []int{5, 15, 16, 4}
	})
	again, _ := AnalyseBalance(BalanceOptions{Steady: 20, ChangeAt: 30, Changed: "lbbsp"}, nil, []string{"lbbsp"}, [][]IterMetrics{bounce})
	if r := again.Runs[0]; r.Settled != 5 {
		t.Fatalf("shares that left the band at 34: settled %d, want 5", r.Settled)
	}
	// A host's solo rate may pool runs before and after a job, each run's
	// warm-up skipped: 7 iterations at 100 and 7 at 120, median 110.
	before := synthetic(10, 100, func(int64) []int { return []int{40} })
	after := synthetic(10, 120, func(int64) []int { return []int{40} })
	before[0].SamplesPerSec, after[0].SamplesPerSec = 1, 1 // warm-ups, skipped
	pooled, _ := AnalyseBalance(BalanceOptions{Steady: 20}, [][]IterMetrics{append(before, after...)}, nil, nil)
	if pooled.Ideal != 110 {
		t.Fatalf("pooled solo rate %v, want 110", pooled.Ideal)
	}
	// A change before the steady state leaves no steady rate: the report
	// says so rather than printing 0 as a figure.
	early, _ := AnalyseBalance(BalanceOptions{Steady: 20, ChangeAt: 15, Changed: "lbbsp"},
		[][]IterMetrics{solo50}, []string{"lbbsp", "static"}, [][]IterMetrics{lbbsp, static})
	var table bytes.Buffer
	early.WriteTable(&table)
	if !strings.Contains(table.String(), "lbbsp    no steady state") || strings.Contains(table.String(), "lbbsp / static") {
		t.Fatalf("a run with no steady state:\n%s", table.String())
	}
	var out bytes.Buffer
	if err := rep.WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ideal 330", "0.909 of ideal", "settled 2 iterations", "lbbsp / static: 2.50"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("table lacks %q:\n%s", want, out.String())
		}
	}
}

// TestReadMetrics reads the lines gyre train writes, and names a bad one.
func TestReadMetrics(t *testing.T) {
	in := `{"iter":0,"loss":2.3,"shares":[3,5],"rank":0,"seconds":0.5,"samples_per_sec":16}` + "\n\n" +
		`{"iter":1,"loss":2.1,"shares":[4,4],"rank":0,"seconds":0.25,"samples_per_sec":32}` + "\n"
	ms, err := ReadMetrics(strings.NewReader(in))
	if err != nil || len(ms) != 2 || ms[1].Iter != 1 || ms[1].Shares[0] != 4 || ms[1].SamplesPerSec != 32 {
		t.Fatalf("got %+v, %v", ms, err)
	}
	if _, err := ReadMetrics(strings.NewReader("{\"iter\":0}\nnot json\n")); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("bad line: %v", err)
	}
}
