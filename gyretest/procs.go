package gyretest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/transport/transporttest"
)

var builds struct {
	mu   sync.Mutex
	dir  string
	bins map[string]string // package path → binary
}

// Build builds the main package pkg (an import path such as
// "github.com/gyre-ml/gyre/examples/embed") once per test binary and
// returns the binary's path. Packages that call it remove the builds in
// TestMain with Main.
func Build(tb testing.TB, pkg string) string {
	tb.Helper()
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if bin, ok := builds.bins[pkg]; ok {
		return bin
	}
	if builds.dir == "" {
		dir, err := os.MkdirTemp("", "gyretest-")
		if err != nil {
			tb.Fatal(err)
		}
		builds.dir, builds.bins = dir, make(map[string]string)
	}
	bin := filepath.Join(builds.dir, strconv.Itoa(len(builds.bins))+"-"+filepath.Base(pkg))
	if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
		tb.Fatalf("gyretest: go build %s: %v\n%s", pkg, err, out)
	}
	builds.bins[pkg] = bin
	return bin
}

// Gyre builds the gyre command once per test binary and returns its path.
func Gyre(tb testing.TB) string {
	tb.Helper()
	return Build(tb, "github.com/gyre-ml/gyre/cmd/gyre")
}

// Main runs the tests and then removes what Build and Gyre built. Call it from
// TestMain: func TestMain(m *testing.M) { gyretest.Main(m) }.
func Main(m *testing.M) {
	code := m.Run()
	if builds.dir != "" {
		os.RemoveAll(builds.dir)
	}
	os.Exit(code)
}

// ProcOptions describe a job of real processes.
type ProcOptions struct {
	// N is the number of processes.
	N int
	// Argv returns rank's program and arguments. Required; Gyre gives the
	// path of the gyre command.
	Argv func(rank int) []string
	// Transport is "quic" (default) or "tcp".
	Transport string
	// SharedMemory is gyre.SharedMemoryAuto (the default: the processes,
	// all on this machine, reach each other through shared memory) or
	// gyre.SharedMemoryOff (over Transport).
	SharedMemory string
	// Key returns rank's cluster secret, hex-encoded. Default: one fresh
	// secret shared by all, as `gyre launch` makes.
	Key func(rank int) string
	// Env, if set, returns further KEY=VALUE entries for rank, applied
	// after the harness's own (later entries win).
	Env func(rank int) []string
	// Gossip gives the processes gossip membership, as `gyre launch`
	// does, instead of the static view: process 0 starts the job, the
	// others join through its gossip address, iteration 0 waits for all
	// N, and data ports ascend with the index, so index r is rank r.
	Gossip bool
	// SharedSeeds, with Gossip, gives every process the same seeds, every
	// gossip address with process 0's first, as a StatefulSet gives its
	// pods one command: process 0 is the starter (Config.Seeds). The
	// others start first, and the starter 2 s later, so that they have
	// found only each other when it comes up.
	SharedSeeds bool
}

// Procs is a running job of real processes.
type Procs struct {
	// Peers are the processes' data-plane addresses, by index (the rank
	// in the static view).
	Peers []string
	// GossipAddrs are their gossip addresses with ProcOptions.Gossip.
	GossipAddrs []string
	procs       []*proc
	// earlier are processes that Restart replaced, for the logs.
	earlier []*proc
	start   time.Time
	o       ProcOptions
	base    []string
}

type proc struct {
	rank     int
	env      []string
	cmd      *exec.Cmd
	out, err transporttest.LogBuffer // a locked buffer: the copier writes, the test reads
	done     chan struct{}
	waitErr  error
	ended    time.Time
}

// Result is how one process ended.
type Result struct {
	Rank int
	// Code is the exit status; -1 if a signal ended the process.
	Code           int
	Stdout, Stderr string
	// Elapsed is the time from StartProcs to the exit.
	Elapsed time.Duration
}

