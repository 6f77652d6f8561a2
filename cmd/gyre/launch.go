package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/internal/launch"
	"github.com/gyre-ml/gyre/internal/ownfile"
	"github.com/gyre-ml/gyre/internal/prof"
	"github.com/gyre-ml/gyre/internal/progress"
	"github.com/gyre-ml/gyre/internal/secret"
)

// launchSets lists the variables launch gives each rank; inherited values
// of these are dropped so a stale setting cannot leak into the job.
var launchSets = []string{
	gyre.EnvPeers, gyre.EnvRank, gyre.EnvWorldSize, gyre.EnvLocalRank, gyre.EnvDataAddr,
	gyre.EnvTransport, gyre.EnvInsecure, gyre.EnvStripes, gyre.EnvSharedMemory, gyre.EnvKeyFile, gyre.EnvKey,
	gyre.EnvName, gyre.EnvAdvertise, gyre.EnvSeed, gyre.EnvListen, gyre.EnvMinWorkers,
	gyre.EnvGossipTiming, gyre.EnvLauncher, gyre.EnvLogLevel, gyre.EnvLogFormat,
	// Per-worker outputs: launch's --timeline and --metrics-addr give each
	// worker its own; an inherited one would be every worker's.
	gyre.EnvTimeline, gyre.EnvMetricsAddr,
	prof.EnvCPU, prof.EnvBlock, prof.EnvTrace,
}

func newLaunchCmd(c *cli) *cobra.Command {
	var job launchJob
	cmd := &cobra.Command{
		Use:   "launch -n N [flags] -- CMD [ARGS...]",
		Short: "Start N local workers on 127.0.0.1 running CMD",
		Long: "launch starts N local processes of CMD on 127.0.0.1 and passes each its\n" +
			"settings in GYRE_* variables (see README): rank 0 starts the job as the\n" +
			"gossip seed, the others join through it, and iteration 0 waits for all\n" +
			"N. Gossip and data ports are free ports. It prints the seed address and\n" +
			"the key file, so that more workers (gyre train --seed) and gyre members\n" +
			"can reach the job. --static gives every rank a fixed peer list instead.\n" +
			"CMD may be a gyre subcommand (`launch -n 4 -- train` runs this binary)\n" +
			"or any program that embeds Gyre. The cluster secret is ephemeral unless\n" +
			"--key-file is given.\n\n" +
			"Output: each line is prefixed with [N]. [N] is the launch index; the\n" +
			"rank can change after a view change, and log lines carry rank= (and\n" +
			"id=). The workers log warnings and errors only, so that train shows\n" +
			"its table and a line per event (joined, view changed, lost); --log-level\n" +
			"info shows the runtime's every step. Their logs are console lines on a\n" +
			"terminal and JSON on a pipe; --log-format json keeps JSON.\n\n" +
			"Failure: a worker that exits 0 has finished (or left). A worker that\n" +
			"fails otherwise, or is killed by a signal, is lost, and the others go\n" +
			"on without it: the runtime recovers from a lost worker. The job ends\n" +
			"when every worker has exited, or when one exits with status 75 (no\n" +
			"quorum: it lost touch with a majority of its view; under launch it\n" +
			"waits 5 × --peer-timeout for it, 10 s by default, not 5 minutes); then\n" +
			"those still running get SIGTERM, which makes gyre train leave at its\n" +
			"next boundary, and SIGKILL after --grace. Ctrl-C stops the job the same\n" +
			"way.\n" +
			"--max-restarts K starts a lost worker again, up to K times, and it\n" +
			"rejoins the running job as a new member (a 2-worker job cannot keep\n" +
			"its majority through a crash, restarts or not).\n\n" +
			"Exit status: 0 when the job finished, that is a worker exited 0 and\n" +
			"none exited 75; the last line then names the lost ranks by launch\n" +
			"index (\"rank 2 killed by signal 9 (killed)\"). Else 75 when a worker\n" +
			"lost its quorum, or the status of the worker that failed first when\n" +
			"all failed, or 128+signal if a signal killed it, as shells do (137 for\n" +
			"SIGKILL); launch names that worker and the rank the failed workers'\n" +
			"reports name, if they agree on one. 1 for launch's own errors.",
		Example: "  gyre launch -n 4 -- bench allreduce\n" +
			"  gyre launch -n 2 --transport tcp --log-dir logs -- ./mytrainer --epochs 3",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			argv, own, err := resolveCommand(cmd.Root(), c.env, args)
			if err != nil {
				return err
			}
			if own && job.n > 1 {
				if err := sharedOutput(args[1:]); err != nil {
					return err
				}
			}
			return c.launchJob(cmd, job, argv)
		},
	}
	job.bindFlags(cmd, 1)
	// Not the benches': a restarted worker would time nothing comparable.
	cmd.Flags().IntVar(&job.restarts, "max-restarts", 0,
		"start a worker that fails (not status 0 or 75) again, up to K times per launch index, after 1 s doubling to 10 s; "+
			"it rejoins the running job through the live workers as a new member. Not with --static")
	return cmd
}

