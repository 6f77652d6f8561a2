package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/internal/mlp"
	"github.com/gyre-ml/gyre/internal/ownfile"
	"github.com/gyre-ml/gyre/internal/progress"
	"github.com/gyre-ml/gyre/internal/train"
)

type trainFlags struct {
	iters       int64
	targetAcc   float64
	evalEvery   int64
	overlap     bool
	hidden      int
	modelSeed   uint64
	dataSeed    uint64
	timeout     time.Duration
	metricsFile string
	positions   bool
	paramsFile  string
	lr          float64
	compute     computeProcs
	data        string
	dataDir     string
	// recipe is --data's recipe with the flags given applied; set by
	// setRecipe, and what train reads instead of the fields above.
	recipe mlp.Recipe
}

// dataSets are the values of --data: the recipe each trains with unless
// flags say otherwise, and how to get the data.
var dataSets = map[string]struct {
	recipe func() mlp.Recipe
	load   func(fl trainFlags) (mlp.Data, error)
}{
	"synthetic": {mlp.SyntheticRecipe, func(fl trainFlags) (mlp.Data, error) { return mlp.NewDataset(fl.dataSeed), nil }},
	"mnist":     {mlp.MNISTRecipe, func(fl trainFlags) (mlp.Data, error) { return mlp.LoadMNIST(fl.dataDir, fl.dataSeed) }},
}

// setRecipe checks --data and sets fl.recipe to its recipe, overridden by
// the flags the user set on fs, and cfg's global batch to the recipe's
// unless --batch was given.
func (fl *trainFlags) setRecipe(fs *pflag.FlagSet, cfg *gyre.Config) error {
	set, ok := dataSets[fl.data]
	if !ok {
		return fmt.Errorf("--data %q: want synthetic or mnist", fl.data)
	}
	if fl.dataDir != "" && fl.data != "mnist" {
		return fmt.Errorf("--data-dir is for --data mnist; --data %s needs no files", fl.data)
	}
	r := set.recipe()
	if fs.Changed("hidden") {
		r.Hidden = []int{fl.hidden}
	}
	if fs.Changed("lr") {
		r.LR = fl.lr
	}
	if fs.Changed("iters") {
		r.Iters = fl.iters
	}
	if fs.Changed("target-acc") {
		r.TargetAcc = fl.targetAcc
	}
	if fs.Changed("batch") {
		r.Batch = cfg.GlobalBatch
	} else {
		cfg.GlobalBatch = r.Batch
	}
	fl.recipe = r
	return nil
}

