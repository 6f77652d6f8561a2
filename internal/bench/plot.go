package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Series is one line of a busbw plot: a label and, per message size in
// bytes, the busbw in GB/s of each run read for it.
type Series struct {
	Label string
	BusBW map[int64][]float64
}

// ReadBusBW adds to s the rows of one allreduce result: a `gyre bench
// allreduce --json` report, or a table whose header names a busbw column
// and whose rows start with the size in bytes: gyre bench allreduce's
// and the reference peers' (size_bytes count time time algbw busbw ...)
// and nccl-tests' own (size count type redop root time algbw busbw ...).
func (s *Series) ReadBusBW(name string, r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	if s.BusBW == nil {
		s.BusBW = map[int64][]float64{}
	}
	if t := bytes.TrimSpace(b); len(t) > 0 && t[0] == '{' {
		var rep AllReduceReport
		if err := json.Unmarshal(t, &rep); err != nil {
			return fmt.Errorf("bench: plot: %s: %w", name, err)
		}
		for _, row := range rep.Rows {
			s.BusBW[row.SizeBytes] = append(s.BusBW[row.SizeBytes], row.BusBW)
		}
		if len(rep.Rows) == 0 {
			return fmt.Errorf("bench: plot: %s: the report has no rows", name)
		}
		return nil
	}
	// The busbw column is the header's first "busbw": the sixth in Gyre's
	// and the peers' tables, the eighth in nccl-tests' own (size count
	// type redop root time algbw busbw ...).
	rows, col := 0, -1
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(sc.Text()), "#"))
		if i := slices.Index(f, "busbw"); i >= 0 && col < 0 {
			col = i
			continue
		}
		if col < 0 || len(f) <= col {
			continue
		}
		size, err1 := strconv.ParseInt(f[0], 10, 64)
		bw, err2 := strconv.ParseFloat(f[col], 64)
		if err1 != nil || err2 != nil {
			continue // a second header line or a note
		}
		s.BusBW[size] = append(s.BusBW[size], bw)
		rows++
	}
	if rows == 0 {
		return fmt.Errorf("bench: plot: %s: no header naming busbw, or no rows under it", name)
	}
	return nil
}

// medians returns the sizes in order and each size's median busbw.
func (s Series) medians() (sizes []int64, busbw []float64) {
	for size := range s.BusBW {
		sizes = append(sizes, size)
	}
	slices.Sort(sizes)
	for _, size := range sizes {
		busbw = append(busbw, Median(s.BusBW[size]))
	}
	return sizes, busbw
}

// PlotBusBW draws busbw against message size, one line per series (the
// median over its runs at each size), size on a log2 axis, and writes it
// as PNG to w.
func PlotBusBW(w io.Writer, title string, series []Series) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "message size"
	p.Y.Label.Text = "busbw (GB/s, median of runs)"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = sizeTicks{}
	p.Legend.Top, p.Legend.Left = true, true
	p.Add(plotter.NewGrid())
	for i, s := range series {
		sizes, bw := s.medians()
		pts := make(plotter.XYs, 0, len(sizes))
		for j, size := range sizes {
			if size > 0 {
				pts = append(pts, plotter.XY{X: float64(size), Y: bw[j]})
			}
		}
		if len(pts) == 0 {
			return fmt.Errorf("bench: plot: %s has no sizes above 0", s.Label)
		}
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		line.Color, points.Color = plotutil.Color(i), plotutil.Color(i)
		line.Dashes, points.Shape = plotutil.Dashes(i), plotutil.Shape(i)
		p.Add(line, points)
		p.Legend.Add(s.Label, line, points)
	}
	// Room above the lines for the legend, which sits top left.
	p.Y.Min, p.Y.Max = 0, p.Y.Max*(1.1+0.06*float64(len(series)))
	wt, err := p.WriterTo(9*vg.Inch, 5.5*vg.Inch, "png")
	if err != nil {
		return err
	}
	_, err = wt.WriteTo(w)
	return err
}

// sizeTicks marks powers of 4 bytes from 4 KiB as 4K, 16K, ... 1G.
type sizeTicks struct{}