// launchJob is what gyre launch needs beyond the command: the settings it
// passes to every worker. bench allreduce launches itself with it too.
type launchJob struct {
	n         int
	transport string
	insecure  bool
	stripes   int
	shm       string
	keyFile   string
	logDir    string
	grace     time.Duration
	static    bool
	restarts  int
	metrics   string // host:port of rank 0's metrics; rank i's port is port+i
	timeline  string // rank i writes its timeline to this file with .rank<i> before the extension
}

func (j *launchJob) bindFlags(cmd *cobra.Command, defaultN int) {
	f := cmd.Flags()
	f.IntVarP(&j.n, "nproc", "n", defaultN, "number of local workers")
	f.StringVar(&j.transport, "transport", gyre.DefaultTransport, "data-plane transport: quic or tcp")
	f.BoolVar(&j.insecure, "insecure", false, "with --transport tcp: plain TCP, no encryption or authentication")
	f.IntVar(&j.stripes, "stripes", gyre.DefaultStripes, "connections per peer link, 1 to 16; 0: the link probes choose 1 or 4 per job")
	f.StringVar(&j.shm, "shm", gyre.SharedMemoryAuto, "how the workers, all on this machine, reach each other: auto (shared memory) or off (the network transport)")
	f.StringVar(&j.keyFile, "key-file", "", "cluster secret (gyre keygen --out); default: an ephemeral one")
	f.StringVar(&j.logDir, "log-dir", "", "also write each worker's output to DIR/rank-N.log, N its launch index")
	f.DurationVar(&j.grace, "grace", launch.DefaultGrace,
		"when the job is stopped (a worker exits 75, no quorum; or Ctrl-C), how long the workers get to leave after SIGTERM "+
			"before SIGKILL; longer than an iteration")
	f.BoolVar(&j.static, "static", false, "give the workers a fixed peer list (GYRE_PEERS) instead of a gossip seed")
	f.StringVar(&j.timeline, "timeline", "", "each worker writes a Chrome trace-event timeline: rank i to FILE with .rank<i> before its extension")
	f.StringVar(&j.metrics, "metrics-addr", "", "serve each worker's Prometheus metrics over HTTP: rank i at HOST:PORT+i (port 0: each a free port, logged)")
}

