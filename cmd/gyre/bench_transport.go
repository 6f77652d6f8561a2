package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/internal/bench"
	"github.com/gyre-ml/gyre/internal/bench/linkbench"
	"github.com/gyre-ml/gyre/internal/secret"
)

// peerCmdName is the hidden subcommand the transport benchmark runs in
// its child process.
const peerCmdName = "transport-peer"

func newBenchTransportCmd(c *cli) *cobra.Command {
	var (
		transportName string
		insecure      bool
		bidir         bool
		stripes       string
		sizes         string
		warmup        int
		iters         int
		runs          int
		jsonFile      string
		keyFile       string
		timeout       time.Duration
	)
	cmd := &cobra.Command{
		Use:   "transport",
		Short: "Measure the transports against bare connections, across two processes",
		Long: "transport measures one-way throughput at each --sizes and the 4 KiB round\n" +
			"trip between this process and a child it starts on 127.0.0.1. Each Gyre\n" +
			"transport is paired with a bare baseline carrying the same bytes with no\n" +
			"Gyre framing (quic: a quic-go stream; tcp: crypto/tls; tcp --insecure:\n" +
			"TCP), and their runs are interleaved. The child gets an ephemeral\n" +
			"cluster secret through its environment.\n\n" +
			"With --bidir both processes send each message to each other at once, the\n" +
			"traffic of a two-rank ring, and the table gives GB/s per direction (the\n" +
			"bytes one side sent / time), comparable with `bench allreduce -n 2` busbw;\n" +
			"there is no round trip then, and the bare baseline sends each direction\n" +
			"on its own connection (one per stripe), as the Gyre transports do.",
		Example: "  gyre bench transport\n" +
			"  gyre bench transport --transport tcp --insecure --stripes 1,2,4 --sizes 1M,64M\n" +
			"  gyre bench transport --transport quic --runs 9 --json quic.json\n" +
			"  gyre bench transport --bidir --transport quic --sizes 64M,256M",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			variants, err := linkbench.SelectVariants(transportName, insecure)
			if err != nil {
				return err
			}
			stripeList, err := bench.ParseInts(stripes, 1, gyre.MaxStripes)
			if err != nil {
				return fmt.Errorf("--stripes: %w", err)
			}
			sizeList, err := bench.ParseSizes(sizes)
			if err != nil {
				return fmt.Errorf("--sizes: %w", err)
			}
			if warmup < 0 || iters < 0 || runs < 1 {
				return errors.New("--warmup and --iters must not be negative, and --runs must be at least 1")
			}
			exe, err := c.env.executable()
			if err != nil {
				return fmt.Errorf("find this executable to start the peer: %w", err)
			}
			key, err := benchSecret(keyFile)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			// The child logs as this process does, to the same stderr.
			prefix := []string{"--log-level", c.logLevel, "--log-format", c.logFormat, "bench", peerCmdName}
			start := linkbench.ExecPeer(exe, prefix, childEnv(c.env.environ()), cmd.ErrOrStderr())
			rep, err := linkbench.RunTransport(ctx, linkbench.TransportOptions{
				Variants:     variants,
				Stripes:      stripeList,
				Sizes:        sizeList,
				Warmup:       warmup,
				Iters:        iters,
				Runs:         runs,
				Bidir:        bidir,
				Key:          key,
				NewTransport: gyre.NewTransport,
				Command:      "gyre " + strings.Join(commandArgs(cmd), " "),
				Logger:       c.log,
			}, start)
			if err != nil {
				return err
			}
			if err := rep.WriteTable(cmd.OutOrStdout()); err != nil {
				return err
			}
			if jsonFile != "" {
				return writeJSON(jsonFile, rep)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&transportName, "transport", "all", "transports to measure: quic, tcp or all (quic, tcp and tcp --insecure)")
	f.BoolVar(&insecure, "insecure", false, "with --transport tcp: plain TCP instead of TLS")
	f.BoolVar(&bidir, "bidir", false, "both processes send to each other at once (a two-rank ring's traffic); GB/s per direction, no round trip")
	f.StringVar(&stripes, "stripes", "1", "comma list of stripe counts (connections per link)")
	f.StringVar(&sizes, "sizes", bench.DefaultSizes, "comma list of message sizes in bytes, with K/M/G suffixes")
	f.IntVarP(&warmup, "warmup", "w", bench.DefaultWarmup, "warm-up messages before the runs of each size")
	f.IntVar(&iters, "iters", 0, "timed messages per run (default 20 below 16M, 10 at or above)")
	f.IntVar(&runs, "runs", bench.DefaultRuns, "interleaved runs of gyre and bare; the report gives medians over them")
	f.StringVar(&jsonFile, "json", "", "also write the report, with every run, as JSON to this file")
	f.StringVar(&keyFile, "key-file", "", "cluster secret to use (from gyre keygen --out); default: an ephemeral one")
	f.DurationVar(&timeout, "timeout", 30*time.Minute, "give up, and stop the peer, after this long")
	return cmd
}

// benchSecret loads the secret in keyFile, or makes an ephemeral one.
func benchSecret(keyFile string) (secret.Secret, error) {
	if keyFile == "" {
		return secret.Generate()
	}
	key, err := secret.Load(keyFile)
	if err != nil {
		return secret.Secret{}, fmt.Errorf("--key-file: %w", err)
	}
	return key, nil
}

// newBenchTransportPeerCmd is the child side of `bench transport`. It is
// hidden: only the parent starts it, with the secret in GYRE_KEY.
func newBenchTransportPeerCmd(c *cli) *cobra.Command {
	var (
		links    map[string]string
		bare     []string
		deadline time.Duration
	)
	cmd := &cobra.Command{
		Use:    peerCmdName,
		Short:  "The peer process of `gyre bench transport` (started by it)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := gyre.ConfigFromEnv(c.env.lookup)
			if err != nil {
				return err
			}
			key, err := cfg.Secret()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), deadline)
			defer cancel()
			return linkbench.ServePeer(ctx, linkbench.PeerOptions{
				Links:        links,
				Bare:         bare,
				Key:          key,
				NewTransport: gyre.NewTransport,
				Logger:       c.log.With().Str("proc", "peer").Logger(),
			}, cmd.InOrStdin(), cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringToStringVar(&links, linkbench.FlagLink, nil, "VARIANT/STRIPES=ADDR: a Gyre link and the parent's address for it")
	f.StringSliceVar(&bare, linkbench.FlagBare, nil, "baselines to serve: quic, tls, tcp")
	f.DurationVar(&deadline, linkbench.FlagDeadline, 10*time.Minute, "exit after this long whatever the parent does")
	return cmd
}

// childEnv is the parent's environment without any GYRE_* variable: the
// child's settings come from its flags, and its only secret is the
// GYRE_KEY the parent adds.
func childEnv(environ []string) []string {
	var out []string
	for _, kv := range environ {
		if !strings.HasPrefix(kv, "GYRE_") {
			out = append(out, kv)
		}
	}
	return out
}

// commandArgs returns the command path below the root and the flags as
// given, for the report header.
func commandArgs(cmd *cobra.Command) []string {
	args := strings.Fields(strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()))
	cmd.Flags().Visit(func(f *pflag.Flag) {
		args = append(args, "--"+f.Name+"="+f.Value.String())
	})
	return args
}

// writeJSON writes a benchmark report to path.
func writeJSON(path string, rep interface{ WriteJSON(io.Writer) error }) error {
	if err := writeFile(path, rep.WriteJSON); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// writeFile creates path and writes it with write.
func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
