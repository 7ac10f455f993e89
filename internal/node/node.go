// Package node assembles running processes from the farm's parts: a coordinator (with an
// embedded JetStream server and in-process workers when asked) and a standalone worker. The
// commands in cmd/ only parse flags and call into here.
package node

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/checkpoint"
	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/coordinator"
	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/internal/web"
	"github.com/tilefarm/tilefarm/internal/worker"
	"github.com/tilefarm/tilefarm/objstore"
)

// CoordinatorOptions configure StartCoordinator.
type CoordinatorOptions struct {
	DataDir string // coordinator database, embedded JetStream, filesystem store, in-process checkpoints
	// NATS reaches an external NATS (a cluster); with no URLs a JetStream server is embedded.
	NATS       NATSClient
	NATSListen string     // embedded server's client address; empty means loopback on a free port
	NATSSync   queue.Sync // embedded server's disk sync policy; empty means queue.DefaultSync
	// NATSAuth makes the embedded server require credentials: serve creates the coordinator's
	// and the workers' under DataDir (CoordinatorCredsFile, WorkerCredsFile).
	NATSAuth bool
	// NATSTLSCert and NATSTLSKey serve the embedded server's clients over TLS; with
	// NATSTLSCA clients must present a certificate it signed.
	NATSTLSCert, NATSTLSKey, NATSTLSCA string
	// APIToken, when set, is required as a bearer token by every API call.
	APIToken    string
	StoreURL    string // object store; empty means file://DataDir/store
	HTTPListen  string // HTTP API and /metrics; empty means none
	DebugListen string // Go profiles (/debug/pprof/); empty means none
	Queue       queue.Config
	Coordinator coordinator.Config
	Workers     int // in-process workers
	Worker      worker.Config
	// Kinds are the kinds of scene the coordinator accepts and its in-process workers render;
	// the caller closes them.
	Kinds scene.Kinds
	Log   *slog.Logger
}

// Coordinator is a running coordinator process.
type Coordinator struct {
	Coord *coordinator.Coordinator
	// Metrics is the coordinator's metric set; with in-process workers their set is registered
	// in the same registry, so the one /metrics shows both.
	Metrics  *metrics.Coordinator
	Embedded *queue.Embedded // nil with an external NATS
	HTTPAddr string          // where the API listens, if it does

	http     *http.Server
	embedded *embeddedWatch // looks after the embedded server, when there is one
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	closers  []func()
}

