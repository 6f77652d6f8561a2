package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/kernels"
	"github.com/gyre-ml/gyre/ring"
)

// AllReduceOptions describe one `gyre bench allreduce` sweep. Every rank
// must pass the same options.
type AllReduceOptions struct {
	Sizes  []int64    // message sizes in bytes
	Warmup int        // untimed allreduces per size
	Iters  int        // timed allreduces per size; 0 means DefaultIters
	Op     wire.Op    // OpSum, OpMin, OpMax or OpAvg
	DType  wire.DType // DTypeFloat32, DTypeFloat64, DTypeInt32 or DTypeInt64
	Check  bool       // verify every element of the first allreduce per size
	// Compress is the wire compression, DTypeBF16 or DTypeFP16, for a
	// float32 DType only; the zero value, DTypeBytes, means none.
	Compress wire.DType
	// AutoCompress, with Compress none, compresses each size as the
	// Comm's cost model chooses (ring.Comm.AutoCompression).
	AutoCompress bool
	// Progress, if set, is called on every rank after each timed
	// allreduce, for a progress line. It must be quick.
	Progress func(AllReduceProgress)
}

// AllReduceProgress is where a sweep stands, for a progress line.
type AllReduceProgress struct {
	// Size is the size under way, SizeIndex its index in the sweep of
	// Sizes sizes.
	Size             int64
	SizeIndex, Sizes int
	// Iter timed allreduces of this size are done, of Iters; Done of
	// the sweep's Total.
	Iter, Iters, Done, Total int
	// LastUS is the last one's time on this rank, in microseconds, and
	// BusBW the bus bandwidth it gives, in GB/s.
	LastUS, BusBW float64
}

// Validate checks the options that do not depend on the ring.
func (o AllReduceOptions) Validate() error {
	switch o.Compress {
	case wire.DTypeBytes:
		if o.AutoCompress && o.DType != wire.DTypeFloat32 {
			return fmt.Errorf("bench: automatic compression needs float32 data, not %s", o.DType)
		}
	case wire.DTypeBF16, wire.DTypeFP16:
		if o.DType != wire.DTypeFloat32 {
			return fmt.Errorf("bench: %s compression needs float32 data, not %s", o.Compress, o.DType)
		}
		if o.AutoCompress {
			return fmt.Errorf("bench: automatic compression and %s at once", o.Compress)
		}
	default:
		return fmt.Errorf("bench: unknown compression %s", o.Compress)
	}
	return nil
}

// compressName is the report's name for the wire compression.
func compressName(c wire.DType) string {
	if c == wire.DTypeBytes {
		return "none"
	}
	return c.String()
}

// AllReduceRow is one size's result, as nccl-tests and the peers print it.
type AllReduceRow struct {
	SizeBytes int64   `json:"size_bytes"`
	Count     int64   `json:"count"`
	MedianUS  float64 `json:"time_us_median"`
	MinUS     float64 `json:"time_us_min"`
	AlgBW     float64 `json:"algbw_gbps"`
	BusBW     float64 `json:"busbw_gbps"`
	Iters     int     `json:"iters"`
	Check     string  `json:"check"` // "OK", "BAD" or "-" when not checked
	// Algo is the algorithm that ran: ring or recursive-doubling.
	Algo string `json:"algo"`
	// Compress is the wire compression that ran: none, bf16 or fp16.
	Compress string `json:"compress"`
	// PredictedUS is the time the Comm's cost model predicts for it.
	PredictedUS float64 `json:"predicted_us"`
	// TimesUS holds each timed iteration's time, the slowest rank's.
	TimesUS []float64 `json:"times_us"`
}

// AllReduceReport is the sweep's result, complete on rank 0.
type AllReduceReport struct {
	Command string    `json:"command"`
	Date    time.Time `json:"date"`
	Machine Machine   `json:"machine"`
	Ranks   int       `json:"ranks"`
	DType   string    `json:"dtype"`
	// Compress is the wire compression: none, bf16, fp16 or auto (each
	// row's Compress says what ran).
	Compress string `json:"compress"`
	// RingOrder is the ranks in the order the ring ran through them (the
	// view's choice, Comm.Order; rank order if it chose none).
	RingOrder []int `json:"ring_order"`
	// SmallBytes is the size from which the ring ran (recursive doubling
	// below it; 0: the ring throughout).
	SmallBytes int `json:"small_bytes"`
	// Model is the cost model the algorithms were chosen by (the view's
	// measured one under --algo auto).
	Model   CostModel      `json:"cost_model"`
	Options string         `json:"options"`
	Rows    []AllReduceRow `json:"rows"`
}

