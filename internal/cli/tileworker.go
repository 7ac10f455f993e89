package cli

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/client"
	"github.com/tilefarm/tilefarm/internal/content"
	"github.com/tilefarm/tilefarm/internal/faults"
	"github.com/tilefarm/tilefarm/internal/kinds"
	"github.com/tilefarm/tilefarm/internal/node"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/internal/worker"
)

// Tileworker runs the tileworker command with args (without the program name).
func Tileworker(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	p := &program{ctx: ctx, stdout: stdout, stderr: stderr}
	return p.execute(p.tileworkerRoot(), args)
}

// tileworkerRoot is the worker daemon, with the local reference render as a subcommand.
func (p *program) tileworkerRoot() *cobra.Command {
	c := newCommand("tileworker [--nats URL] [--store URL] [--checkpoints DIR] [--concurrency N]", "tilefarm's render worker", `
Run a worker daemon: take tile and assemble jobs from the farm's JetStream consumer, render them
with checkpoints, and publish results through the object store. The farm's ack-wait, lease TTL
and MaxDeliver are read from the server the coordinator set up. On SIGTERM in-flight tiles are
checkpointed and handed back at once. S3 credentials come from AWS_ACCESS_KEY_ID and
AWS_SECRET_ACCESS_KEY. Also: 'tileworker render' renders a frame locally (see 'tileworker render -h').`)
	c.PersistentFlags().StringVar(&p.logFormat, "log-format", os.Getenv(envLogFormat), "log format: text or json (default json unless stderr is a terminal; env "+envLogFormat+")")
	fs := c.Flags()
	nf := natsFlags(fs, "nats://127.0.0.1:4222")
	storeURL := fs.String("store", "", "object store: file:///DIR, s3://HOST:PORT/BUCKET or s3+http://HOST:PORT/BUCKET (required)")
	ckptDir := fs.String("checkpoints", ".tilefarm-worker", "directory for the local checkpoint database")
	concurrency := fs.Int("concurrency", runtime.NumCPU(), "tiles rendered at once")
	threads := addThreadsFlag(fs, "tile slot")
	name := fs.String("name", "", "worker name in logs, leases and events (default: host-random)")
	metricsListen := fs.String("metrics-listen", "", "serve /metrics on this address (e.g. 127.0.0.1:9101)")
	debugListen := fs.String("debug-listen", "", "serve Go profiles (/debug/pprof/) on this address (off by default; beyond loopback they need the API token, TILEFARM_API_TOKEN)")
	heartbeat := fs.Duration("heartbeat", 0, "heartbeat interval (default: min(ack-wait, lease TTL)/5)")
	var ckptEvery, remoteEvery checkpointInterval
	fs.Var(&ckptEvery, "checkpoint-every", "minimum time between checkpoints, saved in the background: auto (after a pass, keeping saves under 2% of the render's time and 4 MB/s), 0 (after every pass) or a duration")
	fs.Var(&remoteEvery, "remote-checkpoint-every", "minimum time between remote checkpoint uploads to the object store, from which any node resumes a tile: auto (at least 1 s apart and after the first second, so a short tile uploads none), 0 (with every checkpoint) or a duration")
	tags := fs.StringSlice("tags", nil, "the operator's tags of this worker (e.g. gpu,highmem): jobs submitted with --requires render only on workers with every tag they name")
	blocklist := fs.Int("blocklist-after", worker.DefaultBlocklistAfter, "failed tiles of one job after which this worker takes none of its tiles")
	ffmpeg := fs.String("ffmpeg", "", "the ffmpeg that encodes preview movies (default: $"+worker.EnvFFmpeg+", else ffmpeg on the PATH)")
	handOn := fs.Duration("hand-on-after", worker.DefaultHandOnAfter, "how long a tile waits in place for an unreachable object store or NATS before this worker hands it on to one that may reach them (tests run on a fast clock with less)")
	passes := fs.Int("passes", worker.DefaultPasses, "passes a JSON scene's tile samples are split into (checkpoint granularity: a kill loses at most one); Blender scenes fix theirs at submit")
	cacheSize := fs.String("cache-size", "100G", "scene files kept on this node by content (shared by every job and slot; least recently used evicted beyond it), e.g. 500G, 2T")
	shared := fs.StringArray("shared", nil, "a studio share as submitters name it and this node's mount of it, `ROOT=PATH` (e.g. /mnt/proj=/net/proj or 'S:\\proj=/mnt/proj'; repeatable): files submitted with --shared ROOT are read from PATH, verified against their hash")
	kf := kinds.AddFlags(fs, true)
	ff := faults.AddFlags(fs, faults.WorkerSeams)
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	p.runErr(c, noArgs, func(ctx context.Context, _ []string, stdout, stderr io.Writer) error {
		if *storeURL == "" {
			return usagef("--store is required: the object store the coordinator uses (file:///DIR or s3://HOST:PORT/BUCKET)")
		}
		if *handOn <= 0 {
			return usagef("--hand-on-after %v: want a positive duration", *handOn)
		}
		if *concurrency < 1 || *concurrency > 1024 {
			return usagef("--concurrency %d: want 1-1024", *concurrency)
		}
		limit, err := parseBytes(*cacheSize)
		if err != nil {
			return usagef("--cache-size %q: %v", *cacheSize, err)
		}
		var roots []content.SharedRoot
		for _, sh := range *shared {
			r, err := content.ParseSharedRoot(sh)
			if err != nil {
				return usagef("--shared: %v", err)
			}
			roots = append(roots, r)
		}
		workerTags, err := api.Tags(*tags)
		if err != nil {
			return usagef("--tags: %v", err)
		}
		log, err := newLogger(stderr, *logLevel, p.logFormat)
		if err != nil {
			return err
		}
		wc := worker.Config{Capabilities: queue.Capabilities{Tags: workerTags}, Name: *name, Concurrency: *concurrency, Heartbeat: *heartbeat, CheckpointEvery: ckptEvery.config(),
			RemoteEvery: remoteEvery.config(), PassesPerTile: *passes, BlocklistAfter: *blocklist, FFmpeg: *ffmpeg, HandOnAfter: *handOn}
		if wc.Faults, err = ff.Plan(func(seam string) { killSelf(log, "tileworker", seam) }); err != nil {
			return usagef("%v", err)
		}
		nthreads, err := threads.of(*concurrency)
		if err != nil {
			return err
		}
		ks := kf.Open(scene.Env{Dir: *ckptDir, Slots: *concurrency, Threads: nthreads, Log: log})
		defer ks.Close()
		return node.RunWorker(ctx, node.WorkerOptions{NATS: *nf, StoreURL: *storeURL, CheckpointDir: *ckptDir,
			MetricsListen: *metricsListen, DebugListen: *debugListen, DebugToken: os.Getenv(client.EnvToken), Worker: wc, Kinds: ks, Log: log,
			Scenes: worker.ScenesOptions{CacheLimit: limit, Shared: roots}})
	})
	c.AddCommand(p.localRenderCommand())
	return c
}