// launchJob starts j.n workers of argv and waits for them.
func (c *cli) launchJob(cmd *cobra.Command, j launchJob, argv []string) error {
	if j.n < 1 {
		return fmt.Errorf("-n %d: need at least 1 worker", j.n)
	}
	switch {
	case j.restarts < 0:
		return fmt.Errorf("--max-restarts %d: want 0 or more", j.restarts)
	case j.restarts > 0 && j.static:
		return errors.New("--max-restarts with --static: a static view fails at its first lost worker and takes no one back; drop --static to have lost workers started again")
	case j.restarts > 0 && j.n == 1:
		return errors.New("--max-restarts with -n 1: a worker started again rejoins the running workers, and a lone one has none; its job is over when it fails")
	case j.restarts > 0 && j.n == 2:
		fmt.Fprintln(cmd.ErrOrStderr(), "gyre launch: --max-restarts with 2 workers: a crash leaves the other without a majority, and the job ends (status 75) whatever the restarts")
	}
	base := gyre.Config{Transport: j.transport, Insecure: j.insecure, Stripes: j.stripes, SharedMemory: j.shm, KeyFile: j.keyFile}
	var ephemeral *secret.Secret
	// Gossip is always encrypted, so a gossip job has a secret even when
	// its data plane is --insecure.
	if j.keyFile == "" && (!j.insecure || !j.static) {
		key, err := secret.Generate()
		if err != nil {
			return err
		}
		ephemeral, base.Key = &key, key.Hex()
	}
	if err := base.Validate(); err != nil {
		return err
	}
	ports, err := launch.FreePorts(2 * j.n)
	if err != nil {
		return err
	}
	peers, gossip := ports[:j.n], ports[j.n:]
	// The view orders ranks by data address: sorted ports make launch's
	// rank r the view's rank r too.
	slices.SortFunc(peers, func(a, b string) int { return cmp.Compare(portOf(a), portOf(b)) })
	keyPath, cleanup, err := launchKey(j.keyFile, ephemeral)
	if err != nil {
		return err
	}
	defer cleanup()
	base = base.WithDefaults()
	extra := c.workerLogs(cmd.ErrOrStderr())
	procs, own := workerProcs(c.env.lookup, runtime.GOMAXPROCS(0), j.n)
	if !own {
		extra = append(extra, "GOMAXPROCS="+strconv.Itoa(procs))
	}
	insecure := map[bool]string{true: " (insecure)"}[base.Insecure]
	var (
		env   func(int) []string
		ready func(context.Context) error
	)
	if j.static {
		env = rankEnv(c.env.environ(), base, keyPath, extra, staticEnv(peers))
		fmt.Fprintf(cmd.ErrOrStderr(), "gyre launch: %d workers on 127.0.0.1, transport %s%s, static peers %s, key file %s\n",
			j.n, base.Transport, insecure, strings.Join(peers, ","), keyDesc(keyPath, j.keyFile))
	} else {
		env = rankEnv(c.env.environ(), base, keyPath, extra, gossipEnv(peers, gossip))
		ready = listening(gossip[0])
		fmt.Fprintf(cmd.ErrOrStderr(), "gyre launch: %d workers on 127.0.0.1, transport %s%s, seed %s, key file %s\n",
			j.n, base.Transport, insecure, gossip[0], keyDesc(keyPath, j.keyFile))
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "gyre launch: GOMAXPROCS %d per worker (%s)\n", procs,
		map[bool]string{true: "from the environment", false: "the cores shared out; set GOMAXPROCS to choose"}[own])
	if j.metrics != "" {
		addrs, err := metricsAddrs(j.metrics, j.n)
		if err != nil {
			return err
		}
		rankEnv := env
		env = func(i int) []string { return append(rankEnv(i), gyre.EnvMetricsAddr+"="+addrs[i]) }
		fmt.Fprintf(cmd.ErrOrStderr(), "gyre launch: metrics and status pages at %s\n", describeAddrs(addrs))
	}
	if j.timeline != "" {
		rankEnv := env
		env = func(i int) []string { return append(rankEnv(i), gyre.EnvTimeline+"="+rankFile(j.timeline, i)) }
		fmt.Fprintf(cmd.ErrOrStderr(), "gyre launch: timelines in %s to %s\n", rankFile(j.timeline, 0), rankFile(j.timeline, j.n-1))
	}
	if c.prof.Any() {
		viewEnv := env
		env = func(i int) []string { return append(viewEnv(i), c.prof.WorkerEnv(i)...) }
	}
	opts := launch.Options{
		N: j.n, Argv: argv, Env: env,
		Stdout: cmd.OutOrStdout(), Stderr: cmd.ErrOrStderr(),
		LogDir: j.logDir, Grace: j.grace, NoQuorum: gyre.ExitNoQuorum, IDs: peers, FirstReady: ready, Logger: c.log,
	}
	if isTerminal(cmd.OutOrStdout()) {
		// The workers write to pipes: whichever is rank 0 hands its
		// progress over as plain lines (a view change may make another
		// worker rank 0), and launch draws the live line on its terminal.
		bar := progress.NewBar(cmd.OutOrStdout())
		defer bar.Finish()
		workerEnv := env
		opts.Env = func(i int) []string { return append(workerEnv(i), envProgress+"="+progressLines) }
		opts.Stdout = bar
		if isTerminal(cmd.ErrOrStderr()) {
			opts.Stderr = bar.Also(cmd.ErrOrStderr())
		}
		opts.TakeLine = func(_ int, line []byte) bool {
			st, ok := progress.Parse(line)
			if ok {
				bar.Update(st)
			}
			return ok
		}
	}
	if j.restarts > 0 {
		opts.MaxRestarts, opts.RestartEnv = j.restarts, rejoinEnv(opts.Env, gossip)
	}
	err = launch.Run(cmd.Context(), opts)
	return launchResult(cmd.ErrOrStderr(), err)
}

