package main

import (
	"fmt"
	"io"
	"os"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/gyre-ml/gyre"
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
}

func newRootCmd(e env) *cobra.Command {
	c := &cli{env: e}
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
			return nil
		},
	}
	root.PersistentFlags().StringVar(&c.logLevel, "log-level", "info", "log level: debug, info, warn or error (gyre train and launch's workers: warn unless given)")
	root.PersistentFlags().StringVar(&c.logFormat, "log-format", "auto", "log format: auto (console on a terminal, else JSON), json or console")
	root.AddCommand(newKeygenCmd(c), newBenchCmd(c), newLaunchCmd(c), newTrainCmd(c), newMembersCmd(c))
	return root
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
