package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/internal/bench"
	"github.com/gyre-ml/gyre/internal/progress"
	"github.com/gyre-ml/gyre/internal/wire"
)

// allReduceFlags are the sweep settings every worker of the benchmark gets.
type allReduceFlags struct {
	sizes, op, dtype string
	compress         string // none, bf16 or fp16
	warmup, iters    int
	check            bool
	jsonFile         string
	ringOrder        string // auto or fixed; empty: the job's setting
	algo             string // auto, ring or doubling; empty: the job's setting
	report           string // hidden: where rank 0 leaves its JSON report for the launcher
	timeout          time.Duration
}

func newBenchAllReduceCmd(c *cli) *cobra.Command {
	var (
		job launchJob
		fl  allReduceFlags
	)
	cmd := &cobra.Command{
		Use:   "allreduce",
		Short: "Measure allreduce across local workers, as nccl-tests does",
		Long: "allreduce times Gyre's allreduce over -n local workers started as by\n" +
			"`gyre launch`, and prints the same table as nccl-tests and the reference\n" +
			"peers (Gloo, Open MPI; bench/compare-allreduce.sh): size_bytes, count,\n" +
			"median and minimum time of the slowest rank, algbw = size/time,\n" +
			"busbw = algbw*2(n-1)/n, iterations and a check of every element of the\n" +
			"first allreduce per size.\n" +
			"Each timed iteration is: barrier; t0; allreduce; t1.\n" +
			"The ring runs in the order the job's view chose (--ring-order), which the\n" +
			"report's header gives, with the algorithm each size ran (--algo).\n" +
			"--compress bf16 or fp16 sends float32 data at half width on the wire, still\n" +
			"summed in float32; the check then allows the wire format's rounding.\n" +
			"Run under `gyre launch -- bench allreduce` it is one worker of the job.",
		Example: "  gyre bench allreduce -n 2 --transport tcp --insecure --sizes 4K,64M,256M\n" +
			"  gyre bench allreduce -n 4 --op max --dtype int32 --json ar.json\n" +
			"  gyre bench allreduce -n 2 --transport tcp --compress bf16",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := fl.options()
			if err != nil {
				return err
			}
			if c.inJob() {
				return c.allReduceWorker(cmd, fl, o)
			}
			return c.allReduceLaunch(cmd, job, fl)
		},
	}
	job.bindFlags(cmd, 2)
	f := cmd.Flags()
	f.StringVar(&fl.sizes, "sizes", "4K,64K,1M,16M,64M,256M", "comma list of sizes in bytes, with K/M/G suffixes")
	f.IntVarP(&fl.warmup, "warmup", "w", bench.DefaultWarmup, "untimed allreduces per size")
	f.IntVar(&fl.iters, "iters", 0, "timed allreduces per size (default 20 below 16M, 10 at or above)")
	f.StringVar(&fl.op, "op", "sum", "reduction: sum, min, max or avg")
	f.StringVar(&fl.dtype, "dtype", "float32", "element type: float32, float64, int32 or int64")
	f.StringVar(&fl.compress, "compress", "none", "wire compression of float32 data: none, bf16, fp16 or auto (bf16 where the measured cost model predicts a gain)")
	f.BoolVar(&fl.check, "check", true, "verify every element of the first allreduce per size (the chk column)")
	f.StringVar(&fl.jsonFile, "json", "", "also write the report, with every iteration's time, as JSON to this file")
	f.StringVar(&fl.ringOrder, "ring-order", "", "ring order: auto (probe the links, cross slow ones rarely) or fixed (address order) (empty: the job's, auto by default)")
	f.StringVar(&fl.algo, "algo", "", "allreduce algorithm: auto (recursive doubling below the cost model's threshold, the ring or the hierarchical allreduce from there), ring, doubling or hierarchical (empty: the job's, auto by default)")
	f.DurationVar(&fl.timeout, "timeout", 30*time.Minute, "give up after this long")
	f.StringVar(&fl.report, "report", "", "where rank 0 writes its report (set by the launcher)")
	f.MarkHidden("report")
	return cmd
}