func (sizeTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for e := math.Floor(math.Log2(lo)); e <= math.Ceil(math.Log2(hi)); e++ {
		v := math.Exp2(e)
		if v < lo || v > hi {
			continue
		}
		t := plot.Tick{Value: v}
		if int(e)%2 == 0 {
			t.Label = FormatSize(int64(v))
		}
		ticks = append(ticks, t)
	}
	return ticks
}

// PlotBalance draws each run of a balance report as two panels, one above
// the other: every rank's share, and the iteration's time, against the
// iteration. A vertical mark shows where a cap changed. It writes PNG.
func PlotBalance(w io.Writer, rep *BalanceReport) error {
	if len(rep.Runs) == 0 {
		return fmt.Errorf("bench: plot: the balance report has no runs")
	}
	const panelW, panelH = 9 * vg.Inch, 2.8 * vg.Inch
	rows := 2 * len(rep.Runs)
	img := vgimg.New(panelW, panelH*vg.Length(rows))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: rows, Cols: 1, PadX: vg.Millimeter, PadY: 2 * vg.Millimeter,
		PadTop: vg.Millimeter, PadBottom: vg.Millimeter, PadLeft: vg.Millimeter, PadRight: 2 * vg.Millimeter}
	plots := make([][]*plot.Plot, rows)
	for i, run := range rep.Runs {
		shares, times, err := balancePanels(run)
		if err != nil {
			return err
		}
		plots[2*i], plots[2*i+1] = []*plot.Plot{shares}, []*plot.Plot{times}
	}
	canvases := plot.Align(plots, tiles, dc)
	for r := range plots {
		plots[r][0].Draw(canvases[r][0])
	}
	_, err := vgimg.PngCanvas{Canvas: img}.WriteTo(w)
	return err
}

// balancePanels returns a run's shares and iteration-time plots.
func balancePanels(run BalanceRun) (shares, times *plot.Plot, err error) {
	if len(run.Iterations) == 0 {
		return nil, nil, fmt.Errorf("bench: plot: run %s has no iterations", run.Name)
	}
	shares, times = plot.New(), plot.New()
	shares.Title.Text = run.Name + ": batch shares"
	shares.Y.Label.Text = "samples"
	times.Title.Text = run.Name + ": iteration time"
	times.Y.Label.Text = "seconds"
	times.X.Label.Text = "iteration"
	shares.Add(plotter.NewGrid())
	times.Add(plotter.NewGrid())
	ranks := len(run.Iterations[0].Shares)
	for r := range ranks {
		pts := make(plotter.XYs, 0, len(run.Iterations))
		for _, it := range run.Iterations {
			if r < len(it.Shares) {
				pts = append(pts, plotter.XY{X: float64(it.Iter), Y: float64(it.Shares[r])})
			}
		}
		line, err := plotter.NewLine(pts)
		if err != nil {
			return nil, nil, err
		}
		line.Color, line.Dashes = plotutil.Color(r), plotutil.Dashes(r)
		shares.Add(line)
		shares.Legend.Add(fmt.Sprintf("rank %d", r), line)
	}
	shares.Legend.Top, shares.Legend.Left = true, true
	// Room above the lines for the legend.
	shares.Y.Max += (shares.Y.Max - shares.Y.Min) * (0.15 + 0.1*float64(ranks))
	shares.X.Tick.Marker, times.X.Tick.Marker = wholeTicks{}, wholeTicks{}
	pts := make(plotter.XYs, len(run.Iterations))
	for i, it := range run.Iterations {
		pts[i] = plotter.XY{X: float64(it.Iter), Y: it.Seconds}
	}
	line, err := plotter.NewLine(pts)
	if err != nil {
		return nil, nil, err
	}
	times.Add(line)
	if run.ChangeAt > 0 {
		for _, p := range []*plot.Plot{shares, times} {
			mark, err := plotter.NewLine(plotter.XYs{{X: float64(run.ChangeAt), Y: p.Y.Min}, {X: float64(run.ChangeAt), Y: p.Y.Max}})
			if err != nil {
				return nil, nil, err
			}
			mark.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
			p.Add(mark)
			p.Legend.Add("cap changed", mark)
		}
	}
	return shares, times, nil
}

// wholeTicks are gonum's default ticks labelled without decimals, for
// iteration numbers.
type wholeTicks struct{}

func (wholeTicks) Ticks(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = strconv.FormatFloat(ticks[i].Value, 'f', -1, 64)
		}
	}
	return ticks
}
