package cli

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/client"
	"github.com/tilefarm/tilefarm/internal/coordinator"
	"github.com/tilefarm/tilefarm/internal/faults"
	"github.com/tilefarm/tilefarm/internal/kinds"
	"github.com/tilefarm/tilefarm/internal/node"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/internal/worker"
)

// The coordinator's commands for running a farm: render (a whole farm in this process), serve
// (the daemon) and credentials (the NATS identities for an external cluster).

func (p *program) renderCommand() *cobra.Command {
	c := newCommand("render SCENE --frames A-B --out PATTERN", "render on this machine, nothing else needed", `
Render frames of SCENE on this machine: an embedded JetStream server, a filesystem store and
in-process workers, all under --data. Nothing else needs to run. A re-run with the same --data
after Ctrl-C resumes from checkpoints and skips finished tiles; a re-run of a finished render
renders nothing and writes the outputs again; a re-run of a failed render retries its failed
frames. '####' in --out is the zero-padded frame number.

A .blend is written as Blender writes it (format blend): the file its Output Properties ask for
(format, colour mode, depth, codec; a multilayer EXR with every view layer and pass), after its
compositor, at its output path relative to the .blend (or --out, taken as Blender's -o takes it),
with its File Output nodes' files beside it.`)
	fs := c.Flags()
	fr := addFrameFlags(fs, "frames to render")
	out := fs.String("out", "", "output path pattern, e.g. out/shot_####.png (.exr writes OpenEXR); for a .blend, default its own output path")
	format := fs.String("format", "", "output format: png, png16, exr, or blend (a .blend's own output; the default for a .blend, else from --out's extension)")
	rf := addRenderFlags(fs)
	kf := kinds.AddFlags(fs, false)
	workers := fs.Int("workers", 0, "in-process workers, for Blender scenes one Blender process each (default: one with every thread for a .blend, one per core for other scenes)")
	threads := addThreadsFlag(fs, "in-process worker")
	data := fs.String("data", ".tilefarm", "directory for state, checkpoints and the store")
	logLevel := fs.String("log-level", "warn", "log level: debug, info, warn, error")
	p.run(c, exactArgs(1, "one SCENE"), func(ctx context.Context, pos []string, stdout, stderr io.Writer) (int, error) {
		if !fs.Changed("workers") {
			*workers = machineSlots(kf, pos[0])
		}
		if *workers < 1 || *workers > 1024 {
			return 0, usagef("--workers %d: want 1-1024", *workers)
		}
		log, err := newLogger(stderr, *logLevel, p.logFormat)
		if err != nil {
			return 0, err
		}
		if err := checkFormat(*format); err != nil {
			return 0, err
		}
		var asked []string
		if *format != "" {
			asked = []string{*format}
		}
		nthreads, err := threads.of(*workers)
		if err != nil {
			return 0, err
		}
		ks := kf.Open(scene.Env{Dir: filepath.Join(*data, "worker"), Slots: *workers, Threads: nthreads, Log: log})
		defer ks.Close()
		req, bundle, _, err := submitRequest(ctx, pos[0], *fr, rf, *out, asked, ks, stderr)
		if err != nil {
			return 0, err
		}
		req.NoMovie = true // a one-shot render writes frames; a preview movie is the farm's
		fmtName := req.Formats[0]
		if *out == "" && fmtName != formatBlend {
			return 0, usagef("--out is required, e.g. --out 'out/shot_####.png'")
		}
		// Short pulls: a pull cancelled at exit waits out its expiry (see queue.fetchOne), and an
		// idle pull on the default pool ends before the worker sees the pool the job made
		// (queue.Sources.refresh). Both are a one-frame render's fixed cost, and 50 ms pulls on an
		// embedded server cost nothing measurable (docs/benchmarks.md, "Blender stills and threads").
		n, err := node.StartCoordinator(ctx, node.CoordinatorOptions{DataDir: *data, Queue: queue.DefaultConfig(), Workers: *workers,
			Worker: worker.Config{FetchWait: 50 * time.Millisecond}, Kinds: ks, Log: log})
		if err != nil {
			return 0, err
		}
		defer n.Close()
		if _, err := uploadScene(ctx, n.Coord, bundle, io.Discard, true); err != nil {
			return 0, err
		}
		res, err := n.Coord.Submit(ctx, req)
		if err != nil {
			return 0, err
		}
		if res.Status.State == api.JobFailed {
			// Re-running a failed render tries its failed frames again; finished tiles are reused.
			retried, err := n.Coord.Retry(ctx, res.Status.JobID)
			if err != nil {
				return 0, err
			}
			fmt.Fprintf(stderr, "retrying %d failed frames of job %s\n", retried, res.Status.JobID)
		}
		before := res.Status.TilesCompleted
		st, err := waitJob(ctx, n.Coord, res.Status.JobID, newProgress(stderr, p.jsonOut), n.Coord.Changed)
		if err != nil {
			return 0, err
		}
		countReuse(&st, before)
		dest := outputDest{Pattern: outPattern(*out, fmtName), Base: filepath.Dir(pos[0])}
		if err := writeOutputs(ctx, n.Coord, &st, dest, fmtName); err != nil {
			return 0, err
		}
		printStatus(stdout, st, p.jsonOut)
		return st.State.ExitCode(), nil
	})
	return c
}

