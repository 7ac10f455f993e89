package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
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

// Coordinator runs the coordinator command with args (without the program name).
func Coordinator(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	p := &program{ctx: ctx, stdout: stdout, stderr: stderr}
	return p.execute(p.coordinatorRoot(), args)
}

// coordinatorRoot is the coordinator's command tree.
func (p *program) coordinatorRoot() *cobra.Command {
	root := newCommand("coordinator", "tilefarm's coordinator", `
tilefarm coordinator: splits frames into tile jobs on NATS JetStream and tracks every frame.

Exit codes: 0 completed, 42 accepted/queued, 3 in progress, 1 failed or cancelled, 2 usage
error, 75 busy or unreachable (retry), 130 interrupted.`)
	root.RunE = func(c *cobra.Command, pos []string) error {
		if len(pos) == 0 {
			fmt.Fprint(p.stderr, c.UsageString())
			return usagef("no command given")
		}
		return usagef("unknown command %q", pos[0])
	}
	root.Args = cobra.ArbitraryArgs
	// "coordinator frobnicate --data x" is an unknown command, whatever flags follow it.
	root.FParseErrWhitelist.UnknownFlags = true
	pf := root.PersistentFlags()
	pf.BoolVar(&p.jsonOut, "json", false, "print one JSON value on stdout (read commands; shapes in docs/operations.md)")
	pf.StringVar(&p.logFormat, "log-format", os.Getenv(envLogFormat), "log format: text or json (default json unless stderr is a terminal; env "+envLogFormat+")")
	pf.StringVar(&p.server, "server", envDefault(envServer, "http://127.0.0.1:7070"), "coordinator HTTP address for the client commands (env "+envServer+"); the API token is read from "+client.EnvToken)
	root.AddGroup(&cobra.Group{ID: "farm", Title: "Running a farm:"}, &cobra.Group{ID: "jobs", Title: "Jobs:"},
		&cobra.Group{ID: "ops", Title: "Operating:"})
	for _, c := range []*cobra.Command{p.renderCommand(), p.serveCommand(), p.credentialsCommand()} {
		c.GroupID = "farm"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{p.submitCommand(), p.statusCommand(), p.watchCommand(), p.jobsCommand(), p.outputsCommand(),
		p.cancelCommand(), p.reprioritizeCommand()} {
		c.GroupID = "jobs"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{p.workersCommand(), p.dlqCommand(), p.gcCommand()} {
		c.GroupID = "ops"
		root.AddCommand(c)
	}
	return root
}

// farmFlags are the queue settings an operator may tune, with queue.DefaultConfig's defaults.
func farmFlags(fs *pflag.FlagSet) *queue.Config {
	cfg := queue.DefaultConfig()
	fs.DurationVar(&cfg.AckWait, "ack-wait", cfg.AckWait, "how long a delivered tile may go without a heartbeat before redelivery")
	fs.DurationVar(&cfg.LeaseTTL, "lease-ttl", cfg.LeaseTTL, "how long an abandoned tile lease lives")
	fs.IntVar(&cfg.MaxFailures, "max-failures", cfg.MaxFailures, "failed attempts of a tile (render errors, panics) before it is dead-lettered")
	fs.IntVar(&cfg.MaxDeliver, "max-deliver", cfg.MaxDeliver, "safety net: deliveries of a tile, whatever their cause (kills, handbacks, outages), before it is dead-lettered")
	fs.DurationVar(&cfg.DedupWindow, "dedup-window", cfg.DedupWindow, "JetStream publish dedup window")
	return &cfg
}

func (p *program) renderCommand() *cobra.Command {
	c := newCommand("render SCENE --frames A-B --out PATTERN", "render on this machine, nothing else needed", `
Render frames of SCENE on this machine: an embedded JetStream server, a filesystem store and
in-process workers, all under --data. Nothing else needs to run. A re-run with the same --data
after Ctrl-C resumes from checkpoints and skips finished tiles; a re-run of a finished render
renders nothing and writes the outputs again; a re-run of a failed render retries its failed
frames. '####' in --out is the zero-padded frame number.`)
	fs := c.Flags()
	frames := fs.String("frames", "", "frames to render, A-B or N (default: the scene's frame range)")
	out := fs.String("out", "", "output path pattern, e.g. out/shot_####.png (.exr writes OpenEXR)")
	format := fs.String("format", "", "output format: png, png16 or exr (default from --out's extension)")
	rf := addRenderFlags(fs)
	kf := kinds.AddFlags(fs, false)
	workers := fs.Int("workers", runtime.NumCPU(), "in-process workers (for Blender scenes, one Blender process each)")
	data := fs.String("data", ".tilefarm", "directory for state, checkpoints and the store")
	logLevel := fs.String("log-level", "warn", "log level: debug, info, warn, error")
	p.run(c, exactArgs(1, "one SCENE"), func(ctx context.Context, pos []string, stdout, stderr io.Writer) (int, error) {
		if *workers < 1 || *workers > 1024 {
			return 0, usagef("--workers %d: want 1-1024", *workers)
		}
		log, err := newLogger(stderr, *logLevel, p.logFormat)
		if err != nil {
			return 0, err
		}
		if *out == "" {
			return 0, usagef("--out is required, e.g. --out 'out/shot_####.png'")
		}
		fmtName, err := formatFor(*format, *out)
		if err != nil {
			return 0, err
		}
		ks := kf.Open(scene.Env{Dir: filepath.Join(*data, "worker"), Slots: *workers, Log: log})
		defer ks.Close()
		req, bundle, err := submitRequest(ctx, pos[0], *frames, rf, *out, []string{fmtName}, ks, stderr)
		if err != nil {
			return 0, err
		}
		// Short pulls: a pull cancelled at exit waits out its expiry (see queue.fetchOne), and a
		// finished local render should not linger seconds for it.
		n, err := node.StartCoordinator(ctx, node.CoordinatorOptions{DataDir: *data, Queue: queue.DefaultConfig(), Workers: *workers,
			Worker: worker.Config{FetchWait: 250 * time.Millisecond}, Kinds: ks, Log: log})
		if err != nil {
			return 0, err
		}
		defer n.Close()
		if err := n.Coord.PutScene(ctx, req.SceneVersion, bundle.Encode()); err != nil {
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
		if err := writeOutputs(ctx, n.Coord, &st, *out, fmtName); err != nil {
			return 0, err
		}
		printStatus(stdout, st, p.jsonOut)
		return st.State.ExitCode(), nil
	})
	return c
}

// submitRequest builds a submission and its scene bundle from the shared flags of render and
// submit.
func submitRequest(ctx context.Context, path, frames string, rf *renderFlags, out string, formats []string, ks scene.Kinds, stderr io.Writer) (api.SubmitRequest, *bundle.Bundle, error) {
	var req api.SubmitRequest
	first, last := 0, 0
	if frames != "" {
		var err error
		if first, last, err = parseFrames(frames); err != nil {
			return req, nil, err
		}
	}
	if err := rf.check(); err != nil {
		return req, nil, err
	}
	b, k, err := readScene(ctx, path, ks, stderr)
	if err != nil {
		return req, nil, err
	}
	s, err := k.Describe(b.Scene)
	if err != nil {
		return req, nil, fmt.Errorf("%w: %v", api.ErrBadInput, err)
	}
	if _, err := s.Resolve(rf.overrides()); err != nil {
		return req, nil, fmt.Errorf("%w: %v", api.ErrBadInput, err)
	}
	if frames == "" {
		first, last = s.Frames()
	}
	if out != "" {
		if err := checkPattern(out, first, last); err != nil {
			return req, nil, err
		}
	}
	return api.SubmitRequest{SceneVersion: b.Version(), Camera: rf.camera, First: first, Last: last, SPP: rf.spp,
		Passes: rf.passes, Width: rf.width, Height: rf.height, TileSize: rf.tile, Formats: formats}, b, nil
}

func printStatus(w io.Writer, st api.Status, asJSON bool) {
	if asJSON {
		_ = writeJSON(w, st)
		return
	}
	fmt.Fprintf(w, "job %s: %s\n", st.JobID, st.State)
	fmt.Fprintf(w, "  scene %s (%s), camera %s, frames %d-%d\n", st.Scene, short(st.SceneVersion), st.Camera, st.FirstFrame, st.LastFrame)
	fmt.Fprintf(w, "  frames %d/%d completed, %d failed; tiles %d/%d completed (%d rendered now, %d reused), %d attempts, %d samples recovered from checkpoints\n",
		st.FramesCompleted, st.FramesTotal, st.FramesFailed, st.TilesCompleted, st.TilesTotal, st.TilesRendered, st.TilesReused, st.TileAttempts, st.SamplesRecovered)
	if st.SamplesTotal > 0 && st.State != api.JobCompleted {
		fmt.Fprintf(w, "  samples %d/%d (%d%%), priority %d, ETA %s\n", st.SamplesDone, st.SamplesTotal, st.SamplesDone*100/st.SamplesTotal,
			st.Priority, eta(st))
	}
	if len(st.BlocklistedWorkers) > 0 {
		fmt.Fprintf(w, "  blocklisted by workers %s\n", strings.Join(st.BlocklistedWorkers, ", "))
	}
	for _, f := range st.Failures {
		fmt.Fprintf(w, "  FAILED %s\n", f)
	}
	for _, o := range st.Outputs {
		fmt.Fprintf(w, "  wrote %s\n", o)
	}
}

func short(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}

func (p *program) serveCommand() *cobra.Command {
	c := newCommand("serve", "run the coordinator daemon (HTTP API, embedded NATS)", `
Run the coordinator daemon: the HTTP API for submit/status/jobs/outputs and /metrics on --listen,
the outbox relay, the event consumer, the dead-letter watcher and the reconciler. Without --nats
it embeds a JetStream server on --nats-listen so tileworkers can join; without --store it keeps
objects under --data/store. Stops cleanly on SIGINT/SIGTERM.

Security: beyond loopback, the embedded JetStream always requires credentials (serve writes the
workers' to --data/worker.creds: copy it to render nodes for 'tileworker --nats-creds'), and the
HTTP API needs a token (--api-token-file, or TILEFARM_API_TOKEN); serve refuses to start
without one unless --insecure says so. When embedding, --nats-cert/--nats-key are the server's
TLS certificate and --nats-ca the CA client certificates must chain to; with --nats URL they
are this process's client certificate and the servers' CA.`)
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
	workers := fs.Int("workers", 0, "in-process workers (0: only external tileworkers render)")
	kf := kinds.AddFlags(fs, true)
	maxPending := fs.Int("max-pending-tiles", 0, "refuse submissions that would leave more tiles than this waiting to render (HTTP 429 with Retry-After, exit 75); 0 = no limit")
	debugListen := fs.String("debug-listen", "", "serve Go profiles (/debug/pprof/) on this address, e.g. 127.0.0.1:6060 (off by default)")
	reconcile := fs.Duration("reconcile-every", 30*time.Second, "how often unfinished frames are compared with their manifests in the store")
	natsSync := fs.String("nats-sync", string(queue.DefaultSync), "embedded JetStream disk sync: 'always' (fsync every write) or an interval; only an OS crash or power loss can lose what is not synced")
	ff := faults.AddFlags(fs, append(slices.Clone(faults.CoordinatorSeams), faults.WorkerSeams...))
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	qcfg := farmFlags(fs)
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
			if token == "" && !isLoopback(*listen) {
				return usagef("refusing to serve the HTTP API on %s without a token: anyone who can reach it could submit and cancel jobs; set --api-token-file or %s, or pass --insecure", *listen, client.EnvToken)
			}
			if embedded && !isLoopback(*natsListen) {
				*natsAuth = true // beyond loopback, JetStream is never open to anyone
			}
		} else if token == "" && !isLoopback(*listen) {
			log.Warn("serving the HTTP API beyond loopback without a token (--insecure)", "listen", *listen)
		}
		sync, err := queue.ParseSync(*natsSync)
		if err != nil {
			return usagef("--nats-sync: %v", err)
		}
		if *reconcile <= 0 {
			return usagef("--reconcile-every %v: must be positive", *reconcile)
		}
		ccfg := coordinator.Config{MaxPendingTiles: *maxPending, ReconcileEvery: *reconcile}
		plan, err := ff.Plan(func(seam string) { killSelf(log, "coordinator", seam) })
		if err != nil {
			return usagef("%v", err)
		}
		// The coordinator and its in-process workers break as the plan says, each at its seams.
		ccfg.Faults = plan
		opts := node.CoordinatorOptions{DataDir: *data, NATS: *nf, NATSListen: *natsListen, NATSSync: sync, NATSAuth: *natsAuth,
			StoreURL: *storeURL, HTTPListen: *listen, DebugListen: *debugListen, APIToken: token, Queue: *qcfg,
			Coordinator: ccfg, Workers: *workers, Worker: worker.Config{Faults: plan}, Log: log}
		opts.Kinds = kf.Open(scene.Env{Dir: filepath.Join(*data, "worker"), Slots: *workers, Log: log})
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

func (p *program) credentialsCommand() *cobra.Command {
	c := newCommand("credentials", "NATS identities and the account config for an external cluster", `
Create (or reuse) the farm's two NATS identities in --data, as serve does when it embeds NATS
with authentication: coordinator.creds (for 'serve --nats URL --nats-creds') and worker.creds
(for 'tileworker --nats-creds' on render nodes), both mode 0600. Then print the nats-server
configuration that grants them their permissions, to add to every node of an external JetStream
cluster. Only public keys are printed; the seeds stay in the files.`)
	fs := c.Flags()
	data := fs.String("data", ".tilefarm", "directory for the credential files")
	p.runErr(c, noArgs, func(ctx context.Context, _ []string, stdout, stderr io.Writer) error {
		if err := os.MkdirAll(*data, 0o700); err != nil {
			return err
		}
		coord, work, err := node.EnsureCredentials(*data)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "# tilefarm account for nats-server; identities in %s (%s, %s)\n", mustAbs(*data),
			node.CoordinatorCredsFile, node.WorkerCredsFile)
		fmt.Fprint(stdout, queue.AccountConfig(coord, work))
		return nil
	})
	return c
}

// natsFlags are how a process reaches NATS: --nats (default NATS_URL), --nats-creds and the TLS
// files. A user name, password or token come from NATS_USER, NATS_PASSWORD and NATS_TOKEN only.
func natsFlags(fs *pflag.FlagSet, def string) *node.NATSClient {
	c := &node.NATSClient{User: os.Getenv("NATS_USER"), Password: os.Getenv("NATS_PASSWORD"), Token: os.Getenv("NATS_TOKEN")}
	if env := os.Getenv("NATS_URL"); env != "" {
		def = env
	}
	fs.StringVar(&c.URLs, "nats", def, "NATS URL, or several comma-separated (the nodes of a cluster) (env NATS_URL)")
	fs.StringVar(&c.Creds, "nats-creds", "", "NATS credentials file: an nkey seed such as serve's worker.creds, or a JWT .creds file")
	fs.StringVar(&c.CA, "nats-ca", "", "CA certificate file for NATS TLS")
	fs.StringVar(&c.Cert, "nats-cert", "", "certificate file for NATS TLS")
	fs.StringVar(&c.Key, "nats-key", "", "key file of --nats-cert")
	return c
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

// isLoopback reports whether a listen address only accepts this host's connections.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// client is the API client of the client commands: --server, and the token from the
// environment only, where a process listing cannot show it.
func (p *program) client() *client.Client { return client.New(p.server, os.Getenv(client.EnvToken)) }

func (p *program) submitCommand() *cobra.Command {
	c := newCommand("submit SCENE --frames A-B", "submit a job to a running coordinator", `
Submit SCENE to a running coordinator. Safe to re-run from cron: the same request (or the same
--idempotency-key) returns the same job and enqueues nothing new; the same key with a different
request is a conflict (exit 1). Exit codes: 0 completed, 42 accepted and queued, 3 in progress,
1 failed or rejected, 2 usage error, 75 farm busy or unreachable (retry later).`)
	fs := c.Flags()
	frames := fs.String("frames", "", "frames, A-B or N (default: the scene's frame range)")
	rf := addRenderFlags(fs)
	kf := kinds.AddFlags(fs, false)
	format := fs.String("format", "png", "output formats, comma-separated: png, png16, exr (png is always produced)")
	priority := fs.Int("priority", 0, "priority from -100 to 100: tiles of higher-priority jobs are rendered first (bands: negative, 0, positive)")
	key := fs.String("idempotency-key", "", "idempotency key (default: derived from the request)")
	project := fs.String("project", "", "project name (part of the derived idempotency key)")
	wait := fs.Bool("wait", false, "wait until the job completes or fails")
	p.run(c, exactArgs(1, "one SCENE"), func(ctx context.Context, pos []string, stdout, stderr io.Writer) (int, error) {
		formats, err := formatList(*format)
		if err != nil {
			return 0, err
		}
		tmp, err := os.MkdirTemp("", "tilefarm-submit-")
		if err != nil {
			return 0, err
		}
		defer os.RemoveAll(tmp)
		ks := kf.Open(scene.Env{Dir: tmp, Slots: 1, Log: slog.New(slog.DiscardHandler)})
		defer ks.Close()
		req, bundle, err := submitRequest(ctx, pos[0], *frames, rf, "", formats, ks, stderr)
		if err != nil {
			return 0, err
		}
		req.Priority, req.IdempotencyKey, req.Project = *priority, *key, *project
		api := p.client()
		res, err := api.Submit(ctx, bundle, req)
		if err != nil {
			return 0, err
		}
		st := res.Status
		before := st.TilesCompleted
		if *wait {
			if st, err = waitJob(ctx, api, st.JobID, newProgress(stderr, p.jsonOut), nil); err != nil {
				return 0, err
			}
		}
		countReuse(&st, before)
		printStatus(stdout, st, p.jsonOut)
		return st.State.ExitCode(), nil
	})
	return c
}

func (p *program) statusCommand() *cobra.Command {
	return p.jobCommand("status JOB", "where a job stands (exit 0 done, 42 queued, 3 running, 1 failed or cancelled)", `
Show where JOB stands: frames, tiles, samples, the estimated time left, failures. Exit codes:
0 completed, 42 queued, 3 in progress, 1 failed or cancelled (the failing frames and tiles are
named), 2 usage error, 75 coordinator unreachable.`,
		func(ctx context.Context, api *client.Client, job string) (api.Status, error) {
			return api.Status(ctx, job)
		})
}

func (p *program) watchCommand() *cobra.Command {
	return p.jobCommand("watch JOB", "follow a job with a progress bar until it ends", `
Follow JOB with a progress bar until it completes, fails or is cancelled, then print its status.
Exits like status: 0 completed, 1 failed or cancelled, 75 coordinator unreachable, 130
interrupted.`,
		func(ctx context.Context, api *client.Client, job string) (api.Status, error) {
			return waitJob(ctx, api, job, newProgress(p.stderr, false), nil)
		})
}

func (p *program) cancelCommand() *cobra.Command {
	return p.jobCommand("cancel JOB", "stop rendering a job's tiles", `
Cancel JOB: no further tile of it is rendered (workers drop its tiles before leasing them and
between passes), frames another job also asked for keep rendering for that job, and nothing is
half-published. Prints the job's status; exit 1 (cancelled), or 1 with a message when the job
had already finished.`,
		func(ctx context.Context, api *client.Client, job string) (api.Status, error) {
			return api.Cancel(ctx, job)
		})
}

// jobCommand is status, watch and cancel: one JOB argument, a status obtained by get, printed,
// and the job's state as the exit code.
func (p *program) jobCommand(use, short, long string, get func(ctx context.Context, api *client.Client, job string) (api.Status, error)) *cobra.Command {
	c := newCommand(use, short, long)
	p.run(c, exactArgs(1, "one JOB"), func(ctx context.Context, pos []string, stdout, stderr io.Writer) (int, error) {
		st, err := get(ctx, p.client(), pos[0])
		if err != nil {
			if isNotFound(err) {
				return 0, fmt.Errorf("no job %q", pos[0])
			}
			return 0, err
		}
		printStatus(stdout, st, p.jsonOut)
		return st.State.ExitCode(), nil
	})
	return c
}

func (p *program) reprioritizeCommand() *cobra.Command {
	c := newCommand("reprioritize JOB PRIORITY", "change the priority of a job's tiles not started yet", `
Give JOB a new priority (-100 to 100; higher renders first). Tiles of the job not yet started
are dispatched in their new band; tiles already rendering finish where they are.`)
	p.run(c, exactArgs(2, "JOB and PRIORITY"), func(ctx context.Context, pos []string, stdout, stderr io.Writer) (int, error) {
		prio, err := strconv.Atoi(pos[1])
		if err != nil {
			return 0, usagef("priority %q: want an integer from %d to %d", pos[1], api.MinPriority, api.MaxPriority)
		}
		st, err := p.client().Reprioritize(ctx, pos[0], prio)
		if err != nil {
			if isNotFound(err) {
				return 0, fmt.Errorf("no job %q", pos[0])
			}
			return 0, err
		}
		printStatus(stdout, st, p.jsonOut)
		return api.ExitOK, nil
	})
	return c
}

func (p *program) jobsCommand() *cobra.Command {
	c := newCommand("jobs", "list jobs", "List every job, oldest first.")
	p.runErr(c, noArgs, func(ctx context.Context, _ []string, stdout, stderr io.Writer) error {
		jobs, err := p.client().Jobs(ctx)
		if err != nil {
			return err
		}
		if p.jsonOut {
			if jobs == nil {
				jobs = []api.Status{}
			}
			return writeJSON(stdout, jobs)
		}
		tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "JOB\tSTATE\tPRIORITY\tSCENE\tFRAMES\tDONE\tTILES\tETA")
		for _, j := range jobs {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d-%d\t%d/%d\t%d/%d\t%s\n", j.JobID, j.State, j.Priority, j.Scene, j.FirstFrame, j.LastFrame,
				j.FramesCompleted, j.FramesTotal, j.TilesCompleted, j.TilesTotal, eta(j))
		}
		return tw.Flush()
	})
	return c
}

func (p *program) outputsCommand() *cobra.Command {
	c := newCommand("outputs JOB --out PATTERN", "download a job's finished frames", `
Download the finished frames of JOB, verified against their manifests, into files named by
PATTERN ('####' is the zero-padded frame number). Frames not finished yet are skipped and listed.`)
	fs := c.Flags()
	out := fs.String("out", "", "output path pattern, e.g. out/shot_####.png")
	format := fs.String("format", "", "png, png16 or exr (default from --out's extension; png16/exr only if submitted with it)")
	p.runErr(c, exactArgs(1, "one JOB"), func(ctx context.Context, pos []string, stdout, stderr io.Writer) error {
		f, err := formatFor(*format, *out)
		if err != nil {
			return err
		}
		api := p.client()
		st, err := api.Status(ctx, pos[0])
		if err != nil {
			return err
		}
		if err := checkPattern(*out, st.FirstFrame, st.LastFrame); err != nil {
			return err
		}
		if err := writeOutputs(ctx, api, &st, *out, f); err != nil {
			return err
		}
		if p.jsonOut {
			if err := writeJSON(stdout, map[string]any{"job_id": st.JobID, "outputs": st.Outputs}); err != nil {
				return err
			}
		} else {
			for _, o := range st.Outputs {
				fmt.Fprintln(stdout, o)
			}
		}
		if missing := st.FramesTotal - len(st.Outputs); missing > 0 {
			return fmt.Errorf("%d of %d frames are not finished yet (job is %s)", missing, st.FramesTotal, st.State)
		}
		return nil
	})
	return c
}

func (p *program) dlqCommand() *cobra.Command {
	c := newCommand("dlq", "inspect and requeue dead-lettered tiles", "List dead-lettered tiles with their error, or put one back on the queue.")
	c.RunE = func(c *cobra.Command, pos []string) error {
		return usagef("want 'dlq list' or 'dlq requeue SEQ'")
	}
	list := newCommand("list", "list dead-lettered tiles", "List dead-lettered tiles: sequence, subject, message id, deliveries and the reason.")
	p.runErr(list, noArgs, func(ctx context.Context, _ []string, stdout, stderr io.Writer) error {
		dls, err := p.client().DeadLetters(ctx)
		if err != nil {
			return err
		}
		if p.jsonOut {
			if dls == nil {
				dls = []api.DeadLetter{}
			}
			return writeJSON(stdout, dls)
		}
		tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "SEQ\tSUBJECT\tMSG ID\tDELIVERIES\tREASON")
		for _, d := range dls {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\n", d.DLQSeq, d.Subject, short(d.MsgID), d.Deliveries, strings.ReplaceAll(d.Reason, "\n", " "))
		}
		return tw.Flush()
	})
	requeue := newCommand("requeue SEQ", "put a dead-lettered tile back on the queue", "Put the dead letter SEQ (from 'dlq list') back on the queue, with its failure count reset.")
	p.runErr(requeue, exactArgs(1, "one SEQ"), func(ctx context.Context, pos []string, stdout, stderr io.Writer) error {
		seq, err := strconv.ParseUint(pos[0], 10, 64)
		if err != nil {
			return usagef("dlq requeue %q: want a sequence number from 'dlq list'", pos[0])
		}
		if err := p.client().Requeue(ctx, seq); err != nil {
			return err
		}
		if p.jsonOut {
			return writeJSON(stdout, map[string]any{"requeued": seq})
		}
		fmt.Fprintf(stdout, "requeued %d\n", seq)
		return nil
	})
	c.AddCommand(list, requeue)
	return c
}

