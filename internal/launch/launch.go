package launch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/syncio"
)

// DefaultGrace is how long the workers get to exit after SIGTERM, when
// the job is stopped, before SIGKILL.
const DefaultGrace = 5 * time.Second

// IndexPlaceholder, in a worker's arguments, becomes its launch index.
const IndexPlaceholder = "{i}"

// DefaultBackoff and DefaultMaxBackoff bound the wait before a failed
// worker is started again (Options.MaxRestarts): DefaultBackoff before its
// first restart, doubling for each next one up to DefaultMaxBackoff.
const (
	DefaultBackoff    = time.Second
	DefaultMaxBackoff = 10 * time.Second
)

// Options describe one local job.
type Options struct {
	// N is the number of workers, at least 1.
	N int
	// Argv is the program and its arguments, run once per worker; "{i}"
	// in an argument becomes the worker's launch index, so that each
	// worker gets files of its own (--metrics-file m-{i}.jsonl).
	Argv []string
	// Env returns the whole environment of the worker of launch index i.
	Env func(i int) []string
	// Stdout and Stderr receive every worker's output, each line prefixed
	// with "[i] ", its launch index. (The index is fixed; a worker's rank
	// in the job may change with the view.) Stderr also receives a line
	// of launch's own ("gyre launch: ...") for each restart and each
	// worker given up.
	Stdout, Stderr io.Writer
	// LogDir, if set, also receives each worker's stdout and stderr,
	// without prefixes, in LogDir/rank-<i>.log.
	LogDir string
	// Grace is how long, when the job is stopped, the workers get to exit
	// after SIGTERM before SIGKILL. Default DefaultGrace.
	Grace time.Duration
	// NoQuorum, if not 0, is the exit status with which a worker says that
	// it lost touch with a majority of its view (gyre.ExitNoQuorum): a
	// worker exiting with it stops the job. Any other failure is a lost
	// worker, and the others go on.
	NoQuorum int
	// IDs, if set, are the workers' IDs in the job by launch index, for
	// the launcher's log lines.
	IDs []string
	// FirstReady, if set, is waited for, up to FirstWait, after starting
	// worker 0 and before starting the others: a gossip seed listening
	// before its joiners dial spares them a failed first attempt and its
	// warning. Its error only ends the wait.
	FirstReady func(ctx context.Context) error
	// Logger receives the launcher's own events.
	Logger zerolog.Logger
	// TakeLine, if set, sees every line of every worker's stdout first
	// (i its launch index); a line it returns true for is not printed.
	TakeLine func(i int, line []byte) bool
	// MaxRestarts is how many times the worker of each launch index is
	// started again after it fails: a status other than 0 and NoQuorum,
	// or a signal. A worker that exited 0 finished the job or left it,
	// and one that exited NoQuorum ended it; once any worker has exited
	// 0 the job is ending, and none is started again. Default 0: a
	// failed worker stays lost.
	MaxRestarts int
	// RestartEnv returns the environment of worker i started again, given
	// the launch indexes of the workers running then, through which it
	// rejoins the job. Required with MaxRestarts.
	RestartEnv func(i int, running []int) []string
	// Backoff is the wait before a worker's first restart, doubling for
	// each next one up to MaxBackoff. Defaults DefaultBackoff and
	// DefaultMaxBackoff.
	Backoff, MaxBackoff time.Duration
}

// Exit is how a worker that failed ended.
type Exit struct {
	// Index is its launch index.
	Index int
	// Code is its exit status, -1 if a signal killed it; Signal is that
	// signal.
	Code   int
	Signal syscall.Signal
	Err    error
	// Report is what it said as it failed, if anything (see report).
	Report []string
}

// String names the worker as a lost rank, by its launch index: "rank 2
// killed by signal 9 (killed)", "rank 3 exited with status 1".
func (x Exit) String() string {
	switch {
	case x.Signal != 0:
		return fmt.Sprintf("rank %d killed by signal %d (%v)", x.Index, int(x.Signal), x.Signal)
	case x.Code >= 0:
		return fmt.Sprintf("rank %d exited with status %d", x.Index, x.Code)
	}
	return fmt.Sprintf("rank %d: %v", x.Index, x.Err)
}

// LostError reports a job that finished without some of its workers: at
// least one worker exited 0, none exited with the no-quorum status, and
// the workers in Lost failed on the way while the others went on. The job
// succeeded; Run returns LostError rather than nil so that a caller that
// needs every worker can tell. gyre launch prints it and exits 0.
type LostError struct {
	// N is the number of workers the job started with.
	N int
	// Lost are the workers that failed, in the order they exited.
	Lost []Exit
}