// StartProcs starts o.N processes, each with the environment `gyre launch`
// gives its children, on free loopback ports: GYRE_LOCAL_RANK,
// GYRE_DATA_ADDR, GYRE_TRANSPORT and GYRE_KEY, plus GYRE_PEERS, GYRE_RANK
// and GYRE_WORLD_SIZE in the static view (`launch --static`), or with
// o.Gossip GYRE_LISTEN, GYRE_SEED (but for process 0), GYRE_MIN_WORKERS
// and GYRE_GOSSIP_TIMING=local. The parent's GYRE_* variables are not
// passed on. When the test ends, processes still running are killed, and
// if the test failed every process's output is logged.
func StartProcs(tb testing.TB, o ProcOptions) *Procs {
	tb.Helper()
	if o.SharedMemory == "" {
		o.SharedMemory = gyre.SharedMemoryAuto
	}
	if o.Transport == "" {
		o.Transport = gyre.TransportQUIC
	}
	if o.Key == nil {
		key := Key(tb)
		o.Key = func(int) string { return key }
	}
	p := &Procs{start: time.Now(), o: o}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GYRE_") {
			p.base = append(p.base, kv)
		}
	}
	// One search for every port, so that no two are alike.
	ports := freePorts(tb, 2*o.N)
	p.Peers = sortedPorts(ports[:o.N:o.N]) // clipped: Add appends to both
	if o.Gossip {
		p.GossipAddrs = ports[o.N:]
	}
	tb.Cleanup(func() { p.cleanup(tb) })
	p.procs = make([]*proc, o.N)
	order := make([]int, o.N)
	for r := range order {
		order[r] = r
		if o.SharedSeeds {
			order[r] = o.N - 1 - r
		}
	}
	for _, r := range order {
		if o.SharedSeeds && r == 0 && o.N > 1 {
			time.Sleep(sharedSeedsLag)
		}
		var env []string
		if o.Gossip {
			seeds := p.GossipAddrs[:1]
			if o.SharedSeeds {
				seeds = p.GossipAddrs
			}
			env = p.gossipEnv(r, seeds)
			env = append(env, gyre.EnvMinWorkers+"="+strconv.Itoa(o.N))
		} else {
			env = []string{
				gyre.EnvPeers + "=" + strings.Join(p.Peers, ","),
				gyre.EnvRank + "=" + strconv.Itoa(r),
				gyre.EnvWorldSize + "=" + strconv.Itoa(o.N),
				gyre.EnvDataAddr + "=" + p.Peers[r],
			}
		}
		p.startProc(tb, r, env)
	}
	return p
}

// sharedSeedsLag is how long the starter of a SharedSeeds job starts
// after the others: they join each other within a second.
const sharedSeedsLag = 2 * time.Second

// sortedPorts sorts loopback addresses by port, ascending, and returns
// them.
func sortedPorts(addrs []string) []string {
	slices.SortFunc(addrs, func(a, b string) int {
		_, pa, _ := strings.Cut(a, ":")
		_, pb, _ := strings.Cut(b, ":")
		x, _ := strconv.Atoi(pa)
		y, _ := strconv.Atoi(pb)
		return x - y
	})
	return addrs
}

// gossipEnv is process r's gossip settings: index 0 starts the job, the
// others join through seeds; with SharedSeeds all have the seeds.
func (p *Procs) gossipEnv(r int, seeds []string) []string {
	env := []string{
		gyre.EnvListen + "=" + p.GossipAddrs[r],
		gyre.EnvDataAddr + "=" + p.Peers[r],
		gyre.EnvGossipTiming + "=" + gyre.GossipLocal,
	}
	if r > 0 || p.o.SharedSeeds {
		env = append(env, gyre.EnvSeed+"="+strings.Join(seeds, ","))
	}
	return env
}

// Add starts one more process of a gossiping job, joining through seeds
// (default: process 0's gossip address), and returns its index. Its
// program and environment come from ProcOptions' Argv and Env, called with
// that index.
func (p *Procs) Add(tb testing.TB, seeds ...string) int {
	tb.Helper()
	if !p.o.Gossip {
		tb.Fatal("gyretest: Procs.Add needs ProcOptions.Gossip")
	}
	if len(seeds) == 0 {
		seeds = p.GossipAddrs[:1]
	}
	r := len(p.procs)
	p.procs = append(p.procs, nil)
	// Workers added just before may not have bound their ports yet.
	ports := freePortsBut(tb, 2, p.Peers, p.GossipAddrs)
	p.Peers = append(p.Peers, ports[0])
	p.GossipAddrs = append(p.GossipAddrs, ports[1])
	p.startProc(tb, r, p.gossipEnv(r, seeds))
	return r
}

// startProc starts process r with the harness's environment plus env.
func (p *Procs) startProc(tb testing.TB, r int, env []string) {
	tb.Helper()
	env = append(slices.Clone(p.base), append(env,
		gyre.EnvLocalRank+"="+strconv.Itoa(r),
		gyre.EnvTransport+"="+p.o.Transport,
		gyre.EnvSharedMemory+"="+p.o.SharedMemory,
		gyre.EnvKey+"="+p.o.Key(r))...)
	if p.o.Env != nil {
		env = append(env, p.o.Env(r)...)
	}
	p.run(tb, r, env)
}

