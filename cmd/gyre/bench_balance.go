package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gyre-ml/gyre/internal/bench"
)

func newBenchBalanceCmd(c *cli) *cobra.Command {
	var (
		runs, solo []string
		o          bench.BalanceOptions
		jsonFile   string
		plotFile   string
	)
	cmd := &cobra.Command{
		Use:   "balance --run NAME=METRICS [--run NAME=METRICS] [--solo METRICS]... [flags]",
		Short: "Report how batch balancing did, from gyre train --metrics-file runs",
		Long: "balance reads rank 0's --metrics-file of each run (for instance one with\n" +
			"--balance lbbsp and one with --balance static, on the same hosts) and prints\n" +
			"every iteration's time, samples/s and shares, then the figures LB-BSP is\n" +
			"judged on: the steady-state rate (median from --steady on) against the\n" +
			"ideal, the first run against the second, the largest share move between\n" +
			"iterations, and, with --change-at, how many iterations the shares of the\n" +
			"--changed run took to settle within 10% of their new steady state and stay.\n" +
			"The ideal is the sum of each host's rate alone: --solo once per host, a\n" +
			"single worker with that host's cap at the same global batch; several\n" +
			"files for one host, comma-separated (solo runs before and after a job),\n" +
			"pool their iterations. bench/balance-cluster.sh runs the jobs on\n" +
			"namespace hosts with CPU caps and calls it.",
		Example: "  gyre bench balance --run lbbsp=lb.jsonl --run static=st.jsonl --solo h50.jsonl --solo h15.jsonl",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(runs) == 0 {
				return errors.New("give at least one --run NAME=METRICS")
			}
			var names []string
			var its [][]bench.IterMetrics
			for _, r := range runs {
				name, path, ok := strings.Cut(r, "=")
				if !ok || name == "" || path == "" {
					return fmt.Errorf("--run %q: want NAME=METRICS", r)
				}
				m, err := readMetricsFile(path)
				if err != nil {
					return fmt.Errorf("--run %s: %w", name, err)
				}
				names, its = append(names, name), append(its, m)
			}
			var solos [][]bench.IterMetrics
			for _, paths := range solo {
				var host []bench.IterMetrics
				for _, path := range strings.Split(paths, ",") {
					m, err := readMetricsFile(path)
					if err != nil {
						return fmt.Errorf("--solo: %w", err)
					}
					host = append(host, m...)
				}
				solos = append(solos, host)
			}
			if (o.ChangeAt > 0 || o.ChangeTime > 0) && o.Changed == "" {
				o.Changed = names[0]
			}
			rep, err := bench.AnalyseBalance(o, solos, names, its)
			if err != nil {
				return err
			}
			if err := printReport(cmd, &rep, jsonFile); err != nil {
				return err
			}
			if plotFile == "" {
				return nil
			}
			if err := writeFile(plotFile, func(w io.Writer) error { return bench.PlotBalance(w, &rep) }); err != nil {
				os.Remove(plotFile) // no half-drawn PNG
				return fmt.Errorf("--plot: %w", err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&runs, "run", nil, "NAME=METRICS: a run's rank 0 --metrics-file; the first is compared with the second")
	f.StringArrayVar(&solo, "solo", nil, "METRICS[,METRICS...] of one host's worker alone, once per host (repeat for hosts alike)")
	f.Int64Var(&o.Steady, "steady", 20, "first iteration of the steady state")
	f.Int64Var(&o.ChangeAt, "change-at", 0, "first iteration run entirely under a changed cap (0: none)")
	f.Float64Var(&o.ChangeTime, "change-time", 0, "when the cap changed, in seconds since 1970 (instead of --change-at)")
	f.StringVar(&o.Changed, "changed", "", "the run whose cap changed (default: the first)")
	f.StringVar(&jsonFile, "json", "", "also write the report, with every iteration, as JSON to this file")
	f.StringVar(&plotFile, "plot", "", "also draw each run's shares and iteration time over the iterations as a PNG in this file")
	return cmd
}

func readMetricsFile(path string) ([]bench.IterMetrics, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m, err := bench.ReadMetrics(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(m) == 0 {
		return nil, fmt.Errorf("%s: no iterations", path)
	}
	return m, nil
}
