package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/internal/bench"
	"github.com/gyre-ml/gyre/internal/bench/linkbench"
	"github.com/gyre-ml/gyre/internal/secret"
	"github.com/gyre-ml/gyre/membership"
)

// gossipNodeCmdName is the hidden child of `bench gossip` that runs one
// node in its own process (--procs).
const gossipNodeCmdName = "node"

// The lines a gossip node process prints: its gossip address once it is
// up, then the time it first saw every node alive.
const (
	gossipReady     = "ready"     // ready ADDR
	gossipConverged = "converged" // converged MS (since the process started)
)

// gossipPoll is how often a node's member list is checked: the resolution
// of the measurement, coarse enough not to steal much CPU from gossip.
const gossipPoll = 5 * time.Millisecond

// GossipReport is the result of `bench gossip`, as written to --json.
type GossipReport struct {
	Command string        `json:"command"`
	Date    time.Time     `json:"date"`
	Machine bench.Machine `json:"machine"`
	N       int           `json:"n"`
	// Mode is "procs" (a process per node) or "in-process".
	Mode     string    `json:"mode"`
	Method   string    `json:"method"`
	RunsMS   []float64 `json:"runs_ms"`
	MedianMS float64   `json:"median_ms"`
}

// SetCommand records the command line that produced the report.
func (r *GossipReport) SetCommand(cmd string) { r.Command = cmd }

func (r GossipReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func (r GossipReport) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "# %s\n# %s\n", r.Command, r.Method)
	fmt.Fprintf(w, "%-5s %12s\n", "run", "converge_ms")
	for i, ms := range r.RunsMS {
		fmt.Fprintf(w, "%-5d %12.1f\n", i+1, ms)
	}
	_, err := fmt.Fprintf(w, "%-5s %12.1f\n", "med", r.MedianMS)
	return err
}

func newBenchGossipCmd(c *cli) *cobra.Command {
	var (
		n        int
		runs     int
		procs    bool
		jsonFile string
		timeout  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "gossip",
		Short: "Measure how long gossip takes to converge on local nodes",
		Long: "gossip starts -n gossip nodes on 127.0.0.1 (memberlist's local timing,\n" +
			"encrypted with a fresh key each run): node 0, then nodes 1..n-1 at once,\n" +
			"each joining through node 0. A run's time is from starting node 0 until\n" +
			"every node lists all n alive. The nodes are stopped between runs.\n" +
			"With --procs each node is a process of this binary, as in a real job,\n" +
			"and the time includes starting them; without, all run in this process.",
		Example: "  gyre bench gossip -n 32 --runs 5 --procs\n" +
			"  gyre bench gossip -n 8 --json gossip.json",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if n < 2 || runs < 1 || timeout <= 0 {
				return errors.New("-n must be at least 2, --runs at least 1 and --timeout positive")
			}
			rep := &GossipReport{Date: time.Now().UTC(), Machine: bench.ThisMachine(), N: n, Mode: "in-process"}
			rep.Method = fmt.Sprintf("time from starting node 0 until each of %d nodes lists all %d alive, "+
				"all in this process", n, n)
			run := func(ctx context.Context) (time.Duration, error) { return gossipInProcess(ctx, n, c.log) }
			if procs {
				exe, err := c.env.executable()
				if err != nil {
					return fmt.Errorf("find this executable to start the nodes: %w", err)
				}
				rep.Mode = "procs"
				rep.Method = fmt.Sprintf("time from starting the process of node 0 until the last of %d processes "+
					"reports all %d alive", n, n)
				prefix := []string{"--log-level", c.logLevel, "--log-format", c.logFormat, "bench", "gossip", gossipNodeCmdName}
				start := linkbench.ExecPeer(exe, prefix, childEnv(c.env.environ()), cmd.ErrOrStderr())
				run = func(ctx context.Context) (time.Duration, error) { return gossipProcs(ctx, n, start) }
			}
			for i := range runs {
				ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
				d, err := run(ctx)
				cancel()
				if err != nil {
					return fmt.Errorf("run %d: %w", i+1, err)
				}
				rep.RunsMS = append(rep.RunsMS, float64(d)/float64(time.Millisecond))
			}
			rep.MedianMS = bench.Median(rep.RunsMS)
			return printReport(cmd, rep, jsonFile)
		},
	}
	f := cmd.Flags()
	f.IntVarP(&n, "nodes", "n", 32, "number of gossip nodes")
	f.IntVar(&runs, "runs", 5, "runs; the report gives each and their median")
	f.BoolVar(&procs, "procs", false, "run each node in its own process of this binary")
	f.StringVar(&jsonFile, "json", "", "also write the report as JSON to this file")
	f.DurationVar(&timeout, "timeout", 2*time.Minute, "give up on a run that has not converged after this long")
	cmd.AddCommand(newBenchGossipNodeCmd(c))
	return cmd
}

