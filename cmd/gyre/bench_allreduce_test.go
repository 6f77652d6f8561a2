package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gyre-ml/gyre/internal/wire"
)

// TestBenchAllReduceMultiProcess runs the benchmark through launch, N real
// processes of this binary over each real transport on loopback, and checks
// that every row is complete and every element was verified.
func TestBenchAllReduceMultiProcess(t *testing.T) {
	t.Parallel() // other processes' jobs: mostly waiting, little CPU
	for _, tc := range []struct {
		name  string
		flags []string
	}{
		{"quic", []string{"--transport", "quic"}},
		{"tcp", []string{"--transport", "tcp"}},
		{"tcp insecure", []string{"--transport", "tcp", "--insecure"}},
		// Compression: the check then allows the wire format's rounding.
		{"tcp insecure bf16", []string{"--transport", "tcp", "--insecure", "--compress", "bf16", "--op", "avg"}},
		{"tcp insecure fp16", []string{"--transport", "tcp", "--insecure", "--compress", "fp16"}},
	} {
		for _, n := range []int{2, 4} {
			t.Run(fmt.Sprintf("%s n=%d", tc.name, n), func(t *testing.T) {
				t.Parallel()
				args := append([]string{"--log-level", "warn", "bench", "allreduce", "-n", strconv.Itoa(n),
					"--sizes", "4K,1M", "--iters", "3", "-w", "1", "--timeout", "60s"}, tc.flags...)
				e := plainEnv(t, nil)
				if tc.name == "quic" && n == 2 {
					e = testEnv(nil) // the default, with race-instrumented workers
				}
				out, stderr, err := run(t, e, args...)
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
					for i, x := range f[1:7] {
						v, err := strconv.ParseFloat(x, 64)
						// algbw and busbw print three decimals: a 4K row
						// slower than 8 ms, which the race detector on a
						// busy 2-core machine can make it, shows 0.000.
						small := f[0] == "4096" && (i == 3 || i == 4) // algbw, busbw
						if err != nil || v < 0 || v == 0 && !small {
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
				if m := regexp.MustCompile(`  ring ([0-9-]+)  `).FindStringSubmatch(out); m == nil || !isRingOrder(m[1], n) {
					t.Fatalf("table does not give the ring order of %d ranks:\n%s", n, out)
				}
				if i := slices.Index(tc.flags, "--compress"); i >= 0 && !strings.Contains(out, "compress "+tc.flags[i+1]) {
					t.Fatalf("table does not say compress %s:\n%s", tc.flags[i+1], out)
				}
			})
		}
	}
}

// isRingOrder reports whether s, such as "0-2-1-3", lists each of n
// ranks once.
func isRingOrder(s string, n int) bool {
	var ranks []int
	for _, f := range strings.Split(s, "-") {
		r, err := strconv.Atoi(f)
		if err != nil {
			return false
		}
		ranks = append(ranks, r)
	}
	slices.Sort(ranks)
	for i, r := range ranks {
		if r != i {
			return false
		}
	}
	return len(ranks) == n
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
	lines, stderr, err := launchLines(t, nil, "-n", "3", "--static", "--", "sh", "-c", script, exe)
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

// TestBenchAllReduceFlags checks the sweep flags' validation, --compress in
// particular: none, bf16 or fp16, and only for float32 data.
func TestBenchAllReduceFlags(t *testing.T) {
	base := allReduceFlags{sizes: "4K", op: "sum", dtype: "float32", compress: "none"}
	for _, tc := range []struct {
		name   string
		change func(*allReduceFlags)
		want   wire.DType // the Compress option, if valid
		err    string     // a substring of the error, if not
	}{
		{"default", func(*allReduceFlags) {}, wire.DTypeBytes, ""},
		{"bf16", func(f *allReduceFlags) { f.compress = "bf16" }, wire.DTypeBF16, ""},
		{"FP16", func(f *allReduceFlags) { f.compress = "FP16" }, wire.DTypeFP16, ""},
		{"none float64", func(f *allReduceFlags) { f.dtype = "float64" }, wire.DTypeBytes, ""},
		{"unknown", func(f *allReduceFlags) { f.compress = "zstd" }, 0, "--compress"},
		{"empty", func(f *allReduceFlags) { f.compress = "" }, 0, "--compress"},
		{"bf16 float64", func(f *allReduceFlags) { f.compress, f.dtype = "bf16", "float64" }, 0, "float32"},
		{"fp16 int32", func(f *allReduceFlags) { f.compress, f.dtype = "fp16", "int32" }, 0, "float32"},
		{"algo ring", func(f *allReduceFlags) { f.algo = "ring" }, wire.DTypeBytes, ""},
		{"algo unknown", func(f *allReduceFlags) { f.algo = "tree" }, 0, "--algo"},
		{"ring order unknown", func(f *allReduceFlags) { f.ringOrder = "random" }, 0, "--ring-order"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fl := base
			tc.change(&fl)
			o, err := fl.options()
			switch {
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("got %v, want an error about %s", err, tc.err)
			case tc.err == "" && err != nil:
				t.Fatal(err)
			case tc.err == "" && o.Compress != tc.want:
				t.Fatalf("Compress = %v, want %v", o.Compress, tc.want)
			}
		})
	}
}

// TestProfilesPerWorker checks that the profile flags of a launching
// command reach every worker, each writing its own file, and that the
// launcher writes none.
func TestProfilesPerWorker(t *testing.T) {
	t.Parallel() // other processes' jobs: mostly waiting, little CPU
	dir := t.TempDir()
	cpu, trace := filepath.Join(dir, "cpu"), filepath.Join(dir, "trace")
	_, stderr, err := run(t, testEnv(nil), "--log-level", "warn", "--cpu-profile", cpu, "--exec-trace", trace,
		"bench", "allreduce", "-n", "2", "--transport", "tcp", "--insecure", "--sizes", "4K", "--iters", "3", "-w", "1")
	if err != nil {
		t.Fatalf("%v\nstderr:\n%s", err, stderr)
	}
	for _, f := range []string{cpu + ".0", cpu + ".1", trace + ".0", trace + ".1"} {
		if st, err := os.Stat(f); err != nil || st.Size() == 0 {
			t.Errorf("%s: want a non-empty profile, got %v", filepath.Base(f), err)
		}
	}
	for _, f := range []string{cpu, trace} {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("the launcher wrote %s itself", filepath.Base(f))
		}
	}
}