// describeAddrs names each worker's status page: a range for consecutive
// ports, else one by one.
func describeAddrs(addrs []string) string {
	consecutive := true
	for i := 1; i < len(addrs); i++ {
		consecutive = consecutive && portOf(addrs[i]) == portOf(addrs[0])+i
	}
	if consecutive && len(addrs) > 1 {
		return fmt.Sprintf("http://%s/ ([0]) to http://%s/ ([%d])", addrs[0], addrs[len(addrs)-1], len(addrs)-1)
	}
	parts := make([]string, len(addrs))
	for i, a := range addrs {
		parts[i] = fmt.Sprintf("[%d] http://%s/", i, a)
	}
	return strings.Join(parts, ", ")
}

// rankFile is path with .rank<i> before its extension: timeline.json
// becomes timeline.rank0.json.
func rankFile(path string, i int) string {
	ext := filepath.Ext(path)
	return strings.TrimSuffix(path, ext) + ".rank" + strconv.Itoa(i) + ext
}

// metricsAddrs gives each of n workers its metrics address: HOST:PORT+i
// for launch index i, or, when PORT is 0, free ports launch picks (on
// 127.0.0.1, or HOST's ports as free there), so that it can print them.
func metricsAddrs(addr string, n int) ([]string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr %q: want HOST:PORT: %w", addr, err)
	}
	first, err := strconv.Atoi(port)
	if err != nil || first < 0 || first > 65535 || (first > 0 && first+n-1 > 65535) {
		return nil, fmt.Errorf("--metrics-addr %q: want a port in [0, %d] for %d workers", addr, 65536-n, n)
	}
	addrs := make([]string, n)
	if first == 0 {
		free, err := launch.FreePorts(n)
		if err != nil {
			return nil, fmt.Errorf("--metrics-addr %q: %w", addr, err)
		}
		for i, a := range free {
			addrs[i] = net.JoinHostPort(host, strconv.Itoa(portOf(a)))
		}
		return addrs, nil
	}
	for i := range addrs {
		addrs[i] = net.JoinHostPort(host, strconv.Itoa(first+i))
	}
	return addrs, nil
}

// launchResult turns launch.Run's result into gyre launch's: a job that
// finished without some workers is a success, whose last line names them;
// a failed job exits with the status of the worker that ended it.
func launchResult(stderr io.Writer, err error) error {
	var (
		lost *launch.LostError
		re   *launch.RankError
	)
	switch {
	case errors.As(err, &lost):
		fmt.Fprintf(stderr, "gyre launch: %v\n", lost)
		return nil
	case errors.As(err, &re) && re.Stopped:
		return &exitError{code: re.ExitCode(), err: fmt.Errorf("%w; the workers still running were stopped", err)}
	case errors.As(err, &re):
		return &exitError{code: re.ExitCode(), err: err}
	}
	return err
}

// workerLogs returns the log settings for the workers: warnings and
// errors unless the user chose a level, since the runtime's info lines
// (a dozen per worker at the start) would bury the trainer's own output;
// and on a terminal, console lines rather than JSON, since the workers
// write to a pipe.
func (c *cli) workerLogs(stderr io.Writer) []string {
	level, format := c.logLevel, c.logFormat
	if !c.logLevelSet {
		level = "warn"
	}
	if strings.EqualFold(format, "auto") && isTerminal(stderr) {
		format = "console"
	}
	return []string{gyre.EnvLogLevel + "=" + level, gyre.EnvLogFormat + "=" + format}
}