// slotsAdvisor is a scene kind that knows how many renderer processes a machine should run
// for it (blendscene.Kind.SlotsPerMachine); other kinds get one per core.
type slotsAdvisor interface{ SlotsPerMachine(cores int) int }

// machineSlots is render's default --workers for the scene at path: its kind's advice, else
// one worker per core.
func machineSlots(kf *kinds.Flags, path string) int {
	ks := kf.Open(scene.Env{})
	defer ks.Close()
	if k, err := ks.ForFile(path); err == nil {
		if a, ok := k.(slotsAdvisor); ok {
			return a.SlotsPerMachine(runtime.NumCPU())
		}
	}
	return runtime.NumCPU()
}

func (p *program) serveCommand() *cobra.Command {
	c := newCommand("serve", "run the coordinator daemon (HTTP API, embedded NATS)", `
Run the coordinator daemon: the HTTP API for submit/status/jobs/outputs and /metrics on --listen,
the outbox relay, the event consumer and the reconciler. Without --nats
it embeds a JetStream server on --nats-listen so tileworkers can join; without --store it keeps
objects under --data/store. Stops cleanly on SIGINT/SIGTERM.

Security: beyond loopback, the embedded JetStream always requires credentials (serve writes the
workers' to --data/worker.creds: copy it to render nodes for 'tileworker --nats-creds'), and the
HTTP API needs a token (--api-token-file, or TILEFARM_API_TOKEN); serve refuses to start
without one unless --insecure says so. When embedding, --nats-cert/--nats-key are the server's
TLS certificate and --nats-ca the CA client certificates must chain to; with --nats URL they
are this process's client certificate and the servers' CA.

Notifications: when a job completes, fails or is cancelled, its event is published on the NATS
subject notify.<type>.<job_id> (stream NOTIFY) and posted as JSON to every --notify URL and the
job's own (submit --notify), stamped with X-Tilefarm-Timestamp (unix seconds of the attempt)
and signed with the secret of --notify-secret-file or TILEFARM_NOTIFY_SECRET in
X-Tilefarm-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">. Each is retried with
backoff until --notify-give-up-after, and survives a restart. A job's own receivers may not
reach loopback, link-local (cloud metadata included) or unspecified addresses unless
--notify-allow names their range; the --notify URLs may reach any.`)
	fs := c.Flags()
	data := fs.String("data", ".tilefarm", "directory for the coordinator database (and embedded JetStream, store)")
	nf := natsFlags(fs, "")
	natsListen := fs.String("nats-listen", "127.0.0.1:4222", "client address of the embedded JetStream server")
	natsAuth := fs.Bool("nats-auth", false, "require credentials on the embedded JetStream even on loopback (always on beyond loopback)")
	tokenFile := fs.String("api-token-file", "", "file holding the HTTP API's bearer token (or set TILEFARM_API_TOKEN)")
	insecure := fs.Bool("insecure", false, "allow the HTTP API or the embedded JetStream beyond loopback without authentication")
	replicas := fs.Int("replicas", 1, "replicas of every stream and bucket: 3 on a JetStream cluster of three or more nodes")
	storeURL := fs.String("store", "", "object store: file:///DIR, s3://HOST:PORT/BUCKET or s3+http://HOST:PORT/BUCKET (default: --data/store)")
	listen := fs.String("listen", "127.0.0.1:7070", "HTTP API and /metrics address")
	advertise := fs.String("advertise", "", "the URL clients reach this coordinator's API at, which the other coordinators of the farm name when this one leads (default: http:// and the --listen address bound)")
	workers := fs.Int("workers", 0, "in-process workers (0: only external tileworkers render)")
	threads := addThreadsFlag(fs, "in-process worker")
	kf := kinds.AddFlags(fs, true)
	maxFiles := fs.Int("max-scene-files", bundle.DefaultLimits.Files, "refuse scenes naming more files than this (HTTP 400, exit 1)")
	maxBytes := fs.String("max-scene-bytes", "0", "refuse scenes whose files total more than this, e.g. 500G (0 = no limit)")
	sceneGrace := fs.Duration("scene-grace", coordinator.DefaultSceneGrace, "delete a scene no job names once it is this old (uploaded for a submission that never came; its files go with the next 'coordinator gc'); 0 keeps every scene")
	maxPending := fs.Int("max-pending-tiles", 0, "refuse submissions that would leave more tiles than this waiting to render (HTTP 429 with Retry-After, exit 75); 0 = no limit")
	debugListen := fs.String("debug-listen", "", "serve Go profiles (/debug/pprof/) on this address, e.g. 127.0.0.1:6060 (off by default; beyond loopback they need the API token)")
	reconcile := fs.Duration("reconcile-every", 30*time.Second, "how often unfinished frames are compared with their manifests in the store")
	retirePools := fs.Duration("retire-idle-pools-after", coordinator.DefaultRetirePoolsAfter, "how long a pool no unfinished job renders in keeps its consumers (workers stop pulling it once retired); 0 retires it at once")
	natsSync := fs.String("nats-sync", string(queue.DefaultSync), "embedded JetStream disk sync: 'always' (fsync every write) or an interval; only an OS crash or power loss can lose what is not synced")
	ff := faults.AddFlags(fs, append(slices.Clone(faults.CoordinatorSeams), faults.WorkerSeams...))
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	qcfg := farmFlags(fs)
	nfl := addNotifyFlags(fs)
	p.runErr(c, noArgs, func(ctx context.Context, _ []string, stdout, stderr io.Writer) error {
		log, err := newLogger(stderr, *logLevel, p.logFormat)
		if err != nil {
			return err
		}
		qcfg.Replicas = *replicas
		if err := qcfg.Validate(); err != nil {
			return usagef("%v", err)
		}
		token, err := apiToken(*tokenFile)
		if err != nil {
			return err
		}
		embedded := nf.URLs == ""
		if !*insecure {
			if token == "" && !node.IsLoopback(*listen) {
				return usagef("refusing to serve the HTTP API on %s without a token: anyone who can reach it could submit and cancel jobs; set --api-token-file or %s, or pass --insecure", *listen, client.EnvToken)
			}
			if embedded && !node.IsLoopback(*natsListen) {
				*natsAuth = true // beyond loopback, JetStream is never open to anyone
			}
		} else if token == "" && !node.IsLoopback(*listen) {
			log.Warn("serving the HTTP API beyond loopback without a token (--insecure)", "listen", *listen)
		}
		sync, err := queue.ParseSync(*natsSync)
		if err != nil {
			return usagef("--nats-sync: %v", err)
		}
		if *reconcile <= 0 {
			return usagef("--reconcile-every %v: must be positive", *reconcile)
		}
		if *retirePools < 0 {
			return usagef("--retire-idle-pools-after %v: must be 0 or positive", *retirePools)
		}
		nthreads, err := threads.of(*workers)
		if err != nil {
			return err
		}
		ncfg, err := nfl.config()
		if err != nil {
			return err
		}
		if *maxFiles < 1 {
			return usagef("--max-scene-files %d: want 1 or more", *maxFiles)
		}
		var sceneBytes int64
		if *maxBytes != "0" {
			if sceneBytes, err = parseBytes(*maxBytes); err != nil {
				return usagef("--max-scene-bytes %q: %v", *maxBytes, err)
			}
		}
		ccfg := coordinator.Config{MaxPendingTiles: *maxPending, ReconcileEvery: *reconcile, RetirePoolsAfter: *retirePools, Notify: ncfg,
			SceneLimits: bundle.Limits{Files: *maxFiles, Bytes: sceneBytes}, SceneGrace: *sceneGrace}
		if *sceneGrace == 0 {
			ccfg.SceneGrace = -1
		} else if *sceneGrace < time.Hour {
			return usagef("--scene-grace %v: want 1h or more (a submission uploads its scene before it names it), or 0", *sceneGrace)
		}
		if *retirePools == 0 {
			ccfg.RetirePoolsAfter = -1
		}
		plan, err := ff.Plan(func(seam string) { killSelf(log, "coordinator", seam) })
		if err != nil {
			return usagef("%v", err)
		}
		// The coordinator and its in-process workers break as the plan says, each at its seams.
		ccfg.Faults = plan
		if *advertise != "" {
			u, err := url.Parse(*advertise)
			if err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
				return usagef("--advertise %q: want the URL clients reach this coordinator at, e.g. http://render-coord-1:7070", *advertise)
			}
			ccfg.Address = strings.TrimRight(*advertise, "/")
		}
		opts := node.CoordinatorOptions{DataDir: *data, NATS: *nf, NATSListen: *natsListen, NATSSync: sync, NATSAuth: *natsAuth,
			StoreURL: *storeURL, HTTPListen: *listen, DebugListen: *debugListen, APIToken: token, Queue: *qcfg,
			Coordinator: ccfg, Workers: *workers, Worker: worker.Config{Faults: plan}, Log: log}
		opts.Kinds = kf.Open(scene.Env{Dir: filepath.Join(*data, "worker"), Slots: *workers, Threads: nthreads, Log: log})
		defer opts.Kinds.Close()
		if embedded {
			// The TLS flags are the embedded server's own certificate.
			opts.NATSTLSCert, opts.NATSTLSKey, opts.NATSTLSCA = nf.Cert, nf.Key, nf.CA
		}
		n, err := node.StartCoordinator(ctx, opts)
		if err != nil {
			return err
		}
		nurl := node.RedactURL(nf.URLs)
		if n.Embedded != nil {
			nurl = n.Embedded.ClientURL()
		}
		log.Info("coordinator serving", "http", n.HTTPAddr, "nats", nurl, "data", mustAbs(*data))
		<-ctx.Done()
		log.Info("coordinator stopping")
		n.Close()
		log.Info("coordinator stopped")
		return nil
	})
	return c
}