// StartCoordinator starts everything and returns once the coordinator accepts submissions.
func StartCoordinator(ctx context.Context, o CoordinatorOptions) (_ *Coordinator, err error) {
	log := o.Log
	if log == nil {
		log = slog.Default()
	}
	if err := os.MkdirAll(o.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("creating data dir %q: %w", o.DataDir, err)
	}
	reg := metrics.NewRegistry()
	n := &Coordinator{Metrics: metrics.NewCoordinator(reg)}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	nc, err := n.connect(ctx, o, log)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("opening JetStream: %w", err)
	}
	var f *queue.Queue
	err = waitSetUp(ctx, "setting up streams", log, func(ctx context.Context) (err error) {
		f, err = queue.Setup(ctx, js, o.Queue)
		return err
	})
	if err != nil {
		return nil, err
	}
	f.Log = log
	objects, err := openStore(ctx, o.StoreURL, o.DataDir)
	if err != nil {
		return nil, err
	}
	st, err := coorddb.Open(filepath.Join(o.DataDir, "coordinator.db"))
	if err != nil {
		return nil, err
	}
	n.closers = append(n.closers, func() { st.Close() })
	if o.Coordinator.ID == "" {
		if o.Coordinator.ID, err = coordinatorID(o.DataDir); err != nil {
			return nil, err
		}
	}
	var ln net.Listener // bound first: the coordinator's leadership lease names its address
	if o.HTTPListen != "" {
		if ln, err = net.Listen("tcp", o.HTTPListen); err != nil {
			return nil, fmt.Errorf("listening on %s: %w", o.HTTPListen, err)
		}
		n.closers = append(n.closers, func() { ln.Close() }) // a start that fails later; served, http.Shutdown closes it first
		n.HTTPAddr = ln.Addr().String()
		if o.Coordinator.Address == "" {
			o.Coordinator.Address = "http://" + n.HTTPAddr
		}
	}
	if n.embedded != nil && o.Coordinator.JetStreamHealth == nil {
		emb := n.embedded.emb
		o.Coordinator.JetStreamHealth = func() error {
			if emb.Writable() {
				return nil
			}
			return fmt.Errorf("the embedded JetStream cannot write its store under --data: %w", syscall.ENOSPC)
		}
	}
	n.Coord = coordinator.New(o.Coordinator, coordinator.Deps{DB: st, Queue: f, Kinds: o.Kinds, NATS: nc, Objects: objects, Metrics: n.Metrics, Log: log})

	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	n.cancel = cancel
	n.goRun(func() { _ = n.Coord.Run(rctx) })
	if n.embedded != nil {
		n.goRun(func() { n.embedded.run(rctx) })
	} else {
		n.goRun(func() { watchJetStream(rctx, nc, js, log) })
	}

	if o.Workers > 0 {
		ckpts, err := checkpoint.OpenLocal(filepath.Join(o.DataDir, "checkpoints.db"))
		if err != nil {
			return nil, err
		}
		n.closers = append(n.closers, func() { ckpts.Close() })
		n.goRun(func() { worker.PruneCheckpoints(rctx, ckpts, objects, 10*time.Minute, log) })
		wc := o.Worker
		wc.Name = hostname() + "-local"
		wc.Concurrency = o.Workers
		scenes, err := worker.NewScenes(objects, filepath.Join(o.DataDir, "worker", "scenes"), o.Kinds, log)
		if err != nil {
			return nil, err
		}
		w, err := worker.New(wc, worker.Deps{Queue: f, Objects: objects, Checkpoints: ckpts,
			Scenes: scenes, Metrics: metrics.NewWorker(reg), Log: log})
		if err != nil {
			return nil, err
		}
		n.goRun(func() { _ = w.Run(rctx) })
	}
	stopDebug, err := serveDebug(o.DebugListen, o.APIToken)
	if err != nil {
		return nil, err
	}
	n.closers = append(n.closers, stopDebug)
	if ln != nil {
		// The monitor's page and files are public; everything else is the API, behind the token.
		n.http = &http.Server{Handler: web.Handler(coordinator.RequireToken(o.APIToken, n.Coord.Handler())),
			ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 10 * time.Minute, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
		n.http.RegisterOnShutdown(n.Coord.StopStreams)
		go func() { _ = n.http.Serve(ln) }()
	}
	return n, nil
}

func (n *Coordinator) connect(ctx context.Context, o CoordinatorOptions, log *slog.Logger) (*nats.Conn, error) {
	if o.NATS.URLs != "" {
		nc, err := o.NATS.connect("tilefarm-coordinator", false, log)
		if err != nil {
			return nil, err
		}
		n.closers = append(n.closers, nc.Close)
		return nc, nil
	}
	var opts []queue.EmbeddedOption
	if o.NATSSync != "" {
		opts = append(opts, queue.WithSync(o.NATSSync))
	}
	var connOpts []nats.Option
	var ids Identities
	if o.NATSAuth {
		var err error
		if ids, err = EnsureCredentials(o.DataDir); err != nil {
			return nil, err
		}
		co, _, err := credsOption(filepath.Join(o.DataDir, CoordinatorCredsFile))
		if err != nil {
			return nil, err
		}
		connOpts = append(connOpts, co)
	}
	if o.NATSTLSCert != "" || o.NATSTLSKey != "" {
		opts = append(opts, queue.WithTLS(o.NATSTLSCert, o.NATSTLSKey, o.NATSTLSCA))
		// The coordinator's own in-process connection trusts exactly the server's certificate
		// (and presents it, should the server verify clients).
		co, err := trustOwnCert(o.NATSTLSCert, o.NATSTLSKey)
		if err != nil {
			return nil, err
		}
		connOpts = append(connOpts, co)
	}
	var auth []queue.EmbeddedOption
	if o.NATSAuth {
		auth = append(auth, queue.WithConfig(ids.AccountConfig()))
	}
	emb, err := queue.StartEmbedded(ctx, filepath.Join(o.DataDir, "jetstream"), o.NATSListen, append(auth, opts...)...)
	if err != nil {
		return nil, err
	}
	n.Embedded = emb
	emb.SetLog(log)
	n.embedded = &embeddedWatch{dir: o.DataDir, emb: emb, auth: o.NATSAuth, opts: opts, current: ids, log: log}
	n.closers = append(n.closers, emb.Shutdown)
	nc, err := emb.Connect("tilefarm-coordinator", connOpts...)
	if err != nil {
		return nil, err
	}
	n.closers = append(n.closers, nc.Close)
	if o.NATSListen != "" {
		attrs := []any{"url", emb.ClientURL(), "auth", o.NATSAuth, "tls", o.NATSTLSCert != ""}
		if o.NATSAuth {
			attrs = append(attrs, "worker_credentials", filepath.Join(mustAbs(o.DataDir), WorkerCredsFile))
		}
		log.Info("embedded JetStream listening", attrs...)
	}
	return nc, nil
}