func (p *program) workersCommand() *cobra.Command {
	c := newCommand("workers", "list the live workers", `
List the live workers from their heartbeats: name, host, tile slots, tiles rendering now,
samples per second, when last seen, and the jobs each has blocklisted. A worker that stops
beating (killed, frozen, cut off) leaves the list within 15 s.`)
	p.runErr(c, noArgs, func(ctx context.Context, _ []string, stdout, stderr io.Writer) error {
		ws, err := p.client().Workers(ctx)
		if err != nil {
			return err
		}
		if p.jsonOut {
			if ws == nil {
				ws = []api.Worker{}
			}
			return writeJSON(stdout, map[string]any{"workers": ws})
		}
		tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "WORKER\tHOST\tSLOTS\tTILES\tSAMPLES/S\tLAST SEEN\tBLOCKLISTED")
		for _, w := range ws {
			var tiles []string
			for _, t := range w.Tiles {
				tiles = append(tiles, fmt.Sprintf("%s/%d %d/%d", short(t.JobID), t.Frame, t.SamplesDone, t.SamplesTotal))
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%.0f\t%s ago\t%s\n", w.Name, w.Host, w.Slots, orDash(strings.Join(tiles, ", ")),
				w.SamplesPerSecond, time.Since(w.LastSeen).Round(time.Second), orDash(strings.Join(w.Blocklisted, ", ")))
		}
		return tw.Flush()
	})
	return c
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// eta says how long a job has left, when that is known.
func eta(st api.Status) string {
	if st.ETASeconds == nil {
		return "-"
	}
	return (time.Duration(*st.ETASeconds) * time.Second).String()
}

// writeJSON prints v as indented JSON: the --json output of every read command.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