func (e *LostError) Error() string {
	lost := make([]string, len(e.Lost))
	for i, x := range e.Lost {
		lost[i] = x.String()
	}
	return fmt.Sprintf("the job finished without %d of %d workers: %s", len(e.Lost), e.N, strings.Join(lost, "; "))
}

// RankError reports a failed job: the worker whose failure ended it, and
// the rank the failed workers' reports name, if they agree on one. A job
// fails when a worker exits with the no-quorum status (Options.NoQuorum),
// which stops the others, or when every worker failed, or when Run's
// context ended after a worker failed; in the last two, Index is the
// first worker that failed.
type RankError struct {
	// Index is the launch index of the worker whose failure ended the job:
	// the one that exited with the no-quorum status, or else the first
	// that failed.
	Index int
	// Code is its exit status, -1 if a signal killed it; Signal is that
	// signal.
	Code   int
	Signal syscall.Signal
	Err    error
	// NoQuorum says that the worker at Index exited with the no-quorum
	// status. Stopped says that workers were still running when the job
	// ended, for lack of quorum or because Run's context ended, and were
	// stopped (SIGTERM, then SIGKILL after the grace period).
	NoQuorum, Stopped bool
	// Lost are the other workers that failed on their own before the job
	// ended, in the order they exited.
	Lost []Exit
	// Named is the rank in the job that the reports of the workers that
	// failed name (the lost rank of "lost rank 3", the odd rank of a
	// divergence), -1 if they name none or disagree. Line is a report line
	// naming it, and By the launch indexes of the workers that named it,
	// ascending.
	Named int
	Line  string
	By    []int
	// Report is the failed worker's own report, if it left one.
	Report []string
}

func (e *RankError) Error() string {
	what := fmt.Sprintf("%s failed first, %s", workers([]int{e.Index}), e.status())
	if e.NoQuorum {
		what = fmt.Sprintf("%s lost its quorum, %s", workers([]int{e.Index}), e.status())
		if len(e.Lost) > 0 {
			lost := make([]string, len(e.Lost))
			for i, x := range e.Lost {
				lost[i] = x.String()
			}
			what += " (lost before: " + strings.Join(lost, "; ") + ")"
		}
	}
	if e.Named >= 0 {
		reports := "the reports of %s name"
		if len(e.By) == 1 {
			reports = "the report of %s names"
		}
		return fmt.Sprintf(reports+" rank %d: %s; %s", workers(e.By), e.Named, e.Line, what)
	}
	if len(e.Report) > 0 {
		what += ": " + strings.TrimSpace(strings.TrimPrefix(e.Report[0], "Error:"))
	}
	return what
}

func (e *RankError) Unwrap() error { return e.Err }

// ExitCode is the status `gyre launch` exits with: the failed worker's
// own status, as mpirun does, or 128+signal when a signal killed it, as
// shells do; 1 if neither is known.
func (e *RankError) ExitCode() int {
	switch {
	case e.Code > 0:
		return e.Code
	case e.Signal != 0:
		return 128 + int(e.Signal)
	}
	return 1
}

