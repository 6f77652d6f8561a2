package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/gyre-ml/gyre/internal/obs"
)

func newTimelineCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "timeline",
		Short: "Work with the timelines workers write (--timeline)",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newTimelineMergeCmd(c))
	return cmd
}

func newTimelineMergeCmd(c *cli) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "merge FILE... -o OUT",
		Short: "Combine the workers' timelines into one, on one clock",
		Long: "merge reads the timelines a job's workers wrote with --timeline (under\n" +
			"`gyre launch --timeline F`: F with .rank0, .rank1, ... before the\n" +
			"extension) and writes one trace-event file with every worker's tracks,\n" +
			"for Perfetto or chrome://tracing. Workers leave each boundary when the\n" +
			"same vote completes, so their boundaries align their clocks: each file\n" +
			"is shifted by the median difference between its boundary ends and the\n" +
			"first file's. It prints each file's shift and the largest distance left\n" +
			"between its boundaries and the first file's.",
		Example: "  gyre launch -n 4 --timeline run.json -- train\n" +
			"  gyre timeline merge run.rank*.json -o run.json",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return fmt.Errorf("-o: name the merged file")
			}
			var files []obs.TraceFile
			for _, name := range args {
				f, err := os.Open(name)
				if err != nil {
					return err
				}
				tf, err := obs.ReadTrace(name, f)
				f.Close()
				if err != nil {
					return err
				}
				files = append(files, tf)
			}
			merged, offsets, err := obs.Merge(files)
			if err != nil {
				return err
			}
			if err := writeFile(out, func(w io.Writer) error { return obs.WriteTrace(w, merged) }); err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			for _, o := range offsets {
				fmt.Fprintf(w, "%s: shifted %+.3f ms over %d boundaries; boundaries within %.3f ms of the first file's\n",
					o.Name, o.Micros/1e3, o.Boundaries, o.Spread/1e3)
			}
			fmt.Fprintf(w, "wrote %d events to %s\n", len(merged), out)
			return nil
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "the merged timeline to write")
	return cmd
}
