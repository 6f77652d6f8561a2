package main

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/gyre-ml/gyre"
)

func main() {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go onSignals(sigs, cancel)
	c := &cli{env: osEnv()}
	err := newRoot(c).ExecuteContext(ctx)
	err = errors.Join(err, c.stopProfiles())
	signal.Stop(sigs)
	cancel()
	if err != nil {
		os.Exit(exitCode(err))
	}
}

// exitCode is the status the gyre command exits with after err:
// gyre.ExitNoQuorum when its worker lost its quorum, which gyre launch
// takes as the end of the job, even if err carries a status too; else
// the status err carries (gyre launch's); else 1.
func exitCode(err error) int {
	var coded interface{ ExitCode() int }
	switch {
	case errors.Is(err, gyre.ErrNoQuorum):
		return gyre.ExitNoQuorum
	case errors.As(err, &coded):
		return coded.ExitCode()
	}
	return 1
}

// graceful is what the first SIGTERM or interrupt does while a worker
// runs: ask it to leave at the next boundary (Worker.RequestLeave), so
// that its peers carry on. With none set, or at the second signal, the
// command's context is cancelled at once.
var graceful struct {
	mu sync.Mutex
	fn func()
}

// setGraceful sets the first signal's action; nil restores cancelling.
func setGraceful(fn func()) {
	graceful.mu.Lock()
	graceful.fn = fn
	graceful.mu.Unlock()
}

func onSignals(sigs <-chan os.Signal, cancel context.CancelFunc) {
	first := true
	for range sigs {
		graceful.mu.Lock()
		fn := graceful.fn
		graceful.mu.Unlock()
		if first && fn != nil {
			first = false
			fn()
			continue
		}
		cancel()
	}
}