// RunAllReduce runs the sweep on c. Each timed iteration is: barrier; t0;
// allreduce; t1. The times are then combined with a MAX allreduce, so every
// row reports the slowest rank, and its median, as nccl-tests and the
// reference peers do. Every rank returns the same report.
func RunAllReduce(ctx context.Context, c *ring.Comm, o AllReduceOptions) (AllReduceReport, error) {
	compress := compressName(o.Compress)
	if o.AutoCompress {
		compress = "auto"
	}
	rep := AllReduceReport{Date: time.Now(), Ranks: c.Size(), Machine: ThisMachine(), DType: o.DType.String(),
		Compress: compress,
		Options: fmt.Sprintf("op %s  dtype %s  compress %s  warmup %d  check %v", o.Op, o.DType,
			compress, o.Warmup, o.Check)}
	rep.SmallBytes = c.SmallBytes()
	m := c.CostModel()
	rep.Model = CostModel{AlphaUS: m.Alpha * 1e6, BetaGBps: m.Beta / 1e9, GammaGBps: m.Gamma / 1e9,
		EncodeGBps: m.Encode / 1e9, DecodeGBps: m.Decode / 1e9}
	if rep.RingOrder = c.Order(); rep.RingOrder == nil {
		rep.RingOrder = ring.RankOrder(c.Size())
	}
	if err := o.Validate(); err != nil {
		return rep, err
	}
	var sweep sweepProgress
	for _, size := range o.Sizes {
		sweep.total += o.iters(size)
	}
	for i, size := range o.Sizes {
		if size%int64(o.DType.Size()) != 0 {
			return rep, fmt.Errorf("bench: size %d is not a whole number of %s elements", size, o.DType)
		}
		sweep.index = i
		row, err := allReduceSize(ctx, c, o, size, &sweep)
		if err != nil {
			return rep, fmt.Errorf("bench: allreduce of %s: %w", FormatSize(size), err)
		}
		rep.Rows = append(rep.Rows, row)
	}
	return rep, nil
}

// CostModel is ring.CostModel in a report's units.
type CostModel struct {
	AlphaUS    float64 `json:"alpha_us"`
	BetaGBps   float64 `json:"beta_gbps"`
	GammaGBps  float64 `json:"gamma_gbps"`
	EncodeGBps float64 `json:"encode_gbps"`
	DecodeGBps float64 `json:"decode_gbps"`
}

// SetCommand records the command line that produced the report.
func (r *AllReduceReport) SetCommand(cmd string) { r.Command = cmd }

// WriteTable prints the report with the columns and widths of the
// reference peers ($PEERS, see README), so the tables can be compared line
// by line.
func (r AllReduceReport) WriteTable(w io.Writer) error {
	m := r.Machine
	fmt.Fprintf(w, "# %s\n# date %s  host %s  %s/%s  cpus %d  %s\n# ranks %d  ring %s  %s\n# algorithms: %s\n"+
		"# cost model: alpha %.1f us  beta %.3f GB/s  gamma %.3f GB/s\n", r.Command,
		r.Date.UTC().Format(time.RFC3339), m.Host, m.OS, m.Arch, m.CPUs, m.Go, r.Ranks, ringString(r.RingOrder), r.Options,
		r.algorithms(), r.Model.AlphaUS, r.Model.BetaGBps, r.Model.GammaGBps)
	fmt.Fprintf(w, "%12s %11s %12s %12s %8s %8s %5s %4s\n", "size_bytes", "count", "time_us(med)", "time_us(min)", "algbw", "busbw", "iters", "chk")
	fmt.Fprintf(w, "%12s %11s %12s %12s %8s %8s\n", "", "("+r.DType+")", "", "", "GB/s", "GB/s")
	for _, row := range r.Rows {
		if _, err := fmt.Fprintf(w, "%12d %11d %12.1f %12.1f %8.3f %8.3f %5d %4s\n",
			row.SizeBytes, row.Count, row.MedianUS, row.MinUS, row.AlgBW, row.BusBW, row.Iters, row.Check); err != nil {
			return err
		}
	}
	return nil
}

