package bench

import (
	"bytes"
	"math"
	"strings"
	"testing"
)

func TestDeriveOverlap(t *testing.T) {
	for _, tc := range []struct {
		name                       string
		overlap, noOverlap         float64 // iteration times
		forward, backward, comm    float64
		wantRatio, wantBound       float64
		wantOverBound, wantSpeedup float64
	}{
		// comm shorter than backward: the bound is forward + backward.
		{"comm hidden", 330, 450, 100, 200, 150, 0.75, 300, 1.1, 450.0 / 330},
		// comm longer than backward: the bound is forward + comm.
		{"comm exposed", 500, 600, 100, 200, 300, 1.5, 400, 1.25, 1.2},
		// no backward measured: ratios are 0, not Inf or NaN.
		{"empty", 0, 0, 0, 0, 0, 0, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := DeriveOverlap(Phases{Iteration: tc.overlap}, Phases{Iteration: tc.noOverlap},
				Phases{Forward: tc.forward, Backward: tc.backward}, Phases{Iteration: tc.comm})
			for _, c := range []struct {
				what      string
				got, want float64
			}{
				{"comm/backward", f.CommOverBackward, tc.wantRatio},
				{"bound", f.BoundUS, tc.wantBound},
				{"overlap/bound", f.OverlapOverBound, tc.wantOverBound},
				{"speed-up", f.Speedup, tc.wantSpeedup},
			} {
				if math.Abs(c.got-c.want) > 1e-9 {
					t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
				}
			}
		})
	}
}

func TestMedianPhasesTakesEachPhaseApart(t *testing.T) {
	got := medianPhases([]Phases{
		{Iteration: 10, Forward: 3, Backward: 9},
		{Iteration: 30, Forward: 1, Backward: 7},
		{Iteration: 20, Forward: 2, Backward: 8},
	})
	want := Phases{Iteration: 20, Forward: 2, Backward: 8}
	if got != want {
		t.Fatalf("medians %+v, want %+v", got, want)
	}
}

func TestOverlapReportTable(t *testing.T) {
	rep := OverlapReport{Command: "gyre bench overlap", Ranks: 2, Transport: "quic", Sizes: []int{32, 64, 10},
		Params: 2762, GlobalBatch: 8, Shares: []int{4, 4}, BucketBytes: 16896, Warmup: 1, Iters: 3}
	all := Phases{Iteration: 1000, Forward: 200, Backward: 400, Wait: 300, Step: 100}
	spread := Phases{Iteration: 1010, Forward: 200, Backward: 390, Wait: 320, Step: 100}
	for _, mode := range OverlapModes {
		rep.Modes = append(rep.Modes, OverlapMode{Mode: mode, Median: all,
			RankMedians: []Phases{all, spread}, Samples: make([]Phases, 3)})
	}
	rep.Figures = OverlapFigures{CommOverBackward: 0.75, OverlapOverBound: 1.2, Speedup: 1.3}
	var buf bytes.Buffer
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"     overlap  iteration         1000         10      3\n",
		"  no-overlap       wait          300         20      3\n",
		"     compute       step          100          0      3\n",
		"        comm  iteration         1000         10      3\n",
		"comm/backward (comm iteration / compute backward)         0.750    0.5-1.0 ok\n",
		"overlap/(forward+max(backward,comm))                      1.200     <=1.15 MISSED\n",
		"no-overlap/overlap (speed-up)                             1.300     >=1.25 ok\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	// Phases a mode does not run have no row.
	for _, absent := range []string{"compute       wait", "comm    forward", "comm       wait"} {
		if strings.Contains(out, absent) {
			t.Errorf("table has a %q row:\n%s", absent, out)
		}
	}
}

func TestOverlapOptions(t *testing.T) {
	o := OverlapOptions{Hidden: []int{64, 128}, Iters: 1}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := o.Sizes(); len(got) != 4 || got[1] != 64 || got[2] != 128 {
		t.Fatalf("sizes %v", got)
	}
	// The 64→128 layer is the largest: (64·128 + 128) float64s.
	if got, want := o.LargestGradBytes(), 8*(64*128+128); got != want {
		t.Fatalf("largest gradient %d bytes, want %d", got, want)
	}
	for _, bad := range []OverlapOptions{{Iters: 1}, {Hidden: []int{0}, Iters: 1}, {Hidden: []int{8}}, {Hidden: []int{8}, Iters: 1, Warmup: -1}} {
		if bad.Validate() == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}
