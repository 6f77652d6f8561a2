package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTrainMetricsAndBenchBalance: gyre train --metrics-file writes a JSON
// line per iteration, and gyre bench balance reports on such files; bad
// input is named.
func TestTrainMetricsAndBenchBalance(t *testing.T) {
	dir := t.TempDir()
	metrics := filepath.Join(dir, "m.jsonl")
	if _, stderr, err := run(t, testEnv(nil), "--log-level", "warn", "train", "--iters", "30", "--eval-every", "30",
		"--batch", "64", "--metrics-file", metrics); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	f, err := os.Open(metrics)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []IterationMetrics
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m IterationMetrics
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, m)
	}
	if len(lines) != 30 || lines[29].Iter != 29 || len(lines[0].Shares) != 1 || lines[0].Shares[0] != 64 ||
		!(lines[5].Seconds > 0) || !(lines[5].Loss > 0) || lines[5].SamplesPerSec != 64/lines[5].Seconds {
		t.Fatalf("metrics %+v", lines)
	}

	out, stderr, err := run(t, testEnv(nil), "bench", "balance", "--run", "a="+metrics, "--run", "b="+metrics,
		"--solo", metrics+","+metrics, "--steady", "10", "--json", filepath.Join(dir, "r.json"))
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	for _, want := range []string{"# run a", "# run b", "ideal", "of ideal", "a / b: 1.00"} {
		if !strings.Contains(out, want) {
			t.Fatalf("report lacks %q:\n%s", want, out)
		}
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "balance"}, "at least one --run"},
		{[]string{"bench", "balance", "--run", "nofile"}, "want NAME=METRICS"},
		{[]string{"bench", "balance", "--run", "a=" + filepath.Join(dir, "missing")}, "--run a"},
		{[]string{"bench", "balance", "--run", "a=" + metrics, "--solo", metrics + "," + filepath.Join(dir, "gone")}, "gone"},
	} {
		if _, _, err := run(t, testEnv(nil), tt.args...); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: got %v, want %q", tt.args, err, tt.want)
		}
	}
}