// algorithms says which algorithm ran at which size: the ring from
// SmallBytes, recursive doubling below, and the sizes at which the
// hierarchical allreduce took the ring's place.
func (r AllReduceReport) algorithms() string {
	var s string
	switch {
	case r.SmallBytes <= 0:
		s = "ring at every size"
	case r.SmallBytes == math.MaxInt:
		s = "recursive doubling at every size"
	default:
		s = fmt.Sprintf("recursive doubling below %d bytes, ring from there", r.SmallBytes)
	}
	var hier []string
	for _, row := range r.Rows {
		if row.Algo == ring.AlgoHierarchical.String() {
			hier = append(hier, FormatSize(row.SizeBytes))
		}
	}
	if len(hier) > 0 {
		s += "; hierarchical instead at " + strings.Join(hier, ", ")
	}
	return s
}

// ringString writes a ring order as ranks joined by dashes: 0-2-1-3.
func ringString(order []int) string {
	parts := make([]string, len(order))
	for i, r := range order {
		parts[i] = strconv.Itoa(r)
	}
	return strings.Join(parts, "-")
}

// sweepProgress is where RunAllReduce stands: the size's index, and the
// timed allreduces done of the total.
type sweepProgress struct{ index, done, total int }

// iters is the number of timed allreduces of size.
func (o AllReduceOptions) iters(size int64) int {
	if o.Iters > 0 {
		return o.Iters
	}
	return DefaultIters(size)
}

func allReduceSize(ctx context.Context, c *ring.Comm, o AllReduceOptions, size int64, sweep *sweepProgress) (AllReduceRow, error) {
	n, rank := c.Size(), c.Rank()
	es := int64(o.DType.Size())
	wt := o.Compress
	if o.AutoCompress {
		wt = c.AutoCompression(int(size))
	}
	predicted := c.PredictAllReduce(int(size)) // the hierarchy's, where it runs
	algo := c.AllReduceAlgo(int(size))
	if wt != wire.DTypeBytes {
		// fp16's kernels are slower; the model has bf16's. A compressed
		// allreduce runs the flat ring where the hierarchy would run.
		predicted = c.CostModel().AllReduceBF16(n, int(size), c.SmallBytes())
		if algo == ring.AlgoHierarchical {
			algo = ring.AlgoRing
		}
	}
	row := AllReduceRow{SizeBytes: size, Count: size / es, Iters: o.iters(size), Check: "-", Algo: algo.String(),
		Compress: compressName(wt), PredictedUS: predicted * 1e6}
	buf := alignedBytes(int(size))
	if err := fillPattern(o.DType, buf, rank); err != nil {
		return row, err
	}
	if err := c.AllReduceCompressed(ctx, o.DType, o.Op, buf, wt); err != nil {
		return row, err
	}
	if o.Check {
		ok := int32(1)
		if !checkPattern(o.DType, o.Op, wt, buf, n) {
			ok = 0
		}
		flag := []int32{ok}
		if err := ring.AllReduce(ctx, c, wire.OpMin, flag); err != nil {
			return row, err
		}
		row.Check = map[bool]string{true: "OK", false: "BAD"}[flag[0] == 1]
	}
	for range o.Warmup {
		if err := c.AllReduceCompressed(ctx, o.DType, o.Op, buf, wt); err != nil {
			return row, err
		}
	}
	times := make([]float64, row.Iters)
	for i := range times {
		if err := c.Barrier(ctx); err != nil {
			return row, err
		}
		t0 := time.Now()
		if err := c.AllReduceCompressed(ctx, o.DType, o.Op, buf, wt); err != nil {
			return row, err
		}
		times[i] = float64(time.Since(t0)) / float64(time.Microsecond)
		if sweep.done++; o.Progress != nil {
			o.Progress(AllReduceProgress{Size: size, SizeIndex: sweep.index, Sizes: len(o.Sizes), Iter: i + 1, Iters: row.Iters,
				Done: sweep.done, Total: sweep.total, LastUS: times[i], BusBW: GBps(size, times[i]) * 2 * float64(n-1) / float64(n)})
		}
	}
	if err := ring.AllReduce(ctx, c, wire.OpMax, times); err != nil {
		return row, err
	}
	row.TimesUS = times
	row.MedianUS, row.MinUS = Median(times), slices.Min(times)
	row.AlgBW = GBps(size, row.MedianUS)
	row.BusBW = row.AlgBW * 2 * float64(n-1) / float64(n)
	return row, nil
}

