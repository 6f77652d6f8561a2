package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/gyretest"
	"github.com/gyre-ml/gyre/internal/train"
)

// TestTrainMultiProcess runs `gyre launch -n 2 -- train` over real QUIC
// and checks the report: progress rows, equal shares and the summary.
func TestTrainMultiProcess(t *testing.T) {
	t.Parallel() // other processes' jobs: mostly waiting, little CPU
	out, stderr, err := run(t, testEnv(nil), "--log-level", "warn", "launch", "-n", "2", "--",
		"train", "--iters", "60", "--eval-every", "30", "--batch", "64", "--balance", "static")
	if err != nil {
		t.Fatalf("%v\nstderr:\n%s", err, stderr)
	}
	row := regexp.MustCompile(`(?m)^\[0\] +(30|60) +[0-9.]+ +[0-9.]+% +[0-9]+  32,32$`)
	if n := len(row.FindAllString(out, -1)); n != 2 {
		t.Fatalf("want 2 progress rows with shares 32,32, got %d in:\n%s", n, out)
	}
	if !strings.Contains(out, "2 workers") || !strings.Contains(out, "after 60 iterations") {
		t.Fatalf("no summary in:\n%s", out)
	}
	digests := regexp.MustCompile(`(?m)^\[([01])\] # rank ([01]) final state digest ([0-9a-f]{16}) at iteration 60$`).FindAllStringSubmatch(out, -1)
	if len(digests) != 2 || digests[0][3] != digests[1][3] || digests[0][1] != digests[0][2] || digests[1][1] != digests[1][2] {
		t.Fatalf("want both ranks to print the same final digest, got %q in:\n%s", digests, out)
	}
}

// TestTrainConsole: under launch, with no --log-level, the output is the
// table and a line per event (here each worker's join), with no info
// logs; --log-level info still shows the runtime's every step.
func TestTrainConsole(t *testing.T) {
	args := []string{"launch", "-n", "2", "--", "train", "--iters", "10", "--eval-every", "10", "--batch", "32"}
	out, stderr, err := run(t, plainEnv(t, nil), args...)
	if err != nil {
		t.Fatalf("%v\nstderr:\n%s", err, stderr)
	}
	for r := range 2 {
		joined := regexp.MustCompile(fmt.Sprintf(`(?m)^\[%d\] # rank %d/2 joined at iteration 0 \(epoch \d+\) as 127\.0\.0\.1:\d+$`, r, r))
		if !joined.MatchString(out) {
			t.Fatalf("no join line of rank %d in:\n%s", r, out)
		}
	}
	if !strings.Contains(out, "[0]     iter       loss") || !strings.Contains(out, "after 10 iterations") {
		t.Fatalf("no table in:\n%s", out)
	}
	if strings.Contains(stderr, `"level":"info"`) || strings.Contains(stderr, "gossip started") {
		t.Fatalf("info logs on a launch with no --log-level:\n%s", stderr)
	}
	_, stderr, err = run(t, plainEnv(t, nil), append([]string{"--log-level", "info"}, args...)...)
	if err != nil || !strings.Contains(stderr, "gossip started") || !strings.Contains(stderr, `"rank":1`) {
		t.Fatalf("--log-level info hid the runtime's logs (%v):\n%s", err, stderr)
	}
}

func TestTrainRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"train", "--iters", "0"},
		{"train", "--target-acc", "2"},
		{"train", "--shares", "3,x"},
		{"train", "--compute-procs", "0"},
		{"train", "--compute-procs", "most"},
		{"train", "--seed", "127.0.0.1:7946"},
		{"train", "--seed", "127.0.0.1:7946", "--peers", "127.0.0.1:1,127.0.0.1:2", "--key-file", "k"},
	} {
		if _, _, err := run(t, testEnv(nil), args...); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
	_, _, err := run(t, testEnv(nil), "train", "--seed", "127.0.0.1:7946")
	if err == nil || !strings.Contains(err.Error(), "gossip needs the cluster secret") {
		t.Fatalf("--seed without a key: %v", err)
	}
}

