package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gyre-ml/gyre/internal/bench"
)

// TestBenchOverlapMultiProcess runs the benchmark through launch, two real
// processes of this binary on loopback with a tiny model, and checks that
// every mode's rows are there with positive times, and the JSON report.
func TestBenchOverlapMultiProcess(t *testing.T) {
	t.Parallel() // other processes' jobs: mostly waiting, little CPU
	jsonPath := filepath.Join(t.TempDir(), "overlap.json")
	out, stderr, err := run(t, testEnv(nil), "--log-level", "warn", "bench", "overlap", "-n", "2",
		"--hidden", "64,64", "--batch", "32", "--iters", "2", "-w", "1", "--timeout", "60s", "--json", jsonPath, "--compute-procs", "1")
	if err != nil {
		t.Fatalf("%v\nstderr:\n%s", err, stderr)
	}
	rows := map[string]bool{}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) != 5 || !slices.Contains(bench.OverlapModes, f[0]) {
			continue // not a timing row
		}
		rows[f[0]+" "+f[1]] = true
		if v, err := strconv.ParseFloat(f[2], 64); err != nil || v <= 0 {
			t.Errorf("row %q: time %q is not a positive number", l, f[2])
		}
		if f[4] != "2" {
			t.Errorf("row %q: %s iterations, want 2", l, f[4])
		}
	}
	for _, want := range []string{"overlap iteration", "overlap backward", "overlap wait", "no-overlap iteration",
		"no-overlap wait", "compute forward", "compute backward", "compute step", "comm iteration"} {
		if !rows[want] {
			t.Errorf("no %q row in:\n%s", want, out)
		}
	}
	for _, want := range []string{"# ranks 2  transport quic", "compute procs 1", "comm/backward", "overlap/(forward+max(backward,comm))", "no-overlap/overlap"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep bench.OverlapReport
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.ComputeProcs != 1 {
		t.Errorf("JSON report: compute_procs %d, want the 1 given", rep.ComputeProcs)
	}
	if len(rep.Modes) != 4 || len(rep.Modes[0].Samples) != 2 || len(rep.Modes[0].RankMedians) != 2 {
		t.Fatalf("JSON report: %d modes, want 4 with 2 samples and 2 ranks' medians each:\n%s", len(rep.Modes), b)
	}
	if rep.Figures.Speedup <= 0 || rep.Figures.CommOverBackward <= 0 {
		t.Fatalf("JSON report: figures %+v", rep.Figures)
	}
}