// parseBytes reads a size such as 512M, 100G or 2T (powers of 1024; a plain number is bytes).
func parseBytes(s string) (int64, error) {
	units := map[string]int64{"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
	num := strings.TrimRight(strings.ToUpper(strings.TrimSpace(s)), "IB")
	unit := ""
	if n := len(num); n > 0 && (num[n-1] < '0' || num[n-1] > '9') {
		num, unit = num[:n-1], num[n-1:]
	}
	mult, ok := units[unit]
	v, err := strconv.ParseInt(num, 10, 64)
	if !ok || err != nil || v <= 0 || v > math.MaxInt64/mult {
		return 0, fmt.Errorf("want a positive size such as 512M, 100G or 2T")
	}
	return v * mult, nil
}

// checkpointInterval is the value of --checkpoint-every and --remote-checkpoint-every: "auto"
// (the default), 0 for every time, or a minimum duration.
type checkpointInterval struct {
	set bool
	d   time.Duration
}

func (c *checkpointInterval) String() string {
	if c == nil || !c.set {
		return "auto"
	}
	return c.d.String()
}

func (c *checkpointInterval) Set(v string) error {
	if v == "auto" {
		*c = checkpointInterval{}
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return fmt.Errorf("want auto, 0 or a duration such as 2s")
	}
	*c = checkpointInterval{set: true, d: d}
	return nil
}

func (c *checkpointInterval) Type() string { return "auto|duration" }

// config is the interval as worker.Config takes it: 0 automatic, negative every time.
func (c *checkpointInterval) config() time.Duration {
	switch {
	case !c.set:
		return 0
	case c.d == 0:
		return -1
	}
	return c.d
}