func newTrainCmd(c *cli) *cobra.Command {
	var (
		fl    trainFlags
		cfg   gyre.Config
		mnist = mlp.MNISTRecipe() // its defaults, for the flags' usage
	)
	cmd := &cobra.Command{
		Use:   "train",
		Short: "Train the built-in MLP as one worker of a data-parallel job",
		Long: "train is one worker of the built-in job: an MLP classifier on synthetic\n" +
			"data, or with --data mnist on the MNIST digits (read from the Go module\n" +
			"cache, or --data-dir), trained with momentum SGD, its gradients allreduced\n" +
			"while backward runs. --data mnist has its own defaults for --iters,\n" +
			"--target-acc and --batch, and a ReLU hidden layer; flags given override\n" +
			"the defaults. It stops after --iters iterations or on reaching\n" +
			"--target-acc test accuracy. Rank 0 prints loss, accuracy, samples/s and\n" +
			"the batch shares, and between the rows a line per membership event: each\n" +
			"worker's join (# rank R/N joined ... as ID), a view change (# view\n" +
			"changed ...: who was admitted or departed) and a lost worker (# lost\n" +
			"rank R (ID) ...).\n\n" +
			"Under `gyre launch` it reads its settings from the GYRE_* variables;\n" +
			"flags override them. Alone, it trains as a single worker. With --listen\n" +
			"and no --seed it starts a job; with --seed it joins a running one through\n" +
			"any member's gossip address, and is admitted at an iteration boundary.\n" +
			"Every worker of a job uses the same --key-file. SIGTERM leaves the job\n" +
			"at the next boundary and exits 0; a second SIGTERM stops at once. A\n" +
			"worker waiting for a majority it lost ends the wait on SIGTERM, with\n" +
			"status 75 (no quorum).\n" +
			"Every worker prints a digest of its final state.",
		Example: "  gyre launch -n 4 -- train\n" +
			"  gyre train --iters 500\n" +
			"  gyre launch -n 4 -- train --data mnist\n" +
			"  gyre train --listen 10.0.0.1:7946 --key-file cluster.key --min-workers 2\n" +
			"  gyre train --seed 10.0.0.1:7946 --listen 10.0.0.2:7946 --key-file cluster.key",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			wc, err := c.workerConfig(cmd.Flags())
			if err != nil {
				return err
			}
			if err := fl.setRecipe(cmd.Flags(), &wc); err != nil {
				return err
			}
			return c.train(cmd.Context(), cmd.OutOrStdout(), wc, fl)
		},
	}
	f := cmd.Flags()
	f.StringVar(&fl.data, "data", "synthetic", "training data: synthetic (generated from the sample index) or mnist (the MNIST digits)")
	f.StringVar(&fl.dataDir, "data-dir", "", "with --data mnist: the directory holding the four MNIST files (default: the GoMNIST module's copy in the Go module cache)")
	f.Int64Var(&fl.iters, "iters", mlp.DefaultIters, fmt.Sprintf("stop after this many iterations (--data mnist: %d)", mnist.Iters))
	f.Float64Var(&fl.targetAcc, "target-acc", mlp.DefaultTargetAcc, fmt.Sprintf("stop on reaching this test accuracy, 0: never (--data mnist: %v)", mnist.TargetAcc))
	f.Int64Var(&fl.evalEvery, "eval-every", 50, "measure test accuracy and report every this many iterations")
	f.BoolVar(&fl.overlap, "overlap", true, "allreduce each layer's gradient while backward continues")
	f.IntVar(&fl.hidden, "hidden", mlp.DefaultSizes()[1], "width of the hidden layer (every worker must use the same)")
	f.Float64Var(&fl.lr, "lr", mlp.DefaultLR, "SGD learning rate, momentum 0.9 (every worker must use the same); lower it for wide --hidden layers")
	fl.compute = computeProcs{auto: true}
	f.Var(&fl.compute, "compute-procs", computeProcsUsage)
	f.Uint64Var(&fl.modelSeed, "model-seed", 1, "seed of the initial weights (rank 0's are broadcast)")
	f.Uint64Var(&fl.dataSeed, "data-seed", 1, "seed of the synthetic dataset, or of the order of MNIST's training examples")
	f.DurationVar(&fl.timeout, "timeout", time.Hour, "give up after this long")
	f.StringVar(&fl.metricsFile, "metrics-file", "", "write a JSON line per iteration to this file: iter, loss (global mean, exact), shares, rank, seconds, samples_per_sec")
	f.StringVar(&fl.paramsFile, "save-params", "", "write the final parameters to this file: each layer's weights then biases, as little-endian float64s")
	f.BoolVar(&fl.positions, "log-positions", false, "print, at each commit, the iteration, its view's epoch and the sample positions this worker covered (# committed ... lines)")
	cfg.GlobalBatch = mlp.DefaultBatch
	cfg.BindPFlags(f)
	if b := f.Lookup("batch"); mnist.Batch != mlp.DefaultBatch {
		b.Usage += fmt.Sprintf(" (--data mnist: %d)", mnist.Batch)
	}
	return cmd
}

// workerConfig reads the GYRE_* variables, then applies the worker flags
// the user set on fs, so flags override the environment.
func (c *cli) workerConfig(fs *pflag.FlagSet) (gyre.Config, error) {
	cfg, err := gyre.ConfigFromEnv(c.env.lookup)
	if err != nil {
		return cfg, err
	}
	if cfg.GlobalBatch == 0 {
		cfg.GlobalBatch = mlp.DefaultBatch
	}
	// Replay the flags given on the command line onto a set bound to the
	// environment's config.
	bound := pflag.NewFlagSet("worker", pflag.ContinueOnError)
	cfg.BindPFlags(bound)
	var errs []error
	fs.Visit(func(f *pflag.Flag) {
		if bound.Lookup(f.Name) != nil {
			if err := bound.Set(f.Name, f.Value.String()); err != nil {
				errs = append(errs, fmt.Errorf("--%s: %w", f.Name, err))
			}
		}
	})
	if len(errs) > 0 {
		return cfg, errs[0]
	}
	cfg.Logger = &c.log
	return cfg, nil
}

