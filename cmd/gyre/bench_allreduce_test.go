package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestBenchAllReduceMultiProcess runs the benchmark through launch, N real
// processes of this binary over each real transport on loopback, and checks
// that every row is complete and every element was verified.
func TestBenchAllReduceMultiProcess(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags []string
	}{
		{"quic", []string{"--transport", "quic"}},
		{"tcp", []string{"--transport", "tcp"}},
		{"tcp insecure", []string{"--transport", "tcp", "--insecure"}},
	} {
		for _, n := range []int{2, 4} {
			t.Run(fmt.Sprintf("%s n=%d", tc.name, n), func(t *testing.T) {
				args := append([]string{"--log-level", "warn", "bench", "allreduce", "-n", strconv.Itoa(n),
					"--sizes", "4K,1M", "--iters", "3", "-w", "1", "--timeout", "60s"}, tc.flags...)
				out, stderr, err := run(t, testEnv(nil), args...)
				if err != nil {
					t.Fatalf("%v\nstderr:\n%s", err, stderr)
				}
				rows := 0
				for _, l := range strings.Split(out, "\n") {
					f := strings.Fields(l)
					if len(f) != 8 || strings.HasPrefix(l, "#") || f[0] == "size_bytes" {
						continue
					}
					rows++
					if f[7] != "OK" {
						t.Errorf("row %q: check %s", l, f[7])
					}
					for _, x := range f[1:7] {
						if v, err := strconv.ParseFloat(x, 64); err != nil || v <= 0 {
							t.Errorf("row %q: %q is not a positive number", l, x)
						}
					}
				}
				if rows != 2 {
					t.Fatalf("want 2 rows, got %d in:\n%s", rows, out)
				}
				if !strings.Contains(out, fmt.Sprintf("# ranks %d", n)) {
					t.Fatalf("table does not say %d ranks:\n%s", n, out)
				}
			})
		}
	}
}

// TestBenchAllReduceMismatchEverywhere gives one rank of three another
// size: every rank, not just the odd one, must fail with a mismatch rather
// than hang. Each rank's exit status is hidden from launch so that none is
// stopped before it reports.
func TestBenchAllReduceMismatchEverywhere(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	script := `S=4K; [ "$GYRE_RANK" = 2 ] && S=8K; ` +
		`"$0" --log-level error bench allreduce --sizes $S --iters 1 -w 0 --timeout 30s >/dev/null 2>"$GYRE_RANK.err"; ` +
		`echo "status=$? $(grep -ci mismatch $GYRE_RANK.err)"`
	dir := t.TempDir()
	wd, _ := os.Getwd()
	if err := os.Chdir(dir); err != nil {
		t.Fatal(err)
	}
	defer os.Chdir(wd)
	lines, stderr, err := launchLines(t, nil, "-n", "3", "--", "sh", "-c", script, exe)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if len(lines) != 3 {
		t.Fatalf("want a line per rank, got %q", lines)
	}
	for r, l := range lines {
		f := strings.Fields(l)
		if len(f) != 3 || f[1] != "status=1" || f[2] == "0" {
			b, _ := os.ReadFile(fmt.Sprintf("%s/%d.err", dir, r))
			t.Errorf("rank %d: %q, want status 1 and a mismatch error; its stderr:\n%s", r, l, b)
		}
	}
}
