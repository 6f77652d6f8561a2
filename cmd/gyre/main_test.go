package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/gyretest"
	"github.com/gyre-ml/gyre/internal/syncio"
)

// asCLI in the environment makes the test binary act as the gyre command,
// so `bench transport` can start it as its peer. The name avoids the GYRE_
// prefix, which the parent strips from its child's environment.
const asCLI = "BE_GYRE_CLI"

func TestMain(m *testing.M) {
	if os.Getenv(asCLI) == "1" {
		main()
		os.Exit(0)
	}
	gyretest.Main(m)
}

// testEnv is the process environment plus vars; the executable is this
// test binary, told to act as the command.
func testEnv(vars map[string]string) env {
	return env{
		lookup: func(k string) (string, bool) {
			if v, ok := vars[k]; ok {
				return v, true
			}
			return os.LookupEnv(k)
		},
		environ: func() []string {
			env := append(os.Environ(), asCLI+"=1")
			for k, v := range vars {
				env = append(env, k+"="+v)
			}
			return env
		},
		executable: os.Executable,
	}
}

// plainEnv is testEnv, but the workers it starts run a plain build of
// gyre, as the integration tests' do, not this race-instrumented test
// binary: for the tests that run many jobs, each of which took seconds
// to start under the race detector. The launching command still runs in
// this process, and one job of each kind still runs instrumented
// workers (testEnv).
func plainEnv(t *testing.T, vars map[string]string) env {
	e := testEnv(vars)
	bin := gyretest.Gyre(t)
	e.executable = func() (string, error) { return bin, nil }
	return e
}

// run executes the command line args in-process and returns its stdout,
// stderr and error.
func run(t *testing.T, e env, args ...string) (string, string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	root := newRootCmd(e)
	root.SetArgs(args)
	// Serialised, as writes to a file are: launch's own log lines and its
	// workers' copied output share stderr.
	root.SetOut(syncio.NewWriter(&out))
	root.SetErr(syncio.NewWriter(&errb))
	root.SetIn(bytes.NewReader(nil))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := root.ExecuteContext(ctx)
	return out.String(), errb.String(), err
}

// TestExitCode: a worker that lost its quorum exits with
// gyre.ExitNoQuorum, however its error is wrapped, so that gyre launch
// stops the job; other errors keep the status they carry, or 1.
func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{fmt.Errorf("train: %w", gyre.ErrNoQuorum), gyre.ExitNoQuorum},
		{errors.Join(errors.New("closing"), fmt.Errorf("boundary: %w", gyre.ErrNoQuorum)), gyre.ExitNoQuorum},
		{&exitError{code: 137, err: errors.New("worker [3] failed first")}, 137},
		{errors.New("gyre: lost rank 2"), 1},
	} {
		if got := exitCode(tc.err); got != tc.want {
			t.Errorf("exitCode(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
	if gyre.ExitNoQuorum != 75 {
		t.Errorf("gyre.ExitNoQuorum = %d; docs/cli.md and gyre launch --help say 75", gyre.ExitNoQuorum)
	}
}
