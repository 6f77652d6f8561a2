// Package prof writes the Go runtime's own profiles of one process: a CPU
// profile, a blocking profile and an execution trace. The execution trace
// is the one that shows scheduler delays (a goroutine runnable but not
// running), which is where small collectives lose their time on a busy
// machine; the CPU profile cannot show time nothing ran.
package prof

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"strconv"

	"github.com/gyre-ml/gyre/internal/ownfile"
)

// Environment variables that carry the files to a launched worker.
const (
	EnvCPU   = "GYRE_CPU_PROFILE"
	EnvBlock = "GYRE_BLOCK_PROFILE"
	EnvTrace = "GYRE_EXEC_TRACE"
)

// Files names the profiles to write; an empty name writes none.
type Files struct {
	CPU   string // pprof CPU profile
	Block string // pprof blocking profile, every blocking event recorded
	Trace string // runtime/trace execution trace
}

// Any reports whether any profile is asked for.
func (f Files) Any() bool { return f.CPU != "" || f.Block != "" || f.Trace != "" }

// FromEnv fills the names left empty from the environment.
func (f Files) FromEnv(lookup func(string) (string, bool)) Files {
	for _, p := range []struct {
		dst *string
		env string
	}{{&f.CPU, EnvCPU}, {&f.Block, EnvBlock}, {&f.Trace, EnvTrace}} {
		if v, ok := lookup(p.env); ok && *p.dst == "" {
			*p.dst = v
		}
	}
	return f
}

// WorkerEnv returns the environment that makes launched worker i write
// its profiles to these names with the suffix ".i", so that workers on one
// machine do not overwrite each other's.
func (f Files) WorkerEnv(i int) []string {
	var env []string
	for _, p := range []struct{ name, env string }{{f.CPU, EnvCPU}, {f.Block, EnvBlock}, {f.Trace, EnvTrace}} {
		if p.name != "" {
			env = append(env, p.env+"="+p.name+"."+strconv.Itoa(i))
		}
	}
	return env
}

// Start starts the profiles f asks for. The returned stop writes them
// out and must be called before the process exits; it is safe to call
// when Start failed or asked for nothing.
func Start(f Files) (stop func() error, err error) {
	var stops []func() error
	stopAll := func() error {
		var errs []error
		for i := len(stops) - 1; i >= 0; i-- {
			errs = append(errs, stops[i]())
		}
		stops = nil
		return errors.Join(errs...)
	}
	fail := func(what string, e error) (func() error, error) {
		return func() error { return nil }, errors.Join(fmt.Errorf("prof: %s: %w", what, e), stopAll())
	}
	if f.CPU != "" {
		out, err := ownfile.Create(f.CPU)
		if err != nil {
			return fail("cpu profile", err)
		}
		if err := pprof.StartCPUProfile(out); err != nil {
			out.Close()
			return fail("cpu profile", err)
		}
		stops = append(stops, func() error { pprof.StopCPUProfile(); return out.Close() })
	}
	if f.Trace != "" {
		out, err := ownfile.Create(f.Trace)
		if err != nil {
			return fail("execution trace", err)
		}
		if err := trace.Start(out); err != nil {
			out.Close()
			return fail("execution trace", err)
		}
		stops = append(stops, func() error { trace.Stop(); return out.Close() })
	}
	if f.Block != "" {
		// Create the file now, so that a bad path fails at start, not after the run.
		out, err := ownfile.Create(f.Block)
		if err != nil {
			return fail("block profile", err)
		}
		runtime.SetBlockProfileRate(1)
		stops = append(stops, func() error {
			err := pprof.Lookup("block").WriteTo(out, 0)
			runtime.SetBlockProfileRate(0)
			return errors.Join(err, out.Close())
		})
	}
	return stopAll, nil
}
