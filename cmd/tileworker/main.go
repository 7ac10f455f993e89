// Command tileworker is thin: it wires signals to a context and hands the arguments to internal/cli.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/tilefarm/tilefarm/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Tileworker(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
