package linkbench

import (
	"bytes"
	"encoding/json"
	"github.com/gyre-ml/gyre/internal/bench"
	"math"
	"strings"
	"testing"
	"time"
)

func sampleReport() *Report {
	return &Report{
		Command: "gyre bench transport --runs=3",
		Date:    time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
		Machine: bench.Machine{Host: "h", OS: "linux", Arch: "amd64", CPUs: 2, Go: "go1.26"},
		Settings: Settings{
			Variants: []string{"quic"}, Stripes: []int{1}, Sizes: []int64{4096, 1 << 20}, Warmup: 3, Runs: 3,
		},
		Method: []string{"one-way: explained"},
		OneWay: []OneWay{
			newOneWay("quic", BareQUIC.Describe(), 1, 1<<20, 20, []Pair{{4000, 2000}, {5000, 2500}, {4200, 2000}}),
		},
		RoundTrip: []RTT{
			newRTT("quic", BareQUIC.Describe(), 1, 4096, 20, []Pair{{150, 100}, {160, 100}, {140, 120}}),
		},
	}
}

func TestSummaries(t *testing.T) {
	r := sampleReport()
	o := r.OneWay[0]
	if o.TimeUS != 4200 || o.BareTimeUS != 2000 {
		t.Fatalf("one-way medians = %v, %v", o.TimeUS, o.BareTimeUS)
	}
	// 1 MiB in 4200 us.
	if want := float64(1<<20) / 4200e-6 / 1e9; math.Abs(o.GBps-want) > 1e-9 {
		t.Fatalf("GB/s = %v, want %v", o.GBps, want)
	}
	// Per-run bandwidth ratios 0.5, 0.5, 0.476: the median is 0.5.
	if o.Ratio != 0.5 {
		t.Fatalf("one-way ratio = %v, want 0.5", o.Ratio)
	}
	rt := r.RoundTrip[0]
	if rt.RTTUS != 150 || rt.BareRTTUS != 100 {
		t.Fatalf("rtt medians = %v, %v", rt.RTTUS, rt.BareRTTUS)
	}
	// Per-run time ratios 1.5, 1.6, 1.167: the median is 1.5.
	if rt.Ratio != 1.5 {
		t.Fatalf("rtt ratio = %v, want 1.5", rt.Ratio)
	}
}

func TestWriteTable(t *testing.T) {
	var b bytes.Buffer
	if err := sampleReport().WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"# gyre bench transport --runs=3\n",
		"# date 2025-01-02T03:04:05Z  host h  linux/amd64  cpus 2  go1.26\n",
		"# warmup 3  iters 20 below 16M, 10 at or above  runs 3",
		"# one-way: explained\n",
		"variant  stripes   size_bytes  iters  time_us(med)  GB/s(med)  bare GB/s(med)  ratio(med)",
		"variant  stripes   size_bytes  iters  rtt_us(med)  bare rtt_us(med)  ratio(med)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	rows := dataRows(out)
	if len(rows) != 2 {
		t.Fatalf("want 2 data rows, got %d:\n%s", len(rows), out)
	}
	if got := strings.Fields(rows[0]); strings.Join(got, " ") != "quic 1 1048576 20 4200.0 0.250 0.524 0.500" {
		t.Errorf("one-way row = %q", rows[0])
	}
	if got := strings.Fields(rows[1]); strings.Join(got, " ") != "quic 1 4096 20 150.0 100.0 1.500" {
		t.Errorf("rtt row = %q", rows[1])
	}
}

// dataRows returns the lines of a table that are not '#' comments.
func dataRows(table string) []string {
	var rows []string
	for _, l := range strings.Split(table, "\n") {
		if strings.TrimSpace(l) != "" && !strings.HasPrefix(l, "#") {
			rows = append(rows, l)
		}
	}
	return rows
}

func TestWriteJSONShape(t *testing.T) {
	var b bytes.Buffer
	if err := sampleReport().WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"command", "date", "machine", "settings", "method", "one_way", "round_trip"} {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
	row := m["one_way"].([]any)[0].(map[string]any)
	for _, k := range []string{"variant", "bare", "stripes", "size_bytes", "iters", "time_us", "gbps", "bare_time_us", "bare_gbps", "ratio", "runs"} {
		if _, ok := row[k]; !ok {
			t.Errorf("one_way row lacks %q", k)
		}
	}
	run := row["runs"].([]any)[0].(map[string]any)
	if run["gyre_us"] != 4000.0 || run["bare_us"] != 2000.0 {
		t.Errorf("first run = %v", run)
	}
	rtt := m["round_trip"].([]any)[0].(map[string]any)
	for _, k := range []string{"rtt_us", "bare_rtt_us", "ratio", "runs"} {
		if _, ok := rtt[k]; !ok {
			t.Errorf("round_trip row lacks %q", k)
		}
	}
	// The report reads back into the same type.
	var back Report
	if err := json.Unmarshal(b.Bytes(), &back); err != nil || back.OneWay[0].Ratio != 0.5 {
		t.Fatalf("round trip through JSON: %v, %+v", err, back.OneWay)
	}
}

func TestWriteTableBidir(t *testing.T) {
	r := sampleReport()
	r.Settings.Bidir = true
	r.RoundTrip = nil
	r.OneWay[0].Bidir = true
	var b bytes.Buffer
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if !strings.Contains(out, "# Bidirectional throughput (GB/s per direction)\n") || strings.Contains(out, "Round trip") {
		t.Errorf("bidir table:\n%s", out)
	}
	if rows := dataRows(out); len(rows) != 1 {
		t.Fatalf("want 1 data row, got %d:\n%s", len(rows), out)
	}
	b.Reset()
	if err := r.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b.Bytes(), &back); err != nil || !back.Settings.Bidir || !back.OneWay[0].Bidir {
		t.Fatalf("bidir flags lost through JSON: %v, %+v", err, back)
	}
	if !strings.Contains(b.String(), `"bidir": true`) {
		t.Errorf("JSON lacks the bidir field:\n%s", b.String())
	}
}