func (e *RankError) status() string {
	switch {
	case e.Signal != 0:
		return fmt.Sprintf("killed by signal %d (%v)", int(e.Signal), e.Signal)
	case e.Code >= 0:
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return e.Err.Error()
}

// workers names launch indexes as the output prefixes show them.
func workers(idx []int) string {
	s := make([]string, len(idx))
	for i, x := range idx {
		s[i] = fmt.Sprintf("[%d]", x)
	}
	word := "workers "
	if len(idx) == 1 {
		word = "worker "
	}
	return word + strings.Join(s, " ")
}

type rank struct {
	id     int
	cmd    *exec.Cmd
	outs   []*prefixWriter
	file   *os.File
	report report
	exited chan struct{}
	err    error
}

// job is one Run: its options, outputs and processes.
type job struct {
	o              Options
	stdout, stderr io.Writer
	// all are the processes started, restarts included; latest the
	// latest of each launch index, and restarts how often each was
	// started again.
	all      []*rank
	latest   []*rank
	restarts []int
	exits    chan *rank
	due      chan int // launch indexes whose restart's backoff has passed
	timers   []*time.Timer
	waiters  sync.WaitGroup
}

// Run starts the workers and waits for them. A worker that exits 0 has
// finished (or left), and one that fails otherwise (a status, a signal) is
// lost: the others go on without it, and it is started again if
// o.MaxRestarts allows. The job ends when every worker has exited and
// none is due a restart, or at once when a worker exits with the
// no-quorum status (o.NoQuorum), or when ctx ends; then the workers still
// running are stopped: SIGTERM, and SIGKILL after o.Grace.
//
// Run returns nil when every worker exits 0; a *LostError when the job
// finished (a worker exited 0, none with the no-quorum status) without the
// workers it names; ctx's error if ctx ended first and no worker had
// failed; and otherwise a *RankError naming the worker that exited with
// the no-quorum status, or else the first that failed, and the rank the
// failed workers' reports name. Run never leaves a worker running.
func Run(ctx context.Context, o Options) error {
	if o.N < 1 {
		return fmt.Errorf("launch: need at least 1 worker, got %d", o.N)
	}
	if len(o.Argv) == 0 {
		return errors.New("launch: no command to run")
	}
	if o.MaxRestarts < 0 || (o.MaxRestarts > 0 && o.RestartEnv == nil) {
		return fmt.Errorf("launch: %d restarts: want 0, or more with RestartEnv", o.MaxRestarts)
	}
	o.Grace = cmp.Or(max(o.Grace, 0), DefaultGrace)
	o.Backoff = cmp.Or(max(o.Backoff, 0), DefaultBackoff)
	o.MaxBackoff = cmp.Or(max(o.MaxBackoff, 0), DefaultMaxBackoff)
	if o.LogDir != "" {
		if err := os.MkdirAll(o.LogDir, 0o755); err != nil {
			return fmt.Errorf("launch: log dir: %w", err)
		}
	}
	j := &job{o: o,
		// Whole writes, so that lines from different workers never interleave.
		stdout: syncio.NewWriter(o.Stdout), stderr: syncio.NewWriter(o.Stderr),
		latest: make([]*rank, o.N), restarts: make([]int, o.N),
		// At most N processes run at once, each sending its exit once.
		exits: make(chan *rank, o.N), due: make(chan int, o.N),
	}
	defer j.waiters.Wait()
	defer j.stopTimers()
	for r := range o.N {
		rk, err := j.start(r, o.Env(r))
		if err != nil {
			j.stop()
			return err
		}
		if r == 0 && o.FirstReady != nil {
			waitFirst(ctx, o, rk)
		}
	}
	out, err := j.wait(ctx)
	ended := err != nil || out.noQuorum != nil
	stopped := ended && running(j.all)
	if ended {
		j.stop()
	}
	switch {
	case out.noQuorum != nil:
		return failure(out.all(), out.noQuorum, true, stopped)
	case len(out.failed) == 0:
		return err
	case err != nil || out.finished == 0:
		return failure(out.all(), out.failed[0], false, stopped)
	}
	lost := &LostError{N: o.N}
	for _, rk := range out.failed {
		lost.Lost = append(lost.Lost, exitOf(rk))
	}
	return lost
}

// running says whether a worker has not exited yet.
func running(ranks []*rank) bool {
	for _, rk := range ranks {
		select {
		case <-rk.exited:
		default:
			return true
		}
	}
	return false
}

// FirstWait bounds the wait for Options.FirstReady: a Go worker listens
// within milliseconds of its start, and a program that never does (a
// script) should not hold the others up for long.
const FirstWait = time.Second

// waitFirst waits for o.FirstReady, worker 0's exit, ctx or FirstWait.
func waitFirst(ctx context.Context, o Options, first *rank) {
	ctx, cancel := context.WithTimeout(ctx, FirstWait)
	defer cancel()
	go func() {
		select {
		case <-first.exited:
		case <-ctx.Done():
		}
		cancel()
	}()
	if err := o.FirstReady(ctx); err != nil {
		o.log(0).Debug().Err(err).Msg("starting the others without waiting for worker 0")
	}
}

// outcome is what wait saw of the workers' exits.
type outcome struct {
	// failed are the workers that failed and were not started again, in
	// the order they exited; crashes those that were, also in order: a
	// failed job's error names them too.
	failed, crashes []*rank
	// noQuorum is the worker that exited with the no-quorum status, if
	// one did; it is also in failed.
	noQuorum *rank
	// finished counts the workers that exited 0.
	finished int
}

// all are the failures, those started again first.
func (out outcome) all() []*rank { return append(slices.Clone(out.crashes), out.failed...) }

// wait collects the workers' exits until every worker has exited and
// none is due a restart, one exits with the no-quorum status, or ctx ends
// (then with ctx's error). A worker that fails otherwise is lost, and the
// others go on; it is started again after its backoff if o.MaxRestarts
// allows.
func (j *job) wait(ctx context.Context) (outcome, error) {
	var out outcome
	o := j.o
	for running, pending := o.N, 0; running+pending > 0; {
		select {
		case rk := <-j.exits:
			running--
			if rk.err == nil {
				out.finished++
				o.log(rk.id).Debug().Msg("worker exited")
				continue
			}
			if code, _ := exitStatus(rk.err); o.NoQuorum != 0 && code == o.NoQuorum {
				out.failed = append(out.failed, rk)
				out.noQuorum = rk
				o.log(rk.id).Error().Err(rk.err).Msg("worker lost its quorum; stopping the job")
				return out, nil
			}
			if j.restart(rk, out.finished) {
				out.crashes = append(out.crashes, rk)
				pending++
				continue
			}
			out.failed = append(out.failed, rk)
			if running > 0 {
				o.log(rk.id).Warn().Err(rk.err).Int("running", running).Msg("worker lost; the others go on")
			} else {
				o.log(rk.id).Warn().Err(rk.err).Msg("worker lost; it was the last one running")
			}
		case i := <-j.due:
			pending--
			prev := j.latest[i]
			live := j.running()
			if out.finished > 0 || len(live) == 0 {
				// Nobody to rejoin: a worker started now would start a job
				// of its own, or find the job ending.
				j.say("not starting rank %d again: %s", i, map[bool]string{true: "the job is ending", false: "no worker is running to rejoin"}[out.finished > 0])
				out.failed = append(out.failed, prev)
				continue
			}
			if _, err := j.start(i, o.RestartEnv(i, live)); err != nil {
				j.say("could not start rank %d again: %v", i, err)
				out.failed = append(out.failed, prev)
				continue
			}
			running++
		case <-ctx.Done():
			o.Logger.Warn().Msg("interrupted; stopping every worker")
			return out, ctx.Err()
		}
	}
	return out, nil
}

// restart schedules the start again of failed worker rk, after its
// backoff, if MaxRestarts allows and no worker has finished; it says so,
// or that the worker is given up, on stderr.
func (j *job) restart(rk *rank, finished int) bool {
	o, i := j.o, rk.id
	if o.MaxRestarts == 0 {
		return false
	}
	x := exitOf(rk)
	if j.restarts[i] >= o.MaxRestarts || finished > 0 {
		why := fmt.Sprintf("giving up on it after %d restart%s (--max-restarts %d)", j.restarts[i], map[bool]string{true: "s"}[j.restarts[i] != 1], o.MaxRestarts)
		if finished > 0 {
			why = "not starting it again: the job is ending"
		}
		j.say("%v%s; %s", x, lastError(x), why)
		return false
	}
	wait := o.MaxBackoff
	if j.restarts[i] < 20 { // past it, the doubling has long reached the bound
		wait = min(o.Backoff<<j.restarts[i], o.MaxBackoff)
	}
	j.restarts[i]++
	j.say("%v%s; starting it again in %v (restart %d of %d)", x, lastError(x), wait, j.restarts[i], o.MaxRestarts)
	j.timers = append(j.timers, time.AfterFunc(wait, func() { j.due <- i }))
	return true
}

// lastError quotes a failed worker's error, if it reported one: a
// killed worker's last line of output says nothing of its end.
func lastError(x Exit) string {
	if len(x.Report) == 0 || !strings.HasPrefix(x.Report[0], "Error:") {
		return ""
	}
	return ": " + strings.TrimSpace(strings.TrimPrefix(x.Report[0], "Error:"))
}

// say writes a line of launch's own to stderr, between the workers'.
func (j *job) say(format string, args ...any) {
	fmt.Fprintf(j.stderr, "gyre launch: "+format+"\n", args...)
}

// running returns the launch indexes whose latest worker has not exited.
func (j *job) running() []int {
	var live []int
	for i, rk := range j.latest {
		if rk != nil && running([]*rank{rk}) {
			live = append(live, i)
		}
	}
	return live
}

func (j *job) stopTimers() {
	for _, t := range j.timers {
		t.Stop()
	}
}

// stop stops every worker still running.
func (j *job) stop() { stop(j.all, j.o.Grace, j.o.Logger) }

// failure builds the job's error: end is the worker whose failure ended
// it (with the no-quorum status if noQuorum), failed every worker that
// failed on its own, end among them; stopped says the others were stopped.
func failure(failed []*rank, end *rank, noQuorum, stopped bool) *RankError {
	x := exitOf(end)
	e := &RankError{Index: x.Index, Code: x.Code, Signal: x.Signal, Err: x.Err, Report: x.Report,
		NoQuorum: noQuorum, Stopped: stopped}
	reports := make([][]string, len(failed))
	for i, rk := range failed {
		reports[i] = rk.report.get()
		if rk != end {
			e.Lost = append(e.Lost, exitOf(rk))
		}
	}
	var by []int
	e.Named, e.Line, by = blame(reports)
	for _, i := range by {
		e.By = append(e.By, failed[i].id)
	}
	slices.Sort(e.By)
	return e
}

// exitOf describes how a worker that failed ended.
func exitOf(rk *rank) Exit {
	x := Exit{Index: rk.id, Err: rk.err, Report: rk.report.get()}
	x.Code, x.Signal = exitStatus(rk.err)
	return x
}

// exitStatus returns a process's exit status, or -1 and the signal that
// killed it.
func exitStatus(err error) (int, syscall.Signal) {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return -1, 0
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return -1, ws.Signal()
	}
	return ee.ExitCode(), 0
}

