package main

import (
	"fmt"
	"io"
	"os"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/internal/prof"
)

// env is what the commands may learn from the process: its environment and
// executable. Tests replace it.
type env struct {
	lookup     func(string) (string, bool) // os.LookupEnv
	environ    func() []string             // os.Environ
	executable func() (string, error)      // os.Executable
}

func osEnv() env {
	return env{lookup: os.LookupEnv, environ: os.Environ, executable: os.Executable}
}

// cli holds the state shared by the subcommands of one invocation.
type cli struct {
	env       env
	logLevel  string
	logFormat string
	// logLevelSet says --log-level or GYRE_LOG_LEVEL gave logLevel, so
	// that launch can tell the user's level from the default.
	logLevelSet bool
	log         zerolog.Logger
	// prof names the Go profiles to write: this process's, or, for a
	// command that launches workers, each worker's with its index appended.
	prof     prof.Files
	stopProf func() error
}

func newRootCmd(e env) *cobra.Command { return newRoot(&cli{env: e}) }

func newRoot(c *cli) *cobra.Command {
	e := c.env
	root := &cobra.Command{
		Use:   "gyre",
		Short: "Gyre: data-parallel training collectives with no parameter server",
		Long: "Gyre is a collective-communication runtime for data-parallel training.\n" +
			"Workers find each other by gossip and allreduce over QUIC or TLS.",
		// Flags are parsed by now; later failures are runtime errors, for
		// which a usage dump only hides the message.
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			// Under gyre launch the log settings come in the environment.
			for _, s := range []struct {
				flag, env string
				dst       *string
			}{{"log-level", gyre.EnvLogLevel, &c.logLevel}, {"log-format", gyre.EnvLogFormat, &c.logFormat}} {
				if v, ok := e.lookup(s.env); ok && v != "" && !cmd.Flags().Changed(s.flag) {
					*s.dst = v
					c.logLevelSet = c.logLevelSet || s.flag == "log-level"
				}
			}
			c.logLevelSet = c.logLevelSet || cmd.Flags().Changed("log-level")
			if !c.logLevelSet && cmd.Name() == "train" {
				// train prints its table and a line per event; the
				// runtime's info lines would bury them.
				c.logLevel = "warn"
			}
			log, err := newLogger(cmd.ErrOrStderr(), c.logLevel, c.logFormat)
			if err != nil {
				return err
			}
			c.log = log
			cmd.SilenceUsage = true
			return c.startProfiles(cmd)
		},
	}
	root.PersistentFlags().StringVar(&c.logLevel, "log-level", "info", "log level: debug, info, warn or error (gyre train and launch's workers: warn unless given)")
	root.PersistentFlags().StringVar(&c.logFormat, "log-format", "auto", "log format: auto (console on a terminal, else JSON), json or console")
	pf := root.PersistentFlags()
	pf.StringVar(&c.prof.CPU, "cpu-profile", "", "write a Go CPU profile (go tool pprof) to this file; under launch, each worker writes FILE.INDEX")
	pf.StringVar(&c.prof.Block, "block-profile", "", "write a Go blocking profile to this file (every blocking event: slows the process); per worker as --cpu-profile")
	pf.StringVar(&c.prof.Trace, "exec-trace", "", "write a Go execution trace (go tool trace: scheduler delays, syscalls) to this file; per worker as --cpu-profile")
	root.AddCommand(newKeygenCmd(c), newBenchCmd(c), newLaunchCmd(c), newTrainCmd(c), newMembersCmd(c), newStatusCmd(c), newTimelineCmd(c))
	return root
}

// startProfiles starts the profiles that the flags or, in a launched
// worker, the environment ask for. A command that launches workers writes
// none itself: its workers do the work.
func (c *cli) startProfiles(cmd *cobra.Command) error {
	c.prof = c.prof.FromEnv(c.env.lookup)
	if !c.prof.Any() || c.launches(cmd) {
		return nil
	}
	stop, err := prof.Start(c.prof)
	c.stopProf = stop
	return err
}

// stopProfiles writes out the profiles startProfiles started.
func (c *cli) stopProfiles() error {
	if c.stopProf == nil {
		return nil
	}
	stop := c.stopProf
	c.stopProf = nil
	return stop()
}

// launches reports whether cmd starts local workers rather than being
// one: gyre launch, or a benchmark run with -n outside a job.
func (c *cli) launches(cmd *cobra.Command) bool {
	return cmd.Name() == "launch" || (cmd.Flags().Lookup("nproc") != nil && !c.inJob())
}

// newLogger builds the zerolog logger for --log-level and --log-format,
// writing to w.
func newLogger(w io.Writer, level, format string) (zerolog.Logger, error) {
	l, err := gyre.NewLogger(w, level, format)
	if err != nil {
		return l, fmt.Errorf("--log-level %q, --log-format %q: %w", level, format, err)
	}
	return l, nil
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}