// lineRecorder keeps every Write as one string and fails from the fail'th
// on.
type lineRecorder struct {
	writes []string
	fail   int
}

func (r *lineRecorder) Write(p []byte) (int, error) {
	if r.fail > 0 && len(r.writes)+1 >= r.fail {
		return 0, errors.New("disk full")
	}
	r.writes = append(r.writes, string(p))
	return len(p), nil
}

// TestMetricsWriterWritesEachIteration: every iteration reaches the file
// as one whole line when it ends, not at exit, so a reader following the
// file sees it and a killed worker loses nothing; the first write error
// is kept for the end.
func TestMetricsWriterWritesEachIteration(t *testing.T) {
	rec := &lineRecorder{}
	mw := &metricsWriter{w: rec, global: 64}
	for k := range 3 {
		mw.write(train.Iteration{Iter: int64(k), Shares: []int{32, 32}, Seconds: 0.5, Start: time.Unix(100, 0)})
		if len(rec.writes) != k+1 || !strings.HasSuffix(rec.writes[k], "}\n") || strings.Count(rec.writes[k], "\n") != 1 {
			t.Fatalf("after iteration %d the file has %q", k, rec.writes)
		}
		var m IterationMetrics
		if err := json.Unmarshal([]byte(rec.writes[k]), &m); err != nil || m.Iter != int64(k) || m.SamplesPerSec != 128 || m.Start != 100 {
			t.Fatalf("line %q: %+v, %v", rec.writes[k], m, err)
		}
	}
	if mw.err != nil {
		t.Fatal(mw.err)
	}
	bad := &metricsWriter{w: &lineRecorder{fail: 2}, global: 64}
	for k := range 3 {
		bad.write(train.Iteration{Iter: int64(k), Seconds: 1})
	}
	if bad.err == nil || bad.err.Error() != "disk full" {
		t.Fatalf("write error %v, want disk full", bad.err)
	}
}

// TestSaveParamsReplacesTheFile: an earlier, longer file is replaced by
// the parameters alone, as little-endian float64s in order.
func TestSaveParamsReplacesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "params")
	if err := os.WriteFile(path, make([]byte, 1000), 0o666); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o666)
	if err != nil {
		t.Fatal(err)
	}
	if err := saveParams(f, [][]float64{{1, -2}, {0.5}}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got []float64
	for i := 0; i+8 <= len(b); i += 8 {
		got = append(got, math.Float64frombits(binary.LittleEndian.Uint64(b[i:])))
	}
	if len(b) != 24 || !slices.Equal(got, []float64{1, -2, 0.5}) {
		t.Fatalf("the file holds %d bytes, %v; want 24, [1 -2 0.5]", len(b), got)
	}
}

// TestTrainAlgoPinned: with --algo pinned, two runs of a 3-worker job end
// in one digest on every rank, and the two algorithms, which sum in
// different orders, end in different ones: the pin takes effect.
func TestTrainAlgoPinned(t *testing.T) {
	t.Parallel() // other processes' jobs: mostly waiting, little CPU
	digest := regexp.MustCompile(`(?m)^\[[0-2]\] # rank [0-2] final state digest ([0-9a-f]{16}) at iteration 20$`)
	final := map[string]string{}
	for _, algo := range []string{"ring", "doubling", "ring", "doubling"} {
		out, stderr, err := run(t, plainEnv(t, nil), "--log-level", "warn", "launch", "-n", "3", "--transport", "tcp", "--insecure", "--",
			"train", "--iters", "20", "--eval-every", "20", "--batch", "60", "--balance", "static", "--algo", algo)
		if err != nil {
			t.Fatalf("--algo %s: %v\nstderr:\n%s", algo, err, stderr)
		}
		ds := digest.FindAllStringSubmatch(out, -1)
		if len(ds) != 3 || ds[0][1] != ds[1][1] || ds[1][1] != ds[2][1] {
			t.Fatalf("--algo %s: want the same final digest on 3 ranks, got %q in:\n%s", algo, ds, out)
		}
		if prev, ok := final[algo]; ok && prev != ds[0][1] {
			t.Errorf("--algo %s: digest %s, then %s", algo, prev, ds[0][1])
		}
		final[algo] = ds[0][1]
	}
	if final["ring"] == final["doubling"] {
		t.Errorf("ring and doubling both ended in %s: --algo has no effect", final["ring"])
	}
}