// log returns the launcher's logger for lines about worker i.
func (o Options) log(i int) *zerolog.Logger {
	ctx := o.Logger.With().Int("worker", i)
	if i < len(o.IDs) {
		ctx = ctx.Str("id", o.IDs[i])
	}
	l := ctx.Logger()
	return &l
}

// start starts worker r with env, and a goroutine that waits for it
// and reports its exit on j.exits.
func (j *job) start(r int, env []string) (*rank, error) {
	o := j.o
	rk := &rank{id: r, exited: make(chan struct{})}
	prefix := []byte(fmt.Sprintf("[%d] ", r))
	var outW, errW io.Writer = j.stdout, j.stderr
	if o.LogDir != "" {
		mode := os.O_TRUNC
		if j.latest[r] != nil {
			mode = os.O_APPEND // a restart: keep what the earlier process said
		}
		f, err := os.OpenFile(filepath.Join(o.LogDir, fmt.Sprintf("rank-%d.log", r)), os.O_WRONLY|os.O_CREATE|mode, 0o644)
		if err != nil {
			return nil, fmt.Errorf("launch: worker [%d] log: %w", r, err)
		}
		rk.file = f
	}
	po := &prefixWriter{prefix: prefix, out: outW}
	if o.TakeLine != nil {
		po.take = func(line []byte) bool { return o.TakeLine(r, line) }
	}
	pe := &prefixWriter{prefix: prefix, out: errW, seen: rk.report.add}
	rk.outs = []*prefixWriter{po, pe}
	argv := make([]string, len(o.Argv))
	for k, a := range o.Argv {
		argv[k] = strings.ReplaceAll(a, IndexPlaceholder, strconv.Itoa(r))
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = io.Writer(po), io.Writer(pe)
	if rk.file != nil {
		cmd.Stdout, cmd.Stderr = io.MultiWriter(po, rk.file), io.MultiWriter(pe, rk.file)
	}
	// Its own process group, so stopping a worker also stops what it started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// A grandchild that keeps the output pipes open must not hold Wait.
	cmd.WaitDelay = o.Grace
	if err := cmd.Start(); err != nil {
		if rk.file != nil {
			rk.file.Close()
		}
		return nil, fmt.Errorf("launch: start worker [%d]: %w", r, err)
	}
	o.log(r).Debug().Int("pid", cmd.Process.Pid).Int("restart", j.restarts[r]).Msg("worker started")
	rk.cmd = cmd
	j.all = append(j.all, rk)
	j.latest[r] = rk
	j.waiters.Go(func() {
		rk.err = rk.cmd.Wait()
		for _, w := range rk.outs {
			w.Flush()
		}
		if rk.file != nil {
			rk.file.Close()
		}
		close(rk.exited)
		j.exits <- rk
	})
	return rk, nil
}

// stop sends SIGTERM to every running worker's process group, waits up to
// grace for them to exit, then sends SIGKILL to those left.
func stop(ranks []*rank, grace time.Duration, log zerolog.Logger) {
	signalAll := func(sig syscall.Signal) {
		for _, rk := range ranks {
			select {
			case <-rk.exited:
			default:
				syscall.Kill(-rk.cmd.Process.Pid, sig)
			}
		}
	}
	signalAll(syscall.SIGTERM)
	deadline := time.After(grace)
	for _, rk := range ranks {
		select {
		case <-rk.exited:
		case <-deadline:
			log.Warn().Dur("grace", grace).Msg("workers still running after SIGTERM; killing them")
			signalAll(syscall.SIGKILL)
			return
		}
	}
}
