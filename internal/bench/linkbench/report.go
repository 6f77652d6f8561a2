package linkbench

import (
	"encoding/json"
	"fmt"
	"github.com/gyre-ml/gyre/internal/bench"
	"io"
	"time"
)

// Report is the result of a transport benchmark, as printed and as written
// to --json.
type Report struct {
	Command   string        `json:"command"`
	Date      time.Time     `json:"date"`
	Machine   bench.Machine `json:"machine"`
	Settings  Settings      `json:"settings"`
	Method    []string      `json:"method"`
	OneWay    []OneWay      `json:"one_way"`
	RoundTrip []RTT         `json:"round_trip"`
}

// Settings are the options a report was measured with.
type Settings struct {
	Variants []string `json:"variants"`
	Stripes  []int    `json:"stripes"`
	Sizes    []int64  `json:"sizes"`
	Warmup   int      `json:"warmup"`
	Iters    int      `json:"iters"` // 0: bench.DefaultIters per size
	Runs     int      `json:"runs"`
	Bidir    bool     `json:"bidir"` // throughput both ways at once, no round trip
}

// OneWay is one row of the one-way throughput table. TimeUS is the time per
// message; the medians are over runs, and Ratio is the median of the per-run
// ratios of Gyre's bandwidth to the bare baseline's (1 means no overhead).
// With Bidir both processes sent at once, and the figures are per direction.
type OneWay struct {
	Variant    string  `json:"variant"`
	Bare       string  `json:"bare"`
	Bidir      bool    `json:"bidir"`
	Stripes    int     `json:"stripes"`
	SizeBytes  int64   `json:"size_bytes"`
	Iters      int     `json:"iters"`
	TimeUS     float64 `json:"time_us"`
	GBps       float64 `json:"gbps"`
	BareTimeUS float64 `json:"bare_time_us"`
	BareGBps   float64 `json:"bare_gbps"`
	Ratio      float64 `json:"ratio"`
	Runs       []Pair  `json:"runs"`
}

// RTT is one row of the round-trip table: the median over runs of each
// run's median round trip, and the median per-run ratio of Gyre's round
// trip to the bare baseline's (1 means no overhead, above 1 is slower).
type RTT struct {
	Variant   string  `json:"variant"`
	Bare      string  `json:"bare"`
	Stripes   int     `json:"stripes"`
	SizeBytes int64   `json:"size_bytes"`
	Iters     int     `json:"iters"`
	RTTUS     float64 `json:"rtt_us"`
	BareRTTUS float64 `json:"bare_rtt_us"`
	Ratio     float64 `json:"ratio"`
	Runs      []Pair  `json:"runs"`
}

// Pair is one interleaved run: Gyre's figure and the baseline's, in
// microseconds (per message for one-way rows, median round trip for RTT).
type Pair struct {
	GyreUS float64 `json:"gyre_us"`
	BareUS float64 `json:"bare_us"`
}

// newOneWay summarises the runs of one (variant, stripes, size).
func newOneWay(variant, bare string, stripes int, size int64, iters int, runs []Pair) OneWay {
	g, b, r := make([]float64, len(runs)), make([]float64, len(runs)), make([]float64, len(runs))
	for i, p := range runs {
		g[i], b[i] = p.GyreUS, p.BareUS
		// Bandwidth ratio gyre/bare is the inverse time ratio.
		r[i] = p.BareUS / p.GyreUS
	}
	row := OneWay{
		Variant: variant, Bare: bare, Stripes: stripes, SizeBytes: size, Iters: iters,
		TimeUS: bench.Median(g), BareTimeUS: bench.Median(b), Ratio: bench.Median(r), Runs: runs,
	}
	row.GBps = bench.GBps(size, row.TimeUS)
	row.BareGBps = bench.GBps(size, row.BareTimeUS)
	return row
}

// newRTT summarises the runs of one (variant, stripes) round trip.
func newRTT(variant, bare string, stripes int, size int64, iters int, runs []Pair) RTT {
	g, b, r := make([]float64, len(runs)), make([]float64, len(runs)), make([]float64, len(runs))
	for i, p := range runs {
		g[i], b[i] = p.GyreUS, p.BareUS
		r[i] = p.GyreUS / p.BareUS
	}
	return RTT{
		Variant: variant, Bare: bare, Stripes: stripes, SizeBytes: size, Iters: iters,
		RTTUS: bench.Median(g), BareRTTUS: bench.Median(b), Ratio: bench.Median(r), Runs: runs,
	}
}

// WriteTable prints the report in the style of nccl-tests: '#' header
// lines, then one row per measurement.
func (r *Report) WriteTable(w io.Writer) error {
	ew := &bench.ErrWriter{W: w}
	p := func(format string, args ...any) { fmt.Fprintf(ew, format, args...) }
	p("# %s\n", r.Command)
	p("# date %s  host %s  %s/%s  cpus %d  %s\n", r.Date.UTC().Format(time.RFC3339),
		r.Machine.Host, r.Machine.OS, r.Machine.Arch, r.Machine.CPUs, r.Machine.Go)
	iters := "20 below 16M, 10 at or above"
	if r.Settings.Iters > 0 {
		iters = fmt.Sprint(r.Settings.Iters)
	}
	p("# warmup %d  iters %s  runs %d (gyre and bare interleaved)\n", r.Settings.Warmup, iters, r.Settings.Runs)
	for _, m := range r.Method {
		p("# %s\n", m)
	}
	if r.Settings.Bidir {
		p("#\n# Bidirectional throughput (GB/s per direction)\n")
	} else {
		p("#\n# One-way throughput\n")
	}
	p("# %14s %8s %12s %6s %13s %10s %15s %11s\n",
		"variant", "stripes", "size_bytes", "iters", "time_us(med)", "GB/s(med)", "bare GB/s(med)", "ratio(med)")
	for _, o := range r.OneWay {
		p("  %14s %8d %12d %6d %13.1f %10.3f %15.3f %11.3f\n",
			o.Variant, o.Stripes, o.SizeBytes, o.Iters, o.TimeUS, o.GBps, o.BareGBps, o.Ratio)
	}
	if r.Settings.Bidir {
		// A bidir run measures no round trip.
		return ew.Err
	}
	p("#\n# Round trip (ping-pong)\n")
	p("# %14s %8s %12s %6s %12s %17s %11s\n",
		"variant", "stripes", "size_bytes", "iters", "rtt_us(med)", "bare rtt_us(med)", "ratio(med)")
	for _, t := range r.RoundTrip {
		p("  %14s %8d %12d %6d %12.1f %17.1f %11.3f\n",
			t.Variant, t.Stripes, t.SizeBytes, t.Iters, t.RTTUS, t.BareRTTUS, t.Ratio)
	}
	return ew.Err
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}
