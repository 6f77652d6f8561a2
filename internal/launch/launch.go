package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/syncio"
)

// DefaultGrace is how long, after a worker fails, the others get to exit
// on their own and report, and then how long they get to exit after
// SIGTERM before SIGKILL.
const DefaultGrace = 5 * time.Second

// Options describe one local job.
type Options struct {
	// N is the number of workers, at least 1.
	N int
	// Argv is the program and its arguments, run once per worker.
	Argv []string
	// Env returns the whole environment of the worker of launch index i.
	Env func(i int) []string
	// Stdout and Stderr receive every worker's output, each line prefixed
	// with "[i] ", its launch index. (The index is fixed; a worker's rank
	// in the job may change with the view.)
	Stdout, Stderr io.Writer
	// LogDir, if set, also receives each worker's stdout and stderr,
	// without prefixes, in LogDir/rank-<i>.log.
	LogDir string
	// Grace is how long, after the first failure, the other workers get
	// to exit on their own and report it, and then how long they get to
	// exit after SIGTERM. Default DefaultGrace.
	Grace time.Duration
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
}

// RankError reports a failed job: the first worker that failed, and the
// rank the failed workers' reports name, if they agree on one. The workers
// still running were stopped because of it.
type RankError struct {
	// Index is the launch index of the first worker that failed.
	Index int
	// Code is its exit status, -1 if a signal killed it; Signal is that
	// signal.
	Code   int
	Signal syscall.Signal
	Err    error
	// Named is the rank in the job that the reports of the workers that
	// failed name (the lost rank of "lost rank 3", the odd rank of a
	// divergence), -1 if they name none or disagree. Line is a report line
	// naming it, and By the launch indexes of the workers that named it,
	// ascending.
	Named int
	Line  string
	By    []int
	// Report is the first failed worker's own report, if it left one.
	Report []string
}

func (e *RankError) Error() string {
	if e.Named >= 0 {
		reports := "the reports of %s name"
		if len(e.By) == 1 {
			reports = "the report of %s names"
		}
		return fmt.Sprintf(reports+" rank %d: %s; %s failed first, %s",
			workers(e.By), e.Named, e.Line, workers([]int{e.Index}), e.status())
	}
	msg := fmt.Sprintf("%s failed first, %s", workers([]int{e.Index}), e.status())
	if len(e.Report) > 0 {
		msg += ": " + strings.TrimSpace(strings.TrimPrefix(e.Report[0], "Error:"))
	}
	return msg
}

func (e *RankError) Unwrap() error { return e.Err }

// ExitCode is the status `gyre launch` exits with: the first failed
// worker's own status, as mpirun does, or 128+signal when a signal killed
// it, as shells do; 1 if neither is known.
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

// Run starts the workers and waits for them. It returns nil when every
// worker exits with status 0, or ctx's error if ctx ended first (after
// stopping every worker). When a worker fails, the others get o.Grace to
// exit on their own and report; then those left are stopped, and Run
// returns a *RankError naming the first failure and the rank the reports
// name. Run never leaves a worker running.
func Run(ctx context.Context, o Options) error {
	if o.N < 1 {
		return fmt.Errorf("launch: need at least 1 worker, got %d", o.N)
	}
	if len(o.Argv) == 0 {
		return errors.New("launch: no command to run")
	}
	if o.Grace <= 0 {
		o.Grace = DefaultGrace
	}
	if o.LogDir != "" {
		if err := os.MkdirAll(o.LogDir, 0o755); err != nil {
			return fmt.Errorf("launch: log dir: %w", err)
		}
	}
	// Whole writes, so that lines from different workers never interleave.
	stdout, stderr := syncio.NewWriter(o.Stdout), syncio.NewWriter(o.Stderr)
	ranks := make([]*rank, 0, o.N)
	exits := make(chan *rank, o.N)
	var started sync.WaitGroup
	stopAll := func() { stop(ranks, o.Grace, o.Logger) }
	for r := range o.N {
		rk, err := start(r, o, stdout, stderr)
		if err != nil {
			stopAll()
			return err
		}
		ranks = append(ranks, rk)
		started.Go(func() {
			rk.err = rk.cmd.Wait()
			for _, w := range rk.outs {
				w.Flush()
			}
			if rk.file != nil {
				rk.file.Close()
			}
			close(rk.exited)
			exits <- rk
		})
		if r == 0 && o.FirstReady != nil {
			waitFirst(ctx, o, rk)
		}
	}
	defer started.Wait()
	failed, err := wait(ctx, o, exits)
	if err != nil || len(failed) > 0 {
		stopAll()
	}
	if len(failed) > 0 {
		return failure(failed)
	}
	return err
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

// wait collects the workers' exits. After the first failure it waits
// o.Grace more for the others, so that they report what they saw, and
// returns the workers that failed by then, in the order they exited.
func wait(ctx context.Context, o Options, exits <-chan *rank) ([]*rank, error) {
	var (
		failed   []*rank
		deadline <-chan time.Time
	)
	for range o.N {
		select {
		case rk := <-exits:
			if rk.err == nil {
				o.log(rk.id).Debug().Msg("worker exited")
				continue
			}
			failed = append(failed, rk)
			if deadline == nil {
				o.log(rk.id).Error().Err(rk.err).Dur("grace", o.Grace).Msg("worker failed; the others have the grace period to report")
				deadline = time.After(o.Grace)
			}
		case <-deadline:
			return failed, nil
		case <-ctx.Done():
			if len(failed) == 0 {
				o.Logger.Warn().Msg("interrupted; stopping every worker")
			}
			return failed, ctx.Err()
		}
	}
	return failed, nil
}

// failure builds the job's error from the workers that failed.
func failure(failed []*rank) *RankError {
	first := failed[0]
	e := &RankError{Index: first.id, Err: first.err, Report: first.report.get()}
	e.Code, e.Signal = exitStatus(first.err)
	reports := make([][]string, len(failed))
	for i, rk := range failed {
		reports[i] = rk.report.get()
	}
	var by []int
	e.Named, e.Line, by = blame(reports)
	for _, i := range by {
		e.By = append(e.By, failed[i].id)
	}
	slices.Sort(e.By)
	return e
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

func start(r int, o Options, stdout, stderr io.Writer) (*rank, error) {
	rk := &rank{id: r, exited: make(chan struct{})}
	prefix := []byte(fmt.Sprintf("[%d] ", r))
	var outW, errW io.Writer = stdout, stderr
	if o.LogDir != "" {
		f, err := os.OpenFile(filepath.Join(o.LogDir, fmt.Sprintf("rank-%d.log", r)), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return nil, fmt.Errorf("launch: worker [%d] log: %w", r, err)
		}
		rk.file = f
	}
	po := &prefixWriter{prefix: prefix, out: outW}
	pe := &prefixWriter{prefix: prefix, out: errW, seen: rk.report.add}
	rk.outs = []*prefixWriter{po, pe}
	cmd := exec.Command(o.Argv[0], o.Argv[1:]...)
	cmd.Env = o.Env(r)
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
	o.log(r).Debug().Int("pid", cmd.Process.Pid).Msg("worker started")
	rk.cmd = cmd
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
