package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/internal/bench"
)

// overlapFlags are the settings every worker of the overlap benchmark gets.
type overlapFlags struct {
	hidden      string
	batch       int
	bucketBytes int
	warmup      int
	iters       int
	modelSeed   uint64
	dataSeed    uint64
	jsonFile    string
	report      string // hidden: where rank 0 leaves its JSON report for the launcher
	timeout     time.Duration
	compute     computeProcs
}

// Defaults of the overlap scenario, sized for the cluster script's default
// rate (bench/overlap-cluster.sh, 50mbit) so that communication takes
// about 0.6-0.7x the backward pass. Twelve hidden layers of 256 make
// eleven equal 256x256 layers that hold almost all the gradient, so each
// allreduce is a small part of the total and the one that cannot overlap,
// that of the layer backward hands over last, is short. The batch sets
// the compute: on the 2-core machine the two hosts share, a larger one
// keeps the transport's CPU cost, which slows the overlapped backward,
// small next to the compute.
const (
	defaultOverlapHidden = "256,256,256,256,256,256,256,256,256,256,256,256"
	defaultOverlapBatch  = 6144
)

func newBenchOverlapCmd(c *cli) *cobra.Command {
	var (
		job launchJob
		fl  overlapFlags
	)
	cmd := &cobra.Command{
		Use:   "overlap",
		Short: "Measure how much of the gradient allreduce hides behind backward",
		Long: "overlap trains an MLP on -n local workers started as by `gyre launch`\n" +
			"and times four kinds of iteration, one of each per round so all see the\n" +
			"same conditions: overlap (each layer's gradient allreduced while backward\n" +
			"continues), no-overlap (all gradients allreduced after backward),\n" +
			"compute (forward, backward, step; no communication) and comm (the same\n" +
			"allreduces alone). It prints each phase's median and the derived figures:\n" +
			"comm/backward, overlap/(forward+max(backward,comm)) against 1.15 and\n" +
			"no-overlap/overlap against 1.25. Iterations are separated by the\n" +
			"boundary, which is not timed.\n" +
			"Inside a job (GYRE_PEERS, GYRE_SEED or GYRE_LISTEN set: under `gyre\n" +
			"launch`, or one worker per host as bench/overlap-cluster.sh starts them)\n" +
			"it is one worker of the job.",
		Example: "  gyre bench overlap\n" +
			"  gyre bench overlap -n 2 --hidden 512,512,512 --batch 256 --iters 5 --json overlap.json",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := fl.options()
			if err != nil {
				return err
			}
			if c.inJob() {
				return c.overlapWorker(cmd, fl, o)
			}
			return c.overlapLaunch(cmd, job, fl)
		},
	}
	job.bindFlags(cmd, 2)
	f := cmd.Flags()
	f.StringVar(&fl.hidden, "hidden", defaultOverlapHidden, "hidden layer widths, comma-separated")
	f.IntVar(&fl.batch, "batch", defaultOverlapBatch, "global batch: samples per iteration over all workers")
	f.IntVar(&fl.bucketBytes, "bucket-bytes", 0, "gradient bucket size in bytes (0: the largest layer's gradient, one layer per bucket)")
	f.IntVarP(&fl.warmup, "warmup", "w", 2, "untimed rounds")
	f.IntVar(&fl.iters, "iters", 10, "timed rounds, each one iteration of every mode")
	fl.compute = computeProcs{auto: true}
	f.Var(&fl.compute, "compute-procs", computeProcsUsage)
	f.Uint64Var(&fl.modelSeed, "model-seed", 1, "seed of the initial weights")
	f.Uint64Var(&fl.dataSeed, "data-seed", 1, "seed of the synthetic dataset")
	f.StringVar(&fl.jsonFile, "json", "", "also write the report, with rank 0's every iteration, as JSON to this file")
	f.DurationVar(&fl.timeout, "timeout", 30*time.Minute, "give up after this long")
	f.StringVar(&fl.report, "report", "", "where rank 0 writes its report (set by the launcher)")
	f.MarkHidden("report")
	return cmd
}

