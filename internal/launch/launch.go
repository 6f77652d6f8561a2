package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/syncio"
)

// DefaultGrace is how long ranks get to exit after SIGTERM before SIGKILL.
const DefaultGrace = 5 * time.Second

// Options describe one local job.
type Options struct {
	// N is the number of ranks, at least 1.
	N int
	// Argv is the program and its arguments, run once per rank.
	Argv []string
	// Env returns the whole environment of rank r.
	Env func(rank int) []string
	// Stdout and Stderr receive every rank's output, each line prefixed
	// with "[r] ".
	Stdout, Stderr io.Writer
	// LogDir, if set, also receives each rank's stdout and stderr, without
	// prefixes, in LogDir/rank-<r>.log.
	LogDir string
	// Grace is how long ranks get to exit after SIGTERM. Default DefaultGrace.
	Grace time.Duration
	// Logger receives the launcher's own events.
	Logger zerolog.Logger
}

// RankError reports the first rank that failed. The other ranks were
// stopped because of it.
type RankError struct {
	Rank int
	Code int // exit status, or -1 if the rank was killed by a signal
	Err  error
}

func (e *RankError) Error() string {
	return fmt.Sprintf("rank %d failed: %v", e.Rank, e.Err)
}

func (e *RankError) Unwrap() error { return e.Err }

// ExitCode is the status `gyre launch` exits with: the failed rank's own
// status, as mpirun does, or 1 when a signal ended it.
func (e *RankError) ExitCode() int {
	if e.Code > 0 {
		return e.Code
	}
	return 1
}

type rank struct {
	id     int
	cmd    *exec.Cmd
	outs   []*prefixWriter
	file   *os.File
	exited chan struct{}
	err    error
}

// Run starts the ranks and waits for them. It returns nil when every rank
// exits with status 0, a *RankError naming the first rank that failed
// (after stopping the others), or ctx's error if ctx ended first (after
// stopping every rank). Run never leaves a rank running.
func Run(ctx context.Context, o Options) error {
	if o.N < 1 {
		return fmt.Errorf("launch: need at least 1 rank, got %d", o.N)
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
	// Whole writes, so that lines from different ranks never interleave.
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
	}
	defer started.Wait()
	for range o.N {
		select {
		case rk := <-exits:
			if rk.err == nil {
				o.Logger.Debug().Int("rank", rk.id).Msg("rank exited")
				continue
			}
			code := -1
			var ee *exec.ExitError
			if errors.As(rk.err, &ee) {
				code = ee.ExitCode()
			}
			o.Logger.Error().Int("rank", rk.id).Int("status", code).Msg("rank failed; stopping the others")
			stopAll()
			return &RankError{Rank: rk.id, Code: code, Err: rk.err}
		case <-ctx.Done():
			o.Logger.Warn().Msg("interrupted; stopping every rank")
			stopAll()
			return ctx.Err()
		}
	}
	return nil
}

func start(r int, o Options, stdout, stderr io.Writer) (*rank, error) {
	rk := &rank{id: r, exited: make(chan struct{})}
	prefix := []byte(fmt.Sprintf("[%d] ", r))
	var outW, errW io.Writer = stdout, stderr
	if o.LogDir != "" {
		f, err := os.OpenFile(filepath.Join(o.LogDir, fmt.Sprintf("rank-%d.log", r)), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return nil, fmt.Errorf("launch: rank %d log: %w", r, err)
		}
		rk.file = f
	}
	po := &prefixWriter{prefix: prefix, out: outW}
	pe := &prefixWriter{prefix: prefix, out: errW}
	rk.outs = []*prefixWriter{po, pe}
	cmd := exec.Command(o.Argv[0], o.Argv[1:]...)
	cmd.Env = o.Env(r)
	cmd.Stdout, cmd.Stderr = io.Writer(po), io.Writer(pe)
	if rk.file != nil {
		cmd.Stdout, cmd.Stderr = io.MultiWriter(po, rk.file), io.MultiWriter(pe, rk.file)
	}
	// Its own process group, so stopping a rank also stops what it started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// A grandchild that keeps the output pipes open must not hold Wait.
	cmd.WaitDelay = o.Grace
	if err := cmd.Start(); err != nil {
		if rk.file != nil {
			rk.file.Close()
		}
		return nil, fmt.Errorf("launch: start rank %d: %w", r, err)
	}
	o.Logger.Debug().Int("rank", r).Int("pid", cmd.Process.Pid).Msg("rank started")
	rk.cmd = cmd
	return rk, nil
}

// stop sends SIGTERM to every running rank's process group, waits up to
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
			log.Warn().Dur("grace", grace).Msg("ranks still running after SIGTERM; killing them")
			signalAll(syscall.SIGKILL)
			return
		}
	}
}