// TestTrainMNIST: --data mnist trains the MNIST model, 784 inputs and a
// ReLU layer of 128, on a batch the flags still set, and both ranks end in
// one digest.
func TestTrainMNIST(t *testing.T) {
	t.Parallel() // other processes' jobs: mostly waiting, little CPU
	out, stderr, err := run(t, plainEnv(t, nil), "--log-level", "warn", "launch", "-n", "2", "--",
		"train", "--data", "mnist", "--iters", "10", "--eval-every", "10", "--batch", "64", "--balance", "static")
	if err != nil {
		t.Fatalf("%v\nstderr:\n%s", err, stderr)
	}
	if !strings.Contains(out, "2 workers, mnist data, model [784 128 10] (101770 parameters), global batch 64, lr 0.1") {
		t.Fatalf("no MNIST model in:\n%s", out)
	}
	digests := regexp.MustCompile(`(?m)^\[[01]\] # rank [01] final state digest ([0-9a-f]{16}) at iteration 10$`).FindAllStringSubmatch(out, -1)
	if len(digests) != 2 || digests[0][1] != digests[1][1] {
		t.Fatalf("want both ranks to print the same final digest, got %q in:\n%s", digests, out)
	}
}

// TestTrainMNISTWithoutFiles: a built gyre whose module cache lacks the
// GoMNIST module fails at once with --data mnist, before joining, and
// says to pass --data-dir; so does a --data-dir without the files.
func TestTrainMNISTWithoutFiles(t *testing.T) {
	bin := gyretest.Gyre(t)
	empty := t.TempDir()
	for _, args := range [][]string{
		{"train", "--data", "mnist"},
		{"train", "--data", "mnist", "--data-dir", empty},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(), "GOMODCACHE="+empty)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		start := time.Now()
		err := cmd.Run()
		took, timedOut := time.Since(start), ctx.Err() != nil
		cancel()
		if err == nil || timedOut {
			t.Fatalf("%v: %v after %v, want a failure at once\nstdout:\n%s", args, err, took, stdout.String())
		}
		if took > 10*time.Second || stdout.Len() > 0 {
			t.Errorf("%v: failed after %v, having printed %q: want a failure before anything starts", args, took, stdout.String())
		}
		for _, want := range []string{"--data-dir", "train-images-idx3-ubyte.gz"} {
			if !strings.Contains(stderr.String(), want) {
				t.Errorf("%v: the error does not say %q:\n%s", args, want, stderr.String())
			}
		}
	}
}

// TestTrainRejectsBadData: an unknown --data, or --data-dir without
// --data mnist, is refused before the worker joins anything.
func TestTrainRejectsBadData(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"train", "--data", "bogus"}, `--data "bogus": want synthetic or mnist`},
		{[]string{"launch", "-n", "2", "--", "train", "--data", "bogus"}, `--data "bogus": want synthetic or mnist`},
		{[]string{"train", "--data-dir", t.TempDir()}, "--data-dir is for --data mnist"},
	} {
		out, stderr, err := run(t, plainEnv(t, nil), tc.args...)
		if err == nil || !strings.Contains(err.Error()+stderr, tc.want) {
			t.Errorf("%v: %v\nstderr:\n%s\nwant an error saying %q", tc.args, err, stderr, tc.want)
		}
		if strings.Contains(out, "joined") {
			t.Errorf("%v: a worker joined before the refusal:\n%s", tc.args, out)
		}
	}
}