// alignedBytes returns n bytes aligned for any element type: the kernels'
// byte views require it.
func alignedBytes(n int) []byte {
	return kernels.Bytes(make([]float64, (n+7)/8))[:n]
}

// patternValue is rank r's element i: small integers, so that sums over
// any number of ranks are exact in every dtype and the check is exact.
func patternValue(rank, i int) int64 { return int64(rank+1) * int64(i%13+1) }

// expected is the reduced value of element i over n ranks.
func expected(op wire.Op, n, i int) float64 {
	base := float64(i%13 + 1)
	switch op {
	case wire.OpMin:
		return base
	case wire.OpMax:
		return base * float64(n)
	case wire.OpAvg:
		return base * float64(n+1) / 2
	}
	return base * float64(n*(n+1)/2)
}

func fillPattern(dt wire.DType, b []byte, rank int) error {
	switch dt {
	case wire.DTypeFloat32:
		return fillAs[float32](b, rank)
	case wire.DTypeFloat64:
		return fillAs[float64](b, rank)
	case wire.DTypeInt32:
		return fillAs[int32](b, rank)
	case wire.DTypeInt64:
		return fillAs[int64](b, rank)
	}
	return fmt.Errorf("bench: dtype %s is not benchmarked", dt)
}

func fillAs[T kernels.Number](b []byte, rank int) error {
	xs, err := kernels.View[T](b)
	for i := range xs {
		xs[i] = T(patternValue(rank, i))
	}
	return err
}

func checkPattern(dt wire.DType, op wire.Op, compress wire.DType, b []byte, n int) bool {
	switch dt {
	case wire.DTypeFloat32:
		if compress != wire.DTypeBytes {
			return checkCompressed(b, op, compress, n)
		}
		return checkAs[float32](b, op, n)
	case wire.DTypeFloat64:
		return checkAs[float64](b, op, n)
	case wire.DTypeInt32:
		return checkAs[int32](b, op, n)
	case wire.DTypeInt64:
		return checkAs[int64](b, op, n)
	}
	return false
}

// checkAs compares every element. Avg over integers truncates, as the
// kernels' integer division does; float averages are exact halves here.
func checkAs[T kernels.Number](b []byte, op wire.Op, n int) bool {
	xs, err := kernels.View[T](b)
	if err != nil {
		return false
	}
	for i, x := range xs {
		if float64(x) != float64(T(expected(op, n, i))) {
			return false
		}
	}
	return true
}

// checkCompressed compares every element of a float32 buffer reduced with
// compression to the wire format's tolerance. Each rounding to the wire
// errs by at most u·|x|, u the unit roundoff (2^-8 for bf16, 2^-11 for
// fp16), and a partial result is rounded once per hop and once when
// complete: at most n+1 times, each time of a partial at most Σ|xᵢ| in
// magnitude. The pattern's values are positive, so Σ|xᵢ| is the Sum, n
// times the Avg, and at least Min and Max, which are rounded once. Hence
// |got - want| ≤ (n+1)·u·Σ|xᵢ| covers every op; it needs no subnormal
// term as the values are at least 1.
func checkCompressed(b []byte, op wire.Op, compress wire.DType, n int) bool {
	xs, err := kernels.AsFloat32(b)
	if err != nil {
		return false
	}
	u := 0x1p-8
	if compress == wire.DTypeFP16 {
		u = 0x1p-11
	}
	for i, x := range xs {
		sum := expected(wire.OpSum, n, i)
		if math.Abs(float64(x)-expected(op, n, i)) > float64(n+1)*u*sum {
			return false
		}
	}
	return true
}

// WriteJSON writes the report as indented JSON.
func (r AllReduceReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}
