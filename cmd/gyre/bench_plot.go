package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gyre-ml/gyre/internal/bench"
)

func newBenchPlotCmd(*cli) *cobra.Command {
	var out, title string
	cmd := &cobra.Command{
		Use:   "plot -o OUT.png LABEL=FILE[,FILE...]...",
		Short: "Draw busbw against message size from allreduce results",
		Long: "plot reads allreduce results and draws busbw against message size as a\n" +
			"PNG, one line per LABEL, the median over its files at each size. A file\n" +
			"is a `gyre bench allreduce --json` report or a table in nccl-tests'\n" +
			"layout (size_bytes count time time algbw busbw ...), as gyre bench\n" +
			"allreduce and the reference peers (Gloo, Open MPI) print.",
		Example: "  gyre bench allreduce -n 2 --json quic.json\n" +
			"  gyre bench allreduce -n 2 --transport tcp --json tcp.json\n" +
			"  gyre bench plot -o busbw.png 'Gyre quic N=2=quic.json' 'Gyre tcp N=2=tcp.json' 'Open MPI=mpi.1,mpi.2,mpi.3'",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return fmt.Errorf("-o: name the PNG to write")
			}
			var series []bench.Series
			for _, arg := range args {
				// The label may hold '=' (N=2): the files follow the last.
				i := strings.LastIndex(arg, "=")
				if i <= 0 || i == len(arg)-1 {
					return fmt.Errorf("%q: want LABEL=FILE[,FILE...]", arg)
				}
				s := bench.Series{Label: arg[:i]}
				for _, name := range strings.Split(arg[i+1:], ",") {
					f, err := os.Open(name)
					if err != nil {
						return err
					}
					err = s.ReadBusBW(name, f)
					f.Close()
					if err != nil {
						return err
					}
				}
				series = append(series, s)
			}
			if err := writeFile(out, func(w io.Writer) error { return bench.PlotBusBW(w, title, series) }); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %d lines\n", out, len(series))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&out, "output", "o", "", "the PNG to write")
	f.StringVar(&title, "title", "allreduce busbw", "the plot's title")
	return cmd
}