func (c *cli) train(ctx context.Context, out io.Writer, cfg gyre.Config, fl trainFlags) error {
	r := fl.recipe
	if r.Iters <= 0 || fl.evalEvery <= 0 {
		return fmt.Errorf("--iters and --eval-every must be positive")
	}
	if !(r.LR > 0) {
		return fmt.Errorf("--lr %v: want a positive learning rate", r.LR)
	}
	if r.TargetAcc < 0 || r.TargetAcc > 1 {
		return fmt.Errorf("--target-acc %v: want a fraction in [0, 1]", r.TargetAcc)
	}
	ctx, cancel := context.WithTimeout(ctx, fl.timeout)
	defer cancel()
	// Loaded before joining, so that missing files fail at once, not
	// after the job has formed around this worker.
	data, err := dataSets[fl.data].load(fl)
	if err != nil {
		return err
	}
	job, err := train.NewDataJob(data, r, fl.modelSeed)
	if err != nil {
		return fmt.Errorf("--hidden %d: %w", r.Hidden[0], err)
	}
	job.Model.SetProcs(fl.compute.procs())
	// log is for the command's own lines; once joined, they say which
	// worker, as the runtime's do.
	log := c.log
	var onIter func(train.Iteration)
	if fl.metricsFile != "" {
		f, err := ownfile.Create(fl.metricsFile)
		if err != nil {
			return ownedFileError("--metrics-file", err)
		}
		mw := &metricsWriter{w: f, global: cfg.GlobalBatch}
		defer func() {
			if err := errors.Join(mw.err, f.Close()); err != nil {
				log.Error().Err(err).Str("file", fl.metricsFile).Msg("metrics not all written")
			}
		}()
		onIter = mw.write
	}
	var paramsOut *os.File
	if fl.paramsFile != "" {
		// Opened now, so that a bad path fails before the training does;
		// truncated only when the parameters are written, so that a failed
		// run leaves an earlier file whole.
		if paramsOut, err = ownfile.Open(fl.paramsFile); err != nil {
			return ownedFileError("--save-params", err)
		}
		defer paramsOut.Close()
	}
	if fl.positions {
		prev := onIter
		onIter = func(it train.Iteration) {
			if prev != nil {
				prev(it)
			}
			fmt.Fprintf(out, "# committed iteration %d epoch %d positions %d-%d of %d-%d\n", it.Iter, it.Epoch,
				it.Positions[0], it.Positions[1], it.Iter*int64(it.Global), (it.Iter+1)*int64(it.Global))
		}
	}
	state := job.State()
	w, err := gyre.Join(ctx, cfg, gyre.WithState(state))
	if err != nil {
		return err
	}
	defer w.Close()
	log = workerLog(c.log, w)
	if addr := w.MetricsAddr(); addr != "" {
		// Every worker serves its own page: say where, port 0 included.
		fmt.Fprintf(out, "# metrics and status of this worker at http://%s/\n", addr)
	}
	setGraceful(w.RequestLeave)
	defer setGraceful(nil)
	// Rank 0's live line: drawn here on a terminal, or handed to gyre
	// launch as plain lines when it asks (its workers write to pipes).
	line, out := c.newLiveLine(out)
	defer line.finish()
	if line.on() {
		prev, sps := onIter, 0.0
		onIter = func(it train.Iteration) {
			if prev != nil {
				prev(it)
			}
			if it.Rank != 0 || it.Seconds <= 0 {
				return
			}
			// A moving average: one iteration's rate jumps with the
			// scheduler.
			rate := float64(it.Global) / it.Seconds
			if sps == 0 {
				sps = rate
			}
			sps = 0.9*sps + 0.1*rate
			line.update(progress.State{Iter: it.Iter + 1, Total: r.Iters, Loss: it.Loss, SamplesPerSec: sps, Shares: it.Shares})
		}
	}
	// The console: a line per membership event, and rank 0's table.
	onEvent := func(e train.Event) {
		if !e.Lead() {
			return
		}
		fmt.Fprintf(out, "# %s\n", e)
		if e.Kind == train.Joined && e.Rank == 0 {
			fmt.Fprintf(out, "# gyre train: %d workers, %s data, model %v (%d parameters), global batch %d, lr %v, overlap %v\n",
				w.Size(), fl.data, job.Model.Sizes(), job.Model.NumParams(), cfg.GlobalBatch, r.LR, fl.overlap)
			fmt.Fprintf(out, "%8s %10s %9s %12s  %s\n", "iter", "loss", "test_acc", "samples/s", "shares")
		}
	}
	res, err := train.Run(ctx, w, job, train.Options{
		Iters: r.Iters, TargetAcc: r.TargetAcc, EvalEvery: fl.evalEvery, NoOverlap: !fl.overlap, OnIteration: onIter,
		OnEvent: onEvent,
		Progress: func(p train.Progress) {
			if w.Rank() == 0 {
				fmt.Fprintf(out, "%8d %10.4f %8.2f%% %12.0f  %s\n", p.Iter, p.Loss, 100*p.Acc, p.SamplesPerSec, shareList(p.Shares))
			}
		},
	})
	if err != nil {
		return err
	}
	digest, err := state.Digest()
	if err != nil {
		return err
	}
	if res.Left {
		fmt.Fprintf(out, "# left the job after iteration %d, as asked; final state digest %016x\n", res.Iters-1, digest)
		return nil
	}
	fmt.Fprintf(out, "# rank %d final state digest %016x at iteration %d\n", w.Rank(), digest, w.Iter())
	if paramsOut != nil {
		if err := saveParams(paramsOut, job.Model.Params()); err != nil {
			return fmt.Errorf("--save-params: %w", err)
		}
	}
	if w.Rank() == 0 {
		verdict := "stopped at the iteration limit"
		if r.TargetAcc > 0 && res.Acc >= r.TargetAcc {
			verdict = fmt.Sprintf("reached the target %.2f%%", 100*r.TargetAcc)
		}
		fmt.Fprintf(out, "# %s: %.2f%% test accuracy after %d iterations in %v (%.0f samples/s)\n",
			verdict, 100*res.Acc, res.Iters, res.Elapsed.Round(time.Millisecond), res.SamplesPerSec)
	}
	return w.Leave(ctx)
}