// embeddedWatchEvery is how often serve looks after its embedded server: whether JetStream
// still runs, and which worker identities its data directory holds.
const embeddedWatchEvery = 2 * time.Second

// embeddedWatch looks after serve's embedded server. JetStream stops writing its store when
// its disk is full, and does not start again by itself; the watch says so and restarts it
// once there is room, so the farm goes on by itself when space returns. With authentication, it gives the server the
// worker identities an operator adds under WorkerCredsDir (coordinator credentials --worker
// NAME) while serve runs, as a nats-server reloads its configuration: the new render node
// connects without a restart of the farm.
type embeddedWatch struct {
	dir     string
	emb     *queue.Embedded
	auth    bool
	opts    []queue.EmbeddedOption // the server's options beside its account
	current Identities
	log     *slog.Logger

	stopped bool   // JetStream was found unable to write and has not restarted since
	lastErr string // the identities' last problem, said once
}

func (w *embeddedWatch) run(ctx context.Context) {
	t := time.NewTicker(embeddedWatchEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.jetStream()
		if w.auth {
			w.identities()
		}
	}
}

func (w *embeddedWatch) jetStream() {
	if w.emb.Writable() {
		return
	}
	if !w.stopped {
		w.stopped = true
		w.log.Error("the embedded JetStream cannot write its store under --data (is the disk full?); the farm waits, and JetStream restarts once there is room",
			"data", w.dir)
	}
	if err := w.emb.RestartJetStream(); err != nil {
		w.log.Debug("the embedded JetStream does not restart yet", "err", err)
		return
	}
	w.stopped = false
	w.log.Info("the embedded JetStream restarted and writes its store again")
}

func (w *embeddedWatch) identities() {
	ids, err := EnsureCredentials(w.dir)
	if err == nil && slices.Equal(ids.Workers, w.current.Workers) {
		return
	}
	if err == nil {
		err = w.emb.Reconfigure(append([]queue.EmbeddedOption{queue.WithConfig(ids.AccountConfig())}, w.opts...)...)
	}
	if err != nil {
		if err.Error() != w.lastErr { // once per distinct problem, not every tick
			w.log.Warn("cannot load the worker identities; the ones loaded before stay", "err", err)
		}
		w.lastErr = err.Error()
		return
	}
	w.lastErr = ""
	w.log.Info("worker identities loaded", "identities", len(ids.Workers), "added", len(ids.Workers)-len(w.current.Workers))
	w.current = ids
}

func mustAbs(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

func (n *Coordinator) goRun(fn func()) {
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		fn()
	}()
}

// Close stops the loops and workers (workers checkpoint and hand back their tiles), then
// closes connections and files in reverse order of opening.
func (n *Coordinator) Close() {
	if n.http != nil {
		// Stop taking requests first; in-flight ones finish while everything is still open.
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = n.http.Shutdown(sctx)
		cancel()
		n.http = nil
	}
	if n.cancel != nil {
		n.cancel()
	}
	n.wg.Wait()
	for i := len(n.closers) - 1; i >= 0; i-- {
		n.closers[i]()
	}
	n.closers = nil
}