func (fl allReduceFlags) options() (bench.AllReduceOptions, error) {
	sizes, err := bench.ParseSizes(fl.sizes)
	if err != nil {
		return bench.AllReduceOptions{}, fmt.Errorf("--sizes: %w", err)
	}
	ops := map[string]wire.Op{"sum": wire.OpSum, "min": wire.OpMin, "max": wire.OpMax, "avg": wire.OpAvg}
	op, ok := ops[strings.ToLower(fl.op)]
	if !ok {
		return bench.AllReduceOptions{}, fmt.Errorf("--op %q: want sum, min, max or avg", fl.op)
	}
	dtypes := map[string]wire.DType{"float32": wire.DTypeFloat32, "float64": wire.DTypeFloat64, "int32": wire.DTypeInt32, "int64": wire.DTypeInt64}
	dt, ok := dtypes[strings.ToLower(fl.dtype)]
	if !ok {
		return bench.AllReduceOptions{}, fmt.Errorf("--dtype %q: want float32, float64, int32 or int64", fl.dtype)
	}
	compressions := map[string]wire.DType{"none": wire.DTypeBytes, "bf16": wire.DTypeBF16, "fp16": wire.DTypeFP16, gyre.CompressAuto: wire.DTypeBytes}
	compress, ok := compressions[strings.ToLower(fl.compress)]
	if !ok {
		return bench.AllReduceOptions{}, fmt.Errorf("--compress %q: want none, bf16, fp16 or auto", fl.compress)
	}
	auto := strings.ToLower(fl.compress) == gyre.CompressAuto
	if (compress != wire.DTypeBytes || auto) && dt != wire.DTypeFloat32 {
		return bench.AllReduceOptions{}, fmt.Errorf("--compress %s needs --dtype float32, not %s", fl.compress, fl.dtype)
	}
	if op == wire.OpAvg && (dt == wire.DTypeInt32 || dt == wire.DTypeInt64) {
		return bench.AllReduceOptions{}, errors.New("--op avg needs a float --dtype")
	}
	switch fl.algo {
	case "", gyre.AlgoAuto, gyre.AlgoRing, gyre.AlgoDoubling, gyre.AlgoHierarchical:
	default:
		return bench.AllReduceOptions{}, fmt.Errorf("--algo %q: want auto, ring, doubling or hierarchical", fl.algo)
	}
	switch fl.ringOrder {
	case "", gyre.RingOrderAuto, gyre.RingOrderFixed:
	default:
		return bench.AllReduceOptions{}, fmt.Errorf("--ring-order %q: want auto or fixed", fl.ringOrder)
	}
	if fl.warmup < 0 || fl.iters < 0 {
		return bench.AllReduceOptions{}, errors.New("--warmup and --iters must not be negative")
	}
	for _, s := range sizes {
		if s%int64(dt.Size()) != 0 {
			return bench.AllReduceOptions{}, fmt.Errorf("--sizes: %d bytes is not a whole number of %s elements", s, dt)
		}
	}
	return bench.AllReduceOptions{Sizes: sizes, Warmup: fl.warmup, Iters: fl.iters, Op: op, DType: dt, Check: fl.check,
		Compress: compress, AutoCompress: auto}, nil
}

// allReduceLaunch starts the workers, then prints rank 0's report without
// the per-rank prefixes, so the table lines up with the peers'.
func (c *cli) allReduceLaunch(cmd *cobra.Command, job launchJob, fl allReduceFlags) error {
	var rep bench.AllReduceReport
	err := c.launchBench(cmd, job, &rep, "allreduce",
		"--sizes", fl.sizes, "--warmup", strconv.Itoa(fl.warmup), "--iters", strconv.Itoa(fl.iters),
		"--op", fl.op, "--dtype", fl.dtype, "--compress", fl.compress, "--check="+strconv.FormatBool(fl.check),
		"--timeout", fl.timeout.String(), "--ring-order", fl.ringOrder, "--algo", fl.algo)
	if err != nil {
		return err
	}
	return printReport(cmd, &rep, fl.jsonFile)
}

