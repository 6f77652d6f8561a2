package progress

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestLineRoundTrip: what a worker writes, launch reads back; other lines
// are left alone.
func TestLineRoundTrip(t *testing.T) {
	in := State{Iter: 12, Total: 1500, Loss: 0.4375, SamplesPerSec: 34123.5, Shares: []int{120, 136}}
	out, ok := Parse([]byte(in.Line()))
	if !ok || out.Iter != in.Iter || out.Total != in.Total || out.Loss != in.Loss || out.SamplesPerSec != in.SamplesPerSec ||
		fmt.Sprint(out.Shares) != fmt.Sprint(in.Shares) {
		t.Fatalf("round trip: %+v -> %q -> %+v, %v", in, in.Line(), out, ok)
	}
	bench := State{Iter: 2, Total: 5, Unit: "size", Desc: "16 MiB: 31/100 · 5.21 ms · busbw 3.20 GB/s"}
	if out, ok := Parse([]byte(bench.Line())); !ok || out.Iter != 2 || out.Total != 5 || out.Unit != "size" || out.Desc != bench.Desc || out.Shares != nil {
		t.Fatalf("round trip: %+v -> %q -> %+v, %v", bench, bench.Line(), out, ok)
	}
	if got := bench.describe(); got != bench.Desc {
		t.Errorf("a benchmark's line says %q, want its Desc", got)
	}
	for _, other := range []string{"[0]      100     0.9052", "#gyre-progress iter=x", "# rank 0 final state digest"} {
		if _, ok := Parse([]byte(other)); ok {
			t.Errorf("%q parsed as a progress line", other)
		}
	}
}

// TestBarKeepsOutputWhole: output written through the bar arrives whole,
// before any update and between updates, and the line shows the state.
func TestBarKeepsOutputWhole(t *testing.T) {
	var term bytes.Buffer
	b := NewBar(&term)
	b.Write([]byte("before\n"))
	b.Update(State{Iter: 5, Total: 10, Loss: 0.5, SamplesPerSec: 1000, Shares: []int{3, 4}})
	b.Write([]byte("row\n"))
	b.Finish()
	got := term.String()
	for _, want := range []string{"before\n", "row\n", "(5/10", "loss 0.5000 · 1000 samples/s · 2 workers · shares 3,4"} {
		if !strings.Contains(got, want) {
			t.Errorf("terminal output lacks %q:\n%q", want, got)
		}
	}
}

// TestLinesThrottle: at most one line per interval, and Flush writes the
// last state held back.
func TestLinesThrottle(t *testing.T) {
	var out bytes.Buffer
	l := NewLines(&out, time.Hour)
	for i := range 5 {
		l.Update(State{Iter: int64(i + 1), Total: 5, Shares: []int{1}})
	}
	if n := strings.Count(out.String(), linePrefix); n != 1 {
		t.Fatalf("%d lines within the interval, want 1:\n%s", n, out.String())
	}
	l.Flush()
	last := strings.Split(strings.TrimSpace(out.String()), "\n")
	if s, ok := Parse([]byte(last[len(last)-1])); !ok || s.Iter != 5 {
		t.Fatalf("after Flush the last line is %q, want iteration 5", last[len(last)-1])
	}
}
