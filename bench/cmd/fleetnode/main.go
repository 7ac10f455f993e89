// Command fleetnode runs the processes of a simulated fleet (package bench/fleet): `fleetnode
// coordinator` is `coordinator serve --workers 0` on an external NATS with the fleet's scene kind
// registered, and `fleetnode workers --count N` hosts N workers of the real worker code rendering
// that kind. farmbench's fleet step starts them; see docs/benchmarks.md, "Fleet".
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/tilefarm/tilefarm/bench/fleet"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: fleetnode coordinator|workers [flags]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "coordinator":
		err = coordinator(ctx, args)
	case "workers":
		err = workers(ctx, args)
	default:
		fmt.Fprintf(os.Stderr, "fleetnode: unknown command %q: want coordinator or workers\n", cmd)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleetnode:", err)
		os.Exit(1)
	}
}

func coordinator(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("coordinator", flag.ExitOnError)
	var c fleet.CoordinatorConfig
	fs.StringVar(&c.NATS, "nats", "", "NATS servers' URLs, comma-separated")
	fs.StringVar(&c.Store, "store", "", "object store URL")
	fs.StringVar(&c.Data, "data", "", "directory of the coordinator database")
	fs.StringVar(&c.Listen, "listen", "127.0.0.1:7070", "HTTP API and /metrics address")
	fs.StringVar(&c.Debug, "debug-listen", "", "serve /debug/pprof/ on this address")
	fs.IntVar(&c.Replicas, "replicas", 1, "replicas of every stream and bucket")
	level := fs.String("log-level", "warn", "log level")
	_ = fs.Parse(args)
	log, err := logger(*level)
	if err != nil {
		return err
	}
	c.Log = log
	c.Ready = func(addr string) { fmt.Fprintf(os.Stderr, "fleetnode: coordinator serving on %s\n", addr) }
	return fleet.RunCoordinator(ctx, c)
}

func workers(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("workers", flag.ExitOnError)
	var c fleet.HostConfig
	fs.StringVar(&c.NATS, "nats", "", "NATS servers' URLs, comma-separated")
	fs.StringVar(&c.Store, "store", "", "object store URL")
	fs.StringVar(&c.Dir, "dir", "", "directory of the process's checkpoint database")
	fs.IntVar(&c.Count, "count", 1, "workers in this process")
	fs.StringVar(&c.NamePrefix, "name-prefix", "fleet-", "worker i is named PREFIX + i")
	fs.StringVar(&c.Listen, "listen", "127.0.0.1:0", "HTTP address of /metrics and /dispatch")
	fs.IntVar(&c.Passes, "passes", 0, "passes a tile's samples are split into (0: the worker's default)")
	fs.DurationVar(&c.CheckpointEvery, "checkpoint-every", time.Hour, "minimum time between local checkpoints (0: the worker's automatic cadence)")
	fs.BoolVar(&c.SharedConn, "shared-conn", false, "one NATS connection for every worker of the process")
	level := fs.String("log-level", "warn", "the workers' log level")
	_ = fs.Parse(args)
	log, err := logger(*level)
	if err != nil {
		return err
	}
	c.Log = log
	c.Ready = func(addr string) { fmt.Fprintf(os.Stderr, "fleetnode: %d workers running, http %s\n", c.Count, addr) }
	return fleet.RunHost(ctx, c)
}

func logger(level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: %w", level, err)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})), nil
}