// quietWriter passes a node's log on until it is told to stop: nodes being
// shut down log every peer they can no longer reach, which is the
// benchmark's doing, not news.
type quietWriter struct {
	w     io.Writer
	quiet atomic.Bool
}

func (q *quietWriter) Write(p []byte) (int, error) {
	if q.quiet.Load() {
		return len(p), nil
	}
	return q.w.Write(p)
}

// quietLogger returns log writing through a quietWriter.
func quietLogger(log zerolog.Logger) (zerolog.Logger, *quietWriter) {
	q := &quietWriter{w: log}
	return log.Output(q), q
}

// startGossipNode starts one benchmark node, a worker in no view.
func startGossipNode(name string, key []byte, log zerolog.Logger) (*membership.Node, error) {
	return membership.Start(membership.Config{Name: name, Listen: "127.0.0.1:0", Key: key, Local: true,
		Meta: membership.Meta{Role: membership.RoleWorker, Rank: -1}, Logger: log.With().Str("node", name).Logger()})
}

// gossipInProcess runs n nodes in this process and returns the time from
// starting node 0 until every node lists n alive.
func gossipInProcess(ctx context.Context, n int, log zerolog.Logger) (time.Duration, error) {
	s, err := secret.Generate()
	if err != nil {
		return 0, err
	}
	key := s.GossipKey()
	log, quiet := quietLogger(log)
	nodes := make([]atomic.Pointer[membership.Node], n)
	var wg sync.WaitGroup
	defer func() {
		wg.Wait()
		quiet.quiet.Store(true)
		for i := range nodes {
			if nd := nodes[i].Load(); nd != nil {
				nd.Close()
			}
		}
	}()
	t0 := time.Now()
	seed, err := startGossipNode("g0", key, log)
	if err != nil {
		return 0, err
	}
	nodes[0].Store(seed)
	errs := make(chan error, n)
	for i := 1; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nd, err := startGossipNode("g"+strconv.Itoa(i), key, log)
			if err != nil {
				errs <- err
				return
			}
			nodes[i].Store(nd)
			if err := nd.Join(ctx, []string{seed.Addr()}); err != nil {
				errs <- err
			}
		}()
	}
	tick := time.NewTicker(gossipPoll)
	defer tick.Stop()
	for {
		done := 0
		for i := range nodes {
			if nd := nodes[i].Load(); nd != nil && len(nd.Members()) == n {
				done++
			}
		}
		if done == n {
			return time.Since(t0), nil
		}
		select {
		case err := <-errs:
			return 0, err
		case <-ctx.Done():
			return 0, fmt.Errorf("%d of %d nodes saw all %d alive before giving up: %w", done, n, n, ctx.Err())
		case <-tick.C:
		}
	}
}

// gossipProcs runs n nodes as processes started by start and returns the
// time from starting node 0's process until the last one reports that it
// sees n alive.
func gossipProcs(ctx context.Context, n int, start linkbench.PeerStarter) (time.Duration, error) {
	s, err := secret.Generate()
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // kills any process still running
	var procs []*linkbench.PeerProcess
	defer func() {
		for _, p := range procs {
			p.Stdin.Close()
		}
		for _, p := range procs {
			_ = linkbench.StopPeer(p) // stdin already closed: all stop at once; how each ended is logged
		}
	}()
	type event struct {
		node int
		line gossipLine
		at   time.Time
		err  error
	}
	events := make(chan event, 4*n)
	send := func(e event) {
		select {
		case events <- e:
		case <-ctx.Done(): // the run is over
		}
	}
	launch := func(i int, args ...string) error {
		p, err := start(ctx, append([]string{"--name", "g" + strconv.Itoa(i), "-n", strconv.Itoa(n)}, args...), s)
		if err != nil {
			return err
		}
		procs = append(procs, p)
		go func() {
			sc := bufio.NewScanner(p.Stdout)
			for sc.Scan() {
				l, err := parseGossipLine(sc.Text())
				send(event{node: i, line: l, at: time.Now(), err: err})
			}
			send(event{node: i, err: fmt.Errorf("node %d exited before it saw all %d alive (%v)", i, n, sc.Err())})
		}()
		return nil
	}
	t0 := time.Now()
	if err := launch(0); err != nil {
		return 0, err
	}
	var seed string
	converged := make(map[int]time.Time)
	for seed == "" {
		select {
		case e := <-events:
			switch {
			case e.err != nil:
				return 0, e.err
			case e.line.kind == gossipReady:
				seed = e.line.addr
			case e.line.kind == gossipConverged:
				converged[e.node] = e.at
			}
		case <-ctx.Done():
			return 0, fmt.Errorf("node 0 did not start: %w", ctx.Err())
		}
	}
	for i := 1; i < n; i++ {
		if err := launch(i, "--seed", seed); err != nil {
			return 0, err
		}
	}
	for len(converged) < n {
		select {
		case e := <-events:
			switch {
			case e.err != nil && converged[e.node].IsZero():
				return 0, e.err
			case e.err == nil && e.line.kind == gossipConverged:
				converged[e.node] = e.at
			}
		case <-ctx.Done():
			return 0, fmt.Errorf("%d of %d nodes saw all %d alive before giving up: %w", len(converged), n, n, ctx.Err())
		}
	}
	var last time.Time
	for _, at := range converged {
		if at.After(last) {
			last = at
		}
	}
	return last.Sub(t0), nil
}