// run starts process r with exactly env, in slot r.
func (p *Procs) run(tb testing.TB, r int, env []string) {
	tb.Helper()
	argv := p.o.Argv(r)
	pr := &proc{rank: r, env: env, cmd: exec.Command(argv[0], argv[1:]...), done: make(chan struct{})}
	pr.cmd.Env = env
	pr.cmd.Stdout, pr.cmd.Stderr = &pr.out, &pr.err
	if err := pr.cmd.Start(); err != nil {
		tb.Fatalf("gyretest: start process %d: %v", r, err)
	}
	go func() {
		pr.waitErr = pr.cmd.Wait()
		pr.ended = time.Now()
		close(pr.done)
	}()
	p.procs[r] = pr
}

// Restart starts process r again, with the same program, arguments and
// environment (the same ports), as a supervisor restarts a crashed pod
// or task. The old process must have exited or be about to: Restart
// waits up to 10 s for it.
func (p *Procs) Restart(tb testing.TB, r int) {
	tb.Helper()
	old := p.procs[r]
	select {
	case <-old.done:
	case <-time.After(10 * time.Second):
		tb.Fatalf("gyretest: restart of process %d: it is still running", r)
	}
	p.earlier = append(p.earlier, old)
	p.run(tb, r, old.env)
}

// Pid returns process r's process ID.
func (p *Procs) Pid(r int) int { return p.procs[r].cmd.Process.Pid }

// Stdout returns what process r has printed so far.
func (p *Procs) Stdout(r int) string { return p.procs[r].out.String() }

// Stderr returns what process r has logged so far.
func (p *Procs) Stderr(r int) string { return p.procs[r].err.String() }

func (p *Procs) signal(tb testing.TB, rank int, sig syscall.Signal) {
	tb.Helper()
	if err := p.procs[rank].cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		tb.Fatalf("gyretest: %v to rank %d: %v", sig, rank, err)
	}
}

// Term sends SIGTERM to rank: a graceful leave for gyre train.
func (p *Procs) Term(tb testing.TB, rank int) { p.signal(tb, rank, syscall.SIGTERM) }

// Kill sends SIGKILL to rank: a crash, with no last words.
func (p *Procs) Kill(tb testing.TB, rank int) { p.signal(tb, rank, syscall.SIGKILL) }

// Stop sends SIGSTOP to rank: alive to the kernel, silent to its peers.
func (p *Procs) Stop(tb testing.TB, rank int) { p.signal(tb, rank, syscall.SIGSTOP) }

// Cont resumes a rank stopped by Stop.
func (p *Procs) Cont(tb testing.TB, rank int) { p.signal(tb, rank, syscall.SIGCONT) }

// Wait waits for every process to exit, or ctx to end (then the processes
// still running are killed), and returns how each ended.
func (p *Procs) Wait(ctx context.Context) []Result {
	res := make([]Result, len(p.procs))
	for r := range p.procs {
		res[r] = p.WaitRank(ctx, r)
	}
	return res
}

// WaitRank waits for rank to exit, or ctx to end (then it is killed).
func (p *Procs) WaitRank(ctx context.Context, rank int) Result {
	pr := p.procs[rank]
	select {
	case <-pr.done:
	case <-ctx.Done():
		pr.cmd.Process.Kill()
		<-pr.done
	}
	code := 0
	var ee *exec.ExitError
	if errors.As(pr.waitErr, &ee) {
		code = ee.ExitCode()
	}
	return Result{Rank: rank, Code: code, Stdout: pr.out.String(), Stderr: pr.err.String(), Elapsed: pr.ended.Sub(p.start)}
}

// cleanup kills what still runs and, if the test failed, logs the output.
func (p *Procs) cleanup(tb testing.TB) {
	for _, pr := range p.procs {
		if pr != nil { // nil: a start that failed the test
			pr.cmd.Process.Kill()
			<-pr.done
		}
	}
	if tb.Failed() {
		for _, pr := range p.earlier {
			tb.Logf("rank %d before its restart, stdout:\n%s\nstderr:\n%s", pr.rank, pr.out.String(), pr.err.String())
		}
		for r, pr := range p.procs {
			if pr == nil {
				continue
			}
			tb.Logf("rank %d stdout:\n%s\nrank %d stderr:\n%s", r, pr.out.String(), r, pr.err.String())
		}
	}
}