func openStore(ctx context.Context, url, dataDir string) (objstore.Store, error) {
	if url == "" {
		dir, err := filepath.Abs(filepath.Join(dataDir, "store"))
		if err != nil {
			return nil, err
		}
		return objstore.NewFSStore(dir)
	}
	return objstore.OpenStore(ctx, url)
}

func hostname() string {
	h, err := os.Hostname()
	if err != nil {
		return "node"
	}
	return h
}

// RedactURL drops credentials from a URL for error messages and logs.
func RedactURL(u string) string {
	if at := strings.LastIndex(u, "@"); at >= 0 {
		if scheme := strings.Index(u, "://"); scheme >= 0 && scheme < at {
			return u[:scheme+3] + "REDACTED@" + u[at+1:]
		}
	}
	return u
}

// WorkerOptions configure RunWorker.
type WorkerOptions struct {
	NATS          NATSClient
	StoreURL      string
	CheckpointDir string
	MetricsListen string
	DebugListen   string // Go profiles (/debug/pprof/); empty means none
	DebugToken    string // the bearer token profiles need (required beyond loopback)
	Worker        worker.Config
	Scenes        worker.ScenesOptions // the node's content cache limit and shares
	Kinds         scene.Kinds          // the kinds of scene the worker renders; the caller closes them
	Log           *slog.Logger
}

// RunWorker runs a standalone worker until ctx is cancelled. It waits for the coordinator to
// have set up the farm, so workers may start first.
func RunWorker(ctx context.Context, o WorkerOptions) error {
	log := o.Log
	if log == nil {
		log = slog.Default()
	}

	objects, err := objstore.OpenStore(ctx, o.StoreURL)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(o.CheckpointDir, 0o755); err != nil {
		return fmt.Errorf("creating checkpoint dir %q: %w", o.CheckpointDir, err)
	}
	ckpts, err := checkpoint.OpenLocal(filepath.Join(o.CheckpointDir, "checkpoints.db"))
	if err != nil {
		return err
	}
	defer ckpts.Close()
	nc, err := o.NATS.connect("tilefarm-worker", true, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("opening JetStream: %w", err)
	}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go watchJetStream(wctx, nc, js, log)
	var f *queue.Queue
	for {
		f, err = queue.Open(ctx, js)
		if err == nil {
			break
		}
		log.Info("waiting for the coordinator to set up the farm", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
	f.Log = log
	m := metrics.NewWorker(metrics.NewRegistry())
	stopDebug, err := serveDebug(o.DebugListen, o.DebugToken)
	if err != nil {
		return err
	}
	defer stopDebug()
	if o.MetricsListen != "" {
		ln, err := net.Listen("tcp", o.MetricsListen)
		if err != nil {
			return fmt.Errorf("listening on %s: %w", o.MetricsListen, err)
		}
		srv := &http.Server{Handler: m.Handler(), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
	}
	scenes, err := worker.NewScenes(objects, filepath.Join(o.CheckpointDir, "scenes"), o.Kinds, log, o.Scenes)
	if err != nil {
		return err
	}
	w, err := worker.New(o.Worker, worker.Deps{Queue: f, Objects: objects, Checkpoints: ckpts,
		Scenes: scenes, Metrics: m, Log: log})
	if err != nil {
		return err
	}
	go worker.PruneCheckpoints(ctx, ckpts, objects, 10*time.Minute, log)
	log.Info("worker started", "worker", w.Name(), "concurrency", o.Worker.Concurrency, "ack_wait", f.Cfg.AckWait,
		"lease_ttl", f.Cfg.LeaseTTL, "max_failures", f.Cfg.MaxFailures)
	return w.Run(ctx)
}

// coordinatorID is the coordinator of dataDir's name in the farm's leadership lease, made once
// and kept beside its database (coordinator.id): the same coordinator restarted takes its own
// lease back at once instead of waiting it out as another's.
func coordinatorID(dataDir string) (string, error) {
	path := filepath.Join(dataDir, "coordinator.id")
	if data, err := os.ReadFile(path); err == nil && len(bytes.TrimSpace(data)) > 0 {
		return string(bytes.TrimSpace(data)), nil
	}
	id := identity.NewAttemptID()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(id+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("writing the coordinator's id: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("writing the coordinator's id: %w", err)
	}
	return id, nil
}