// farmFlags are the queue settings an operator may tune, with queue.DefaultConfig's defaults.
func farmFlags(fs *pflag.FlagSet) *queue.Config {
	cfg := queue.DefaultConfig()
	fs.DurationVar(&cfg.AckWait, "ack-wait", cfg.AckWait, "how long a delivered tile may go without a heartbeat before redelivery")
	fs.DurationVar(&cfg.LeaseTTL, "lease-ttl", cfg.LeaseTTL, "how long an abandoned tile lease lives")
	fs.IntVar(&cfg.MaxFailures, "max-failures", cfg.MaxFailures, "failed attempts of a tile (render errors, panics) before it is dead-lettered")
	fs.IntVar(&cfg.MaxDeliver, "max-deliver", cfg.MaxDeliver, "safety net: deliveries of a tile lost without a word (its worker killed, its connection lost) before it is dead-lettered; failures count against --max-failures and hand-backs count nothing")
	fs.DurationVar(&cfg.DedupWindow, "dedup-window", cfg.DedupWindow, "JetStream publish dedup window")
	return &cfg
}

// apiToken reads the HTTP API token from a file, else from TILEFARM_API_TOKEN.
func apiToken(file string) (string, error) {
	if file == "" {
		return os.Getenv(client.EnvToken), nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("reading the API token: %w", err)
	}
	token := strings.TrimSpace(string(data))
	if len(token) < 16 {
		return "", fmt.Errorf("the API token in %s is shorter than 16 characters", file)
	}
	return token, nil
}

