package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/gyre-ml/gyre/internal/bench/linkbench"
	"github.com/gyre-ml/gyre/internal/secret"
)

// TestBenchTransport runs a tiny `gyre bench transport` end to end: this
// test binary acts as the parent here and as the peer in a child process,
// over the real transports on loopback.
func TestBenchTransport(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	jsonPath := filepath.Join(t.TempDir(), "out.json")
	// The child must see neither of these: it gets its secret in GYRE_KEY
	// and its settings as flags.
	e := testEnv(map[string]string{"GYRE_KEY_FILE": "/nonexistent", "GYRE_STRIPES": "many"})
	out, stderr, err := run(t, e,
		"--log-level", "warn", "bench", "transport",
		"--sizes", "4K,300K", "--stripes", "1,2", "--runs", "1", "--iters", "3", "-w", "1",
		"--json", jsonPath)
	if err != nil {
		t.Fatalf("%v\nstderr:\n%s", err, stderr)
	}
	t.Logf("output:\n%s", out)

	rows := map[string]int{}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) == 0 || strings.HasPrefix(l, "#") {
			continue
		}
		// variant stripes size iters then 4 (one-way) or 3 (round trip) figures.
		if len(f) != 8 && len(f) != 7 {
			t.Fatalf("row %q: %d fields", l, len(f))
		}
		for _, x := range f[1:] {
			if v, err := strconv.ParseFloat(x, 64); err != nil || v <= 0 {
				t.Fatalf("row %q: %q is not a positive number", l, x)
			}
		}
		rows[f[0]+"/"+strconv.Itoa(len(f))]++
	}
	for _, v := range []string{"quic", "tcp", "tcp-insecure"} {
		// 2 sizes x 2 stripe counts one-way, 2 stripe counts round trip.
		if rows[v+"/8"] != 4 || rows[v+"/7"] != 2 {
			t.Errorf("variant %s: %d one-way and %d round-trip rows, want 4 and 2", v, rows[v+"/8"], rows[v+"/7"])
		}
	}

	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep linkbench.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.OneWay) != 12 || len(rep.RoundTrip) != 6 || !slices.Equal(rep.Settings.Stripes, []int{1, 2}) {
		t.Fatalf("JSON report: %d one-way, %d round-trip rows, settings %+v", len(rep.OneWay), len(rep.RoundTrip), rep.Settings)
	}
}

// TestBenchTransportBidir runs a tiny `gyre bench transport --bidir` end
// to end over every variant: one row per size and stripe count with both
// sides' throughput, no round trip, and bidir marked in the JSON.
func TestBenchTransportBidir(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	jsonPath := filepath.Join(t.TempDir(), "out.json")
	out, stderr, err := run(t, testEnv(nil),
		"--log-level", "warn", "bench", "transport", "--bidir",
		"--sizes", "4K,300K", "--stripes", "1,2", "--runs", "1", "--iters", "3", "-w", "1",
		"--json", jsonPath)
	if err != nil {
		t.Fatalf("%v\nstderr:\n%s", err, stderr)
	}
	t.Logf("output:\n%s", out)
	if !strings.Contains(out, "# Bidirectional throughput") || strings.Contains(out, "Round trip") {
		t.Fatalf("not a bidir table:\n%s", out)
	}
	rows := map[string]int{}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) == 0 || strings.HasPrefix(l, "#") {
			continue
		}
		if len(f) != 8 {
			t.Fatalf("row %q: %d fields, want 8", l, len(f))
		}
		for i, x := range f[1:] {
			// GB/s of tiny messages under the race detector may round to
			// 0.000 in the table; the JSON below has them unrounded.
			v, err := strconv.ParseFloat(x, 64)
			if gbps := i == 4 || i == 5; err != nil || v < 0 || (v == 0 && !gbps) {
				t.Fatalf("row %q: %q is not a positive number", l, x)
			}
		}
		rows[f[0]]++
	}
	for _, v := range []string{"quic", "tcp", "tcp-insecure"} {
		if rows[v] != 4 {
			t.Errorf("variant %s: %d rows, want 4 (2 sizes x 2 stripe counts)", v, rows[v])
		}
	}

	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep linkbench.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.Settings.Bidir || len(rep.OneWay) != 12 || len(rep.RoundTrip) != 0 {
		t.Fatalf("JSON report: %d rows, %d round-trip rows, settings %+v", len(rep.OneWay), len(rep.RoundTrip), rep.Settings)
	}
	for _, r := range rep.OneWay {
		if !r.Bidir || r.GBps <= 0 || r.BareGBps <= 0 {
			t.Errorf("bad row %+v", r)
		}
	}
}

// TestBenchTransportKeyFile runs the benchmark with a keygen'd secret, and
// checks that it is the secret used, not an ephemeral one.
func TestBenchTransportKeyFile(t *testing.T) {
	keyPath := filepath.Join(t.TempDir(), "cluster.key")
	if _, stderr, err := run(t, testEnv(nil), "keygen", "--out", keyPath); err != nil {
		t.Fatalf("keygen: %v\n%s", err, stderr)
	}
	want, err := secret.Load(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := benchSecret(keyPath); err != nil || got != want {
		t.Fatalf("benchSecret(file) = %v, %v; want the file's secret %v", got, err, want)
	}
	if a, _ := benchSecret(""); a == want || a.IsZero() {
		t.Fatal("without --key-file the secret is not a fresh ephemeral one")
	}
	out, stderr, err := run(t, testEnv(nil), "--log-level", "warn", "bench", "transport",
		"--transport", "quic", "--key-file", keyPath, "--sizes", "4K", "--runs", "1", "--iters", "2", "-w", "1")
	if err != nil {
		t.Fatalf("%v\nstderr:\n%s", err, stderr)
	}
	if !strings.Contains(out, "quic") {
		t.Fatalf("no quic rows in:\n%s", out)
	}
}
