package main

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCmd(osEnv()).ExecuteContext(ctx)
	stop()
	var coded interface{ ExitCode() int }
	switch {
	case errors.As(err, &coded):
		os.Exit(coded.ExitCode())
	case err != nil:
		os.Exit(1)
	}
}