// gossipLine is one parsed line of a node process.
type gossipLine struct {
	kind string
	addr string  // gossipReady
	ms   float64 // gossipConverged
}

func parseGossipLine(s string) (gossipLine, error) {
	f := strings.Fields(s)
	if len(f) == 2 {
		switch f[0] {
		case gossipReady:
			return gossipLine{kind: f[0], addr: f[1]}, nil
		case gossipConverged:
			if ms, err := strconv.ParseFloat(f[1], 64); err == nil && ms >= 0 {
				return gossipLine{kind: f[0], ms: ms}, nil
			}
		}
	}
	return gossipLine{}, fmt.Errorf("bad line from a gossip node: %q", s)
}

// newBenchGossipNodeCmd is one node of `bench gossip --procs`. It is
// hidden: only the parent starts it, with the secret in GYRE_KEY. It
// prints "ready ADDR" once it has joined, "converged MS" when it first
// sees -n nodes alive, and stops when its stdin closes.
func newBenchGossipNodeCmd(c *cli) *cobra.Command {
	var (
		n        int
		name     string
		seed     string
		deadline time.Duration
	)
	cmd := &cobra.Command{
		Use:    gossipNodeCmdName,
		Short:  "One node of `gyre bench gossip --procs` (started by it)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t0 := time.Now()
			cfg, err := gyre.ConfigFromEnv(c.env.lookup)
			if err != nil {
				return err
			}
			s, err := cfg.Secret()
			if err != nil {
				return err
			}
			if s.IsZero() {
				return fmt.Errorf("no cluster secret in %s: this command is started by gyre bench gossip --procs", gyre.EnvKey)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), deadline)
			defer cancel()
			log, quiet := quietLogger(c.log)
			node, err := startGossipNode(name, s.GossipKey(), log)
			if err != nil {
				return err
			}
			defer func() {
				quiet.quiet.Store(true)
				node.Close()
			}()
			if seed != "" {
				if err := node.Join(ctx, []string{seed}); err != nil {
					return err
				}
			}
			out := cmd.OutOrStdout()
			fmt.Fprintln(out, gossipReady, node.Addr())
			// Stop when the parent closes stdin (or dies), or at the deadline.
			stop := make(chan struct{})
			go func() {
				_, _ = io.Copy(io.Discard, cmd.InOrStdin())
				close(stop)
			}()
			tick := time.NewTicker(gossipPoll)
			defer tick.Stop()
			for seen := false; ; {
				if !seen && len(node.Members()) == n {
					seen = true
					fmt.Fprintln(out, gossipConverged, strconv.FormatFloat(float64(time.Since(t0))/1e6, 'f', 1, 64))
				}
				select {
				case <-stop:
					return nil
				case <-ctx.Done():
					if !seen {
						return fmt.Errorf("saw %d of %d nodes alive: %w", len(node.Members()), n, ctx.Err())
					}
					return nil
				case <-tick.C:
				}
			}
		},
	}
	f := cmd.Flags()
	f.IntVarP(&n, "nodes", "n", 2, "how many nodes to wait for")
	f.StringVar(&name, "name", "", "this node's name")
	f.StringVar(&seed, "seed", "", "gossip address to join through; none for the first node")
	f.DurationVar(&deadline, "deadline", 10*time.Minute, "exit after this long whatever the parent does")
	cmd.MarkFlagRequired("name")
	return cmd
}
