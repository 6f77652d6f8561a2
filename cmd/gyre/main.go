package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCmd(osEnv()).ExecuteContext(ctx)
	stop()
	if err != nil {
		os.Exit(1)
	}
}