// workerProcs returns the GOMAXPROCS each of n local workers runs with,
// and whether the environment chose it. By default the cores are shared
// out, at least one each, as torchrun sets OMP_NUM_THREADS=1 when it
// starts several workers on one node: a Go process sizes its scheduler
// for every core, and several of them on one machine spend a small
// collective's time waking threads that wait for a core (bench/RESULTS.md,
// "Small and medium messages"). cores is this process's GOMAXPROCS,
// which counts the CPUs it may use, cgroup limits included.
func workerProcs(lookup func(string) (string, bool), cores, n int) (procs int, fromEnv bool) {
	if v, ok := lookup("GOMAXPROCS"); ok && v != "" {
		if p, err := strconv.Atoi(v); err == nil && p > 0 {
			return p, true
		}
	}
	return max(1, cores/max(n, 1)), false
}

// listening returns a wait until something accepts TCP connections at
// addr: the seed's gossip, before its joiners dial it.
func listening(addr string) func(context.Context) error {
	return func(ctx context.Context) error {
		var d net.Dialer
		for {
			conn, err := d.DialContext(ctx, "tcp", addr)
			if err == nil {
				return conn.Close()
			}
			select {
			case <-ctx.Done():
				return err
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
}

func portOf(addr string) int {
	_, p, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(p)
	return n
}

// exitError carries the process exit status main should use.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }
func (e *exitError) ExitCode() int { return e.code }

// resolveCommand runs this binary when args name one of its subcommands
// (own), and otherwise looks the program up in PATH.
func resolveCommand(root *cobra.Command, e env, args []string) (argv []string, own bool, err error) {
	if sub, _, err := root.Find(args[:1]); err == nil && sub != root && !strings.Contains(args[0], "/") {
		exe, err := e.executable()
		if err != nil {
			return nil, false, fmt.Errorf("find this executable to run %q: %w", args[0], err)
		}
		return append([]string{exe}, args...), true, nil
	}
	prog, err := exec.LookPath(args[0])
	if err != nil {
		return nil, false, fmt.Errorf("command %q: %w", args[0], err)
	}
	return append([]string{prog}, args[1:]...), false, nil
}

// workerFiles are the flags of gyre's commands that name a file one
// worker alone writes (each takes an exclusive lock on it), with where
// launch itself gives each worker its own.
var workerFiles = map[string]string{
	"--timeline":      "or give it to launch, `gyre launch --timeline t.json`, which writes t.rank<i>.json",
	"--metrics-file":  "",
	"--save-params":   "",
	"--cpu-profile":   "or give it to gyre before launch, `gyre --cpu-profile p launch`, which writes p.<i>",
	"--block-profile": "or give it to gyre before launch, `gyre --block-profile p launch`, which writes p.<i>",
	"--exec-trace":    "or give it to gyre before launch, `gyre --exec-trace p launch`, which writes p.<i>",
}

// sharedOutput refuses a worker command (gyre's own) whose arguments name
// a per-worker file without {i}: every worker would write it, and all but
// the first would fail on its lock.
func sharedOutput(args []string) error {
	for k, a := range args {
		if a == "--" {
			break
		}
		name, value, inline := strings.Cut(a, "=")
		hint, perWorker := workerFiles[name]
		if !perWorker {
			continue
		}
		if !inline {
			if k+1 == len(args) {
				continue // cobra reports the missing value
			}
			value = args[k+1]
		}
		if strings.Contains(value, launch.IndexPlaceholder) || !ownfile.Regular(value) {
			continue // each its own, or a device (/dev/null) that many may write
		}
		if hint != "" {
			hint = "; " + hint
		}
		return fmt.Errorf("%s %s would be written by every worker: put {i} in its name, which launch replaces with each worker's launch index (%s %s)%s",
			name, value, name, indexed(value), hint)
	}
	return nil
}

// indexed is path with launch's index placeholder before its extension.
func indexed(path string) string {
	ext := filepath.Ext(path)
	return strings.TrimSuffix(path, ext) + "-" + launch.IndexPlaceholder + ext
}

// launchKey returns the key file the workers read: the user's, made
// absolute, or the ephemeral secret written to a private temporary file
// that cleanup removes, or "" when the job is insecure.
func launchKey(keyFile string, ephemeral *secret.Secret) (string, func(), error) {
	nothing := func() {}
	switch {
	case keyFile != "":
		abs, err := filepath.Abs(keyFile)
		if err != nil {
			return "", nothing, err
		}
		if _, err := secret.Load(abs); err != nil {
			return "", nothing, fmt.Errorf("--key-file: %w", err)
		}
		return abs, nothing, nil
	case ephemeral == nil:
		return "", nothing, nil
	}
	dir, err := os.MkdirTemp("", "gyre-launch-")
	if err != nil {
		return "", nothing, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	path := filepath.Join(dir, "cluster.key")
	if err := ephemeral.WriteFile(path); err != nil {
		cleanup()
		return "", nothing, fmt.Errorf("ephemeral cluster secret: %w", err)
	}
	return path, cleanup, nil
}

func keyDesc(path, given string) string {
	switch {
	case path == "":
		return "none (insecure)"
	case given == "":
		return path + " (ephemeral, removed at exit)"
	}
	return path
}

// rankEnv returns each rank's environment: the parent's, without the
// variables launch sets, plus the job's settings, extra (the log settings
// and GOMAXPROCS) and the rank's view settings from view.
func rankEnv(parent []string, cfg gyre.Config, keyPath string, extra []string, view func(int) []string) func(int) []string {
	var keep []string
	for _, kv := range parent {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(launchSets, name) {
			keep = append(keep, kv)
		}
	}
	return func(r int) []string {
		env := append(slices.Clone(keep), extra...)
		env = append(env,
			gyre.EnvLocalRank+"="+strconv.Itoa(r),
			gyre.EnvTransport+"="+cfg.Transport,
			gyre.EnvInsecure+"="+strconv.FormatBool(cfg.Insecure),
			gyre.EnvStripes+"="+strconv.Itoa(cfg.Stripes),
			gyre.EnvSharedMemory+"="+cfg.SharedMemory,
			gyre.EnvLauncher+"="+gyre.LauncherLaunch,
		)
		if keyPath != "" {
			env = append(env, gyre.EnvKeyFile+"="+keyPath)
		}
		return append(env, view(r)...)
	}
}

// staticEnv is the static view: every rank gets the peer list and its rank.
func staticEnv(peers []string) func(int) []string {
	return func(r int) []string {
		return []string{
			gyre.EnvPeers + "=" + strings.Join(peers, ","),
			gyre.EnvRank + "=" + strconv.Itoa(r),
			gyre.EnvWorldSize + "=" + strconv.Itoa(len(peers)),
			gyre.EnvDataAddr + "=" + peers[r],
		}
	}
}

// rejoinEnv is the environment of a worker started again: its own, with
// the running workers' gossip addresses for its seeds. Never its own
// seed alone, which may be a dead worker's; and rank 0, which started the
// job, would start a second one without a seed.
func rejoinEnv(env func(int) []string, gossip []string) func(int, []int) []string {
	return func(i int, running []int) []string {
		seeds := make([]string, len(running))
		for k, r := range running {
			seeds[k] = gossip[r]
		}
		kept := slices.DeleteFunc(env(i), func(kv string) bool { return strings.HasPrefix(kv, gyre.EnvSeed+"=") })
		return append(kept, gyre.EnvSeed+"="+strings.Join(seeds, ","))
	}
}

// gossipEnv is gossip membership: rank 0 starts the job on the first
// gossip address, the others join through it, and iteration 0 waits for
// all of them. Ranks are the view's, which orders by data address.
func gossipEnv(data, gossip []string) func(int) []string {
	return func(r int) []string {
		env := []string{
			gyre.EnvListen + "=" + gossip[r],
			gyre.EnvDataAddr + "=" + data[r],
			gyre.EnvMinWorkers + "=" + strconv.Itoa(len(data)),
			gyre.EnvGossipTiming + "=" + gyre.GossipLocal,
		}
		if r > 0 {
			env = append(env, gyre.EnvSeed+"="+gossip[0])
		}
		return env
	}
}
