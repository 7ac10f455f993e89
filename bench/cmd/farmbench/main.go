// Command farmbench starts real farms of separate processes on this machine and reports how
// they compare with local rendering: `go run ./bench/cmd/farmbench [--json]`. See
// docs/benchmarks.md for what each figure means.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tilefarm/tilefarm/bench/farmbench"
)

func main() {
	c := farmbench.Default()
	asJSON := flag.Bool("json", false, "print one JSON object with every figure")
	flag.IntVar(&c.Workers, "workers", c.Workers, "tileworker processes")
	flag.IntVar(&c.Slots, "slots", c.Slots, "--concurrency of each tileworker")
	flag.BoolVar(&c.MinIO, "minio", c.MinIO, "keep objects in a MinIO process ($TILEFARM_MINIO), as a real farm does; --minio=false uses the coordinator's file store")
	flag.IntVar(&c.Shot.Last, "frames", c.Shot.Last, "frames 1-N of the realistic shot")
	flag.IntVar(&c.Shot.Width, "width", c.Shot.Width, "width of the realistic shot")
	flag.IntVar(&c.Shot.Height, "height", c.Shot.Height, "height of the realistic shot")
	flag.IntVar(&c.Shot.SPP, "spp", c.Shot.SPP, "samples per pixel of the realistic shot")
	flag.IntVar(&c.Shot.TileSize, "tile", c.Shot.TileSize, "tile size of the realistic shot")
	flag.IntVar(&c.SmallFrames, "small-frames", c.SmallFrames, "frames 1-N of the example as it ships")
	flag.IntVar(&c.Overhead.Last, "overhead-frames", c.Overhead.Last, "frames of the tiny-tile overhead job")
	flag.IntVar(&c.Overhead.TileSize, "overhead-tile", c.Overhead.TileSize, "tile size of the overhead job")
	flag.IntVar(&c.DispatchFrames, "dispatch-frames", c.DispatchFrames, "frames of the 1920x1080 dispatch shot (510 tiles each)")
	flag.IntVar(&c.RecoveryReps, "recovery-reps", c.RecoveryReps, "worker kills measured for recovery")
	serve := flag.String("recovery-serve-args", "", "extra coordinator serve flags of the recovery farm, space-separated (e.g. \"--ack-wait 3s --lease-ttl 3s\")")
	flag.IntVar(&c.ResumeKills, "resume-kills", c.ResumeKills, "kills of the resume schedule")
	flag.IntVar(&c.ResumeFrames, "resume-frames", c.ResumeFrames, "frames of the resume job (6 tiles each)")
	flag.Float64Var(&c.ResumeTileSeconds, "resume-tile-seconds", c.ResumeTileSeconds, "render time of each tile of the resume job, in seconds")
	flag.Uint64Var(&c.Seed, "seed", c.Seed, "seed of the kill schedule")
	flag.IntVar(&c.RSSTiles, "rss-tiles", 0, "also track a job of this many tiles on coordinator serve --workers 0 (e.g. 1000000)")
	flag.BoolVar(&c.Growth, "growth", false, "also measure the key figures at three sizes of tiles per frame, frames per job and workers")
	flag.StringVar(&c.ProfileDir, "profile", "", "write CPU profiles of the overhead farm's coordinator and first worker, and of each fleet's coordinator and nats-server nodes, to this directory")
	flag.DurationVar(&c.ProfileDuration, "profile-seconds", 5*time.Second, "length of the CPU profiles")
	sizes := flag.String("fleet", "", "also measure a simulated fleet of each of these numbers of workers, comma-separated (default 10,100,1000 with --only fleet)")
	flag.Float64Var(&c.Fleet.TileSeconds, "fleet-tile-seconds", 1, "each simulated tile's render time")
	flag.Float64Var(&c.Fleet.WorkSeconds, "fleet-work-seconds", 30, "each simulated worker's share of the fleet's job, in seconds of tiles")
	flag.IntVar(&c.Fleet.Passes, "fleet-passes", 0, "passes a simulated tile is rendered in (0: the worker's default, 32)")
	flag.IntVar(&c.Fleet.PerProcess, "fleet-per-process", 250, "simulated workers per process")
	flag.BoolVar(&c.Fleet.Cluster, "fleet-cluster", false, "run the fleet on a 3-node JetStream cluster (replicas 3) instead of one nats-server")
	flag.BoolVar(&c.Fleet.SharedConn, "fleet-shared-conn", false, "one NATS connection per worker process instead of one per simulated worker")
	flag.IntVar(&c.Fleet.Nice, "fleet-nice", 10, "niceness of the simulated workers' processes, so they take only the CPU the coordinator and JetStream leave (-1: none)")
	monitor := flag.Bool("monitor", false, "also measure the coordinator's CPU with the web monitor open in headless Chromium ($TILEFARM_CHROMIUM) against closed")
	load := farmbench.DefaultMonitorLoad()
	flag.IntVar(&load.Jobs, "monitor-jobs", load.Jobs, "jobs of the monitor step")
	flag.IntVar(&load.Frames, "monitor-frames", load.Frames, "frames of each job of the monitor step")
	flag.IntVar(&load.Rate, "monitor-rate", load.Rate, "tile events a second of the monitor step")
	flag.DurationVar(&load.Window, "monitor-window", load.Window, "each window of the monitor step")
	flag.IntVar(&load.Rounds, "monitor-rounds", load.Rounds, "rounds of the monitor step (each a window closed, with the jobs view, with a job's page)")
	verbose := flag.Bool("v", false, "log progress on stderr")
	only := flag.String("only", "", "comma-separated measurements to make, of "+strings.Join(farmbench.Steps, ",")+" (default: all; the others' figures stay 0)")
	flag.Parse()
	if *only != "" {
		c.Only = strings.Split(*only, ",")
		for _, s := range c.Only {
			if !slices.Contains(farmbench.Steps, s) {
				fmt.Fprintf(os.Stderr, "farmbench: --only %q: want some of %s\n", s, strings.Join(farmbench.Steps, ","))
				os.Exit(2)
			}
		}
	}
	if *monitor || slices.Contains(c.Only, "monitor") {
		load.ProfileDir = c.ProfileDir
		c.Monitor = load
	}
	if *sizes == "" && slices.Contains(c.Only, "fleet") {
		*sizes = "10,100,1000"
	}
	for _, f := range strings.Split(*sizes, ",") {
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "farmbench: --fleet %q: want positive numbers of workers, comma-separated\n", *sizes)
			os.Exit(2)
		}
		c.Fleet.Sizes = append(c.Fleet.Sizes, n)
	}
	c.Overhead.First = 1
	if *serve != "" {
		c.RecoveryServe = strings.Fields(*serve)
	}
	if *verbose {
		c.Log = os.Stderr
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	res, err := farmbench.Run(ctx, c)
	if err != nil {
		fmt.Fprintln(os.Stderr, "farmbench:", err)
		os.Exit(1)
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			fmt.Fprintln(os.Stderr, "farmbench:", err)
			os.Exit(1)
		}
		return
	}
	res.Table(os.Stdout)
}
