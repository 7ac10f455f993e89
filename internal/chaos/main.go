//go:build unix

// Command chaos runs a real farm as separate processes (NATS single or a 3-node cluster, MinIO
// single or a 4-node cluster, a coordinator, several tileworkers) and injects faults while
// jobs render: kills of workers at every seam of the Render and Finalize flows, a worker frozen
// past its lease, kills of the coordinator while it accepts, dispatches and applies, restarts
// of NATS nodes and MinIO nodes, outages of storage and NATS, and a seeded random schedule of
// all of them. Each scenario checks that its fault hit work in progress (else it is invalid),
// then that every frame completed and equals the local reference pixel for pixel, that every
// tile and frame has its manifest, that nothing conflicted or was dead-lettered, and that a
// worker killed mid-tile had its samples recovered. It prints one row per scenario and exits
// non-zero on any loss or difference.
//
//	go run ./internal/chaos --seed 7              the CI schedule, then a random one
//	go run ./internal/chaos --seed 7 --soak 30m   random faults for half an hour
//
// It needs the nats-server and MinIO binaries the test command builds ($TILEFARM_NATS_SERVER,
// $TILEFARM_MINIO) and builds the farm's own binaries itself.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

// run is the command, returning its exit code: 0 every scenario passed, 1 a loss or a
// difference, 2 a usage error.
func run(args []string) int {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	seed := fs.Uint64("seed", 1, "seed of the random schedule")
	soak := fs.Duration("soak", 0, "run random faults for this long instead of the CI schedule's short random run")
	only := fs.String("only", "", "run only the scenarios whose name contains this")
	outage := fs.Duration("outage", 20*time.Second, "how long storage and NATS outages last")
	jsonOut := fs.Bool("json", false, "print the rows as JSON too")
	keep := fs.Bool("keep", false, "keep the work directory (logs, data) afterwards")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := os.MkdirTemp("", "tilefarm-chaos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 1
	}
	if *keep {
		fmt.Fprintln(os.Stderr, "chaos: work directory", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	rows, err := runSchedule(ctx, config{dir: dir, seed: *seed, soak: *soak, only: *only, outage: *outage, log: os.Stderr})
	printTable(os.Stdout, rows)
	if *jsonOut {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rows)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 1
	}
	for _, r := range rows {
		if !r.OK {
			return 1
		}
	}
	return 0
}