func (fl overlapFlags) options() (bench.OverlapOptions, error) {
	hidden, err := bench.ParseInts(fl.hidden, 1, 1<<16)
	if err != nil {
		return bench.OverlapOptions{}, fmt.Errorf("--hidden: %w", err)
	}
	if fl.batch < 1 || fl.bucketBytes < 0 {
		return bench.OverlapOptions{}, fmt.Errorf("--batch %d, --bucket-bytes %d: want a positive batch and a non-negative bucket size", fl.batch, fl.bucketBytes)
	}
	o := bench.OverlapOptions{Hidden: hidden, Warmup: fl.warmup, Iters: fl.iters, ModelSeed: fl.modelSeed, DataSeed: fl.dataSeed,
		ComputeProcs: fl.compute.procs()}
	return o, o.Validate()
}

// overlapLaunch starts the workers, then prints rank 0's report without
// the per-rank prefixes.
func (c *cli) overlapLaunch(cmd *cobra.Command, job launchJob, fl overlapFlags) error {
	var rep bench.OverlapReport
	err := c.launchBench(cmd, job, &rep, "overlap",
		"--hidden", fl.hidden, "--batch", strconv.Itoa(fl.batch), "--bucket-bytes", strconv.Itoa(fl.bucketBytes),
		"--warmup", strconv.Itoa(fl.warmup), "--iters", strconv.Itoa(fl.iters), "--compute-procs", fl.compute.String(),
		"--model-seed", strconv.FormatUint(fl.modelSeed, 10), "--data-seed", strconv.FormatUint(fl.dataSeed, 10),
		"--timeout", fl.timeout.String())
	if err != nil {
		return err
	}
	return printReport(cmd, &rep, fl.jsonFile)
}

// overlapWorker is one rank of the benchmark, configured by GYRE_* and the
// worker flags given on the command line.
func (c *cli) overlapWorker(cmd *cobra.Command, fl overlapFlags, o bench.OverlapOptions) error {
	ctx, cancel := context.WithTimeout(cmd.Context(), fl.timeout)
	defer cancel()
	cfg, err := c.workerConfig(cmd.Flags())
	if err != nil {
		return err
	}
	cfg.GlobalBatch = fl.batch
	// Equal shares throughout: the modes' iterations are not a training
	// load (the comm mode computes nothing, the compute mode waits for no
	// gradient), and LB-BSP fed their compute times drove the shares to
	// [1 6143], which left nothing to overlap on one rank.
	cfg.Balance = gyre.BalanceStatic
	cfg.BucketBytes = fl.bucketBytes
	if cfg.BucketBytes == 0 {
		cfg.BucketBytes = o.LargestGradBytes()
	}
	job, err := bench.NewOverlapJob(o)
	if err != nil {
		return err
	}
	w, err := gyre.Join(ctx, cfg, gyre.WithState(job.State()))
	if err != nil {
		return err
	}
	defer w.Close()
	rep, err := bench.RunOverlap(ctx, w, job, o)
	if err != nil {
		return err
	}
	if err := w.Leave(ctx); err != nil {
		return err
	}
	if w.Rank() != 0 {
		return nil
	}
	rep.Command = "gyre " + strings.Join(commandArgs(cmd), " ")
	rep.Transport = cfg.WithDefaults().Transport
	if cfg.Insecure {
		rep.Transport += " (insecure)"
	}
	rep.BucketBytes = cfg.BucketBytes
	switch {
	case fl.report != "":
		return writeJSON(fl.report, &rep)
	case fl.jsonFile != "":
		if err := writeJSON(fl.jsonFile, &rep); err != nil {
			return err
		}
	}
	return rep.WriteTable(cmd.OutOrStdout())
}