// workerLog returns log with w's id on every line and its rank as it is
// when the line is written, since a view change can renumber the ranks.
func workerLog(log zerolog.Logger, w *gyre.Worker) zerolog.Logger {
	return log.With().Str("id", train.ID(w)).Logger().Hook(rankHook{w})
}

// rankHook adds the worker's current rank to a log line.
type rankHook struct{ w *gyre.Worker }

func (h rankHook) Run(e *zerolog.Event, _ zerolog.Level, _ string) { e.Int("rank", h.w.Rank()) }

// IterationMetrics is one line of --metrics-file. encoding/json writes a
// float64 in the shortest form that reads back exactly, so Loss can be
// compared bit for bit.
type IterationMetrics struct {
	Iter          int64   `json:"iter"`
	Loss          float64 `json:"loss"`
	Shares        []int   `json:"shares"`
	Rank          int     `json:"rank"`
	Seconds       float64 `json:"seconds"`
	SamplesPerSec float64 `json:"samples_per_sec"`
	// Start is when the iteration began, in seconds since 1970.
	Start float64 `json:"start"`
}

// metricsWriter writes each iteration's line of --metrics-file as the
// iteration ends, unbuffered: a line a second or so costs nothing, and a
// reader following the file (a benchmark driver, tail -f) or a worker
// killed mid-run then loses nothing. It keeps the first write error.
type metricsWriter struct {
	w      io.Writer
	global int
	err    error
}

func (m *metricsWriter) write(it train.Iteration) {
	line, err := json.Marshal(IterationMetrics{Iter: it.Iter, Loss: it.Loss, Shares: it.Shares, Rank: it.Rank,
		Seconds: it.Seconds, SamplesPerSec: float64(m.global) / it.Seconds, Start: float64(it.Start.UnixNano()) / 1e9})
	if err == nil {
		_, err = m.w.Write(append(line, '\n'))
	}
	if m.err == nil {
		m.err = err
	}
}

func shareList(shares []int) string {
	s := make([]string, len(shares))
	for i, v := range shares {
		s[i] = fmt.Sprint(v)
	}
	return strings.Join(s, ",")
}

// saveParams writes params to f as little-endian float64s, one slice
// after another, and closes f: what a reader needs to compare two runs'
// models.
func saveParams(f *os.File, params [][]float64) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	for _, p := range params {
		if err := binary.Write(w, binary.LittleEndian, p); err != nil {
			return err
		}
	}
	return errors.Join(w.Flush(), f.Close())
}

// lookupIs reports whether the variable name is set to value.
func lookupIs(lookup func(string) (string, bool), name, value string) bool {
	v, ok := lookup(name)
	return ok && v == value
}

// ownedFileError names the flag of a per-worker output file that could
// not be taken, and where another process holds it, how launch gives each
// worker a file of its own.
func ownedFileError(flag string, err error) error {
	var held *ownfile.HeldError
	if errors.As(err, &held) {
		return fmt.Errorf("%s: %w (under gyre launch, {i} in the name becomes each worker's launch index: %s %s)", flag, err, flag, indexed(held.Path))
	}
	return fmt.Errorf("%s: %w", flag, err)
}
