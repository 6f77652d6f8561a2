package main

import "github.com/spf13/cobra"

func newBenchCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmarks with nccl-tests conventions",
		Long: "bench runs Gyre's benchmarks. Each prints an nccl-tests-style table:\n" +
			"medians over runs, GB/s of 1e9 bytes per second, and comparisons as\n" +
			"median ratios of interleaved runs. --json FILE keeps the raw runs.",
	}
	cmd.AddCommand(newBenchTransportCmd(c), newBenchTransportPeerCmd(c), newBenchAllReduceCmd(c), newBenchOverlapCmd(c), newBenchGossipCmd(c), newBenchBalanceCmd(c), newBenchPlotCmd(c))
	return cmd
}
