package bench

import (
	"bytes"
	"image/png"
	"strings"
	"testing"
)

const ncclTable = `# Open MPI v4.1.4
  size_bytes       count time_us(med) time_us(min)    algbw    busbw iters  chk
               (float32)                               GB/s     GB/s
        4096        1024         17.1         16.0    0.239    0.239    20   OK
     1048576      262144        222.5        213.2    4.713    4.713    20   OK
`

// TestReadBusBWAndPlot reads an nccl-tests table and a --json report into
// series, takes the median over runs, and draws a PNG.
func TestReadBusBWAndPlot(t *testing.T) {
	var mpi Series
	mpi.Label = "Open MPI"
	for _, busbw := range []string{"4.713", "4.000", "5.500"} {
		if err := mpi.ReadBusBW("mpi", strings.NewReader(strings.Replace(ncclTable, "4.713    4.713", "4.713    "+busbw, 1))); err != nil {
			t.Fatal(err)
		}
	}
	sizes, bw := mpi.medians()
	if len(sizes) != 2 || sizes[0] != 4096 || bw[1] != 4.713 || bw[0] != 0.239 {
		t.Fatalf("medians: sizes %v busbw %v", sizes, bw)
	}
	gyre := Series{Label: "Gyre tcp N=2"}
	report := `{"ranks": 2, "rows": [{"size_bytes": 4096, "busbw_gbps": 0.4}, {"size_bytes": 16777216, "busbw_gbps": 2.1}]}`
	if err := gyre.ReadBusBW("gyre.json", strings.NewReader(report)); err != nil {
		t.Fatal(err)
	}
	// nccl-tests' own layout: busbw is the eighth column.
	nccl := Series{Label: "nccl-tests"}
	ncclOut := "#       size         count      type   redop    root     time   algbw   busbw #wrong\n" +
		"#        (B)    (elements)                               (us)  (GB/s)  (GB/s)\n" +
		"     1048576        262144     float     sum      -1    222.5    4.71    7.07      0\n"
	if err := nccl.ReadBusBW("nccl", strings.NewReader(ncclOut)); err != nil || nccl.BusBW[1048576][0] != 7.07 {
		t.Fatalf("nccl-tests table: %v, busbw %v", err, nccl.BusBW)
	}
	if err := (&Series{}).ReadBusBW("empty", strings.NewReader("# nothing here\n")); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("a file with no rows: %v, want an error naming it", err)
	}
	var out bytes.Buffer
	if err := PlotBusBW(&out, "busbw", []Series{gyre, mpi}); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&out)
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() < 600 || b.Dy() < 300 {
		t.Fatalf("a %v image", b)
	}
}

// TestPlotBalance draws a report of two runs, one with a cap change, and
// refuses a run with no iterations.
func TestPlotBalance(t *testing.T) {
	its := func(n int) []IterMetrics {
		var out []IterMetrics
		for i := range n {
			out = append(out, IterMetrics{Iter: int64(i), Shares: []int{100 + i, 156 - i}, Seconds: 1 + float64(i%3)/10})
		}
		return out
	}
	rep := &BalanceReport{Runs: []BalanceRun{{Name: "lbbsp", Iterations: its(40), ChangeAt: 20}, {Name: "static", Iterations: its(30)}}}
	var out bytes.Buffer
	if err := PlotBalance(&out, rep); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&out)
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dy() < 4*b.Dx()/5 {
		t.Fatalf("a %v image for 4 panels stacked", b)
	}
	rep.Runs = append(rep.Runs, BalanceRun{Name: "empty"})
	if err := PlotBalance(&out, rep); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("a run with no iterations: %v", err)
	}
}