// launchBench runs `gyre bench SUB ARGS...` as the workers of a local job
// and decodes into rep the JSON report rank 0 leaves in a file.
func (c *cli) launchBench(cmd *cobra.Command, job launchJob, rep any, sub string, args ...string) error {
	exe, err := c.env.executable()
	if err != nil {
		return fmt.Errorf("find this executable to start the workers: %w", err)
	}
	dir, err := os.MkdirTemp("", "gyre-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	reportPath := filepath.Join(dir, "report.json")
	argv := append([]string{exe, "--log-level", c.logLevel, "--log-format", c.logFormat, "bench", sub}, args...)
	if err := c.launchJob(cmd, job, append(argv, "--report", reportPath)); err != nil {
		return err
	}
	b, err := os.ReadFile(reportPath)
	if err != nil {
		return fmt.Errorf("rank 0 left no report: %w", err)
	}
	if err := json.Unmarshal(b, rep); err != nil {
		return fmt.Errorf("rank 0's report: %w", err)
	}
	return nil
}

// benchReport is what the launching side of a benchmark prints.
type benchReport interface {
	SetCommand(string)
	WriteTable(io.Writer) error
	WriteJSON(io.Writer) error
}

// printReport names the command that made rep, prints its table and, with
// --json, writes it to jsonFile.
func printReport(cmd *cobra.Command, rep benchReport, jsonFile string) error {
	rep.SetCommand("gyre " + strings.Join(commandArgs(cmd), " "))
	if err := rep.WriteTable(cmd.OutOrStdout()); err != nil {
		return err
	}
	if jsonFile != "" {
		return writeJSON(jsonFile, rep)
	}
	return nil
}

// failLeaveTimeout bounds the leave after a failed benchmark.
const failLeaveTimeout = 5 * time.Second

// inJob reports whether the environment makes this process a worker of a
// job (static peers or gossip) rather than the launcher of one.
func (c *cli) inJob() bool {
	cfg, err := gyre.ConfigFromEnv(c.env.lookup)
	return err == nil && (len(cfg.Peers) > 0 || cfg.Gossip())
}

// allReduceWorker is one rank of the benchmark, configured by GYRE_* and
// the worker settings given as flags (--metrics-addr, --timeline, ...): a
// worker of the job's live view, static or gossip.
func (c *cli) allReduceWorker(cmd *cobra.Command, fl allReduceFlags, o bench.AllReduceOptions) error {
	ctx, cancel := context.WithTimeout(cmd.Context(), fl.timeout)
	defer cancel()
	cfg, err := c.workerConfig(cmd.Flags())
	if err != nil {
		return err
	}
	if fl.ringOrder != "" {
		cfg.RingOrder = fl.ringOrder
	}
	if fl.algo != "" {
		cfg.Algo = fl.algo
	}
	if o.AutoCompress {
		cfg.Compress = gyre.CompressAuto // the view measures the cost model even with --algo pinned
	}
	w, err := gyre.Join(ctx, cfg)
	if err != nil {
		return err
	}
	defer w.Close()
	comm, err := w.Comm()
	if err != nil {
		return err
	}
	// Rank 0's live line: timed allreduces done, and the size under way.
	line, out := c.newLiveLine(cmd.OutOrStdout())
	if line.on() && w.Rank() == 0 {
		o.Progress = func(p bench.AllReduceProgress) {
			line.update(progress.State{Iter: int64(p.Done), Total: int64(p.Total), Unit: "allreduce",
				Desc: fmt.Sprintf("size %d of %d, %s: %d/%d · %.0f us · busbw %.2f GB/s",
					p.SizeIndex+1, p.Sizes, bench.FormatSize(p.Size), p.Iter, p.Iters, p.LastUS, p.BusBW)})
		}
	}
	rep, err := bench.RunAllReduce(ctx, comm, o)
	line.finish()
	if err != nil {
		// The ring aborted the collective on every rank. Leaving together
		// (a barrier on the control channel, then farewells) lets the
		// abort markers that tell each peer why land before anyone closes;
		// if a peer is gone, Leave fails and the worker closes anyway.
		lctx, cancel := context.WithTimeout(ctx, failLeaveTimeout)
		defer cancel()
		if lerr := w.Leave(lctx); lerr != nil {
			c.log.Debug().Err(lerr).Msg("leaving after the failure")
		}
		return err
	}
	// Leave ends the job together: no rank closes while a peer may still
	// wait for its last message.
	if err := w.Leave(ctx); err != nil {
		return err
	}
	if w.Rank() != 0 {
		return nil
	}
	rep.Command = "gyre " + strings.Join(commandArgs(cmd), " ")
	switch {
	case fl.report != "":
		return writeJSON(fl.report, rep)
	case fl.jsonFile != "":
		if err := writeJSON(fl.jsonFile, rep); err != nil {
			return err
		}
	}
	return rep.WriteTable(out)
}