func (p *program) credentialsCommand() *cobra.Command {
	c := newCommand("credentials", "NATS identities: one per render node, and the account config for a cluster", `
Create (or reuse) the farm's NATS identities in --data, as serve does when it embeds NATS with
authentication: coordinator.creds (for 'serve --nats URL --nats-creds') and worker.creds, a
first worker identity, all mode 0600. With --worker NAME, also the identity of the render node
NAME, in workers/NAME.creds: copy it to that node for 'tileworker --nats-creds'. Each worker
identity reads only its own inbox, so give every render node its own; nodes sharing one can
read each other's replies.

Then print the nats-server configuration that grants every identity its permissions. A serve
that embeds NATS on this --data loads identities added here within seconds, without a restart;
an external JetStream cluster needs the printed block on every node, then a configuration
reload (nats-server --signal reload). Only public keys are printed; the seeds stay in the files.`)
	fs := c.Flags()
	data := fs.String("data", ".tilefarm", "directory for the credential files")
	workers := fs.StringSlice("worker", nil, "also create (or reuse) the identity of the render node `NAME` (repeatable, or comma-separated)")
	p.runErr(c, noArgs, func(ctx context.Context, _ []string, stdout, stderr io.Writer) error {
		if err := os.MkdirAll(*data, 0o700); err != nil {
			return err
		}
		for _, name := range *workers {
			path, err := node.EnsureWorkerCredentials(*data, name)
			if err != nil {
				return usagef("--worker: %v", err)
			}
			fmt.Fprintf(stderr, "worker identity %s: %s (copy it to the render node for tileworker --nats-creds)\n", name, mustAbs(path))
		}
		ids, err := node.EnsureCredentials(*data)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "# tilefarm account for nats-server; identities in %s (%s, %s, %s/)\n", mustAbs(*data),
			node.CoordinatorCredsFile, node.WorkerCredsFile, node.WorkerCredsDir)
		fmt.Fprint(stdout, ids.AccountConfig())
		return nil
	})
	return c
}
