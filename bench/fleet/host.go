package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/checkpoint"
	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/internal/worker"
	"github.com/tilefarm/tilefarm/objstore"
)

// HostConfig is one process of the fleet's workers.
type HostConfig struct {
	NATS       string // the servers' URLs, comma-separated
	Store      string // the object store's URL
	Dir        string // the process's checkpoint database
	Count      int    // workers in the process
	NamePrefix string // worker i is named NamePrefix + i
	Listen     string // HTTP: the workers' /metrics and /dispatch (their Samples as JSON)
	Passes     int    // worker.Config.PassesPerTile; 0 is the worker's default
	// CheckpointEvery is worker.Config.CheckpointEvery (0: automatic). The fleet's hosts share
	// this machine's disk where real workers have one each, so fleetnode defaults it to an hour:
	// no tile saves a local checkpoint, which the coordinator and JetStream never see anyway.
	CheckpointEvery time.Duration
	// SharedConn makes the workers of the process share one NATS connection instead of
	// opening one each as real workers do: fewer connections and socket buffers for the server,
	// one socket's ordering and flushes for every worker of the process.
	SharedConn bool
	Log        *slog.Logger // the workers' log
	// Ready is called, if set, once every worker runs, with the HTTP address.
	Ready func(addr string)
}

// startParallel bounds how many workers of a host connect and bind to the farm at once.
const startParallel = 16

// RunHost runs c.Count workers of the real worker code in this process until ctx is done: each
// its own worker.Worker with its own name and one tile slot, its own NATS connection (unless
// SharedConn) and JetStream queue, and the process's object store, checkpoint database, scene
// cache and metrics, which the worker package lets the workers of a process share.
func RunHost(ctx context.Context, c HostConfig) error {
	log := c.Log
	if log == nil {
		log = slog.Default()
	}
	if c.Count < 1 {
		return fmt.Errorf("fleet host: %d workers, want at least 1", c.Count)
	}
	objects, err := objstore.OpenStore(ctx, c.Store)
	if err != nil {
		return fmt.Errorf("opening the store: %w", err)
	}
	ckpts, err := checkpoint.OpenLocal(filepath.Join(c.Dir, "checkpoints.db"))
	if err != nil {
		return err
	}
	defer ckpts.Close()
	reg := metrics.NewRegistry()
	m := metrics.NewWorker(reg)
	scenes, err := worker.NewScenes(objects, "", scene.Kinds{Kind{}}, log)
	if err != nil {
		return err
	}
	rec := &Recorder{}

	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", c.Listen, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	mux.HandleFunc("GET /dispatch", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(rec.Samples())
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	var (
		mu    sync.Mutex
		conns []*nats.Conn
	)
	connect := func(name string) (*nats.Conn, error) {
		nc, err := nats.Connect(c.NATS, nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond),
			nats.Timeout(5*time.Second), nats.PingInterval(5*time.Second), nats.MaxPingsOutstanding(3))
		if err != nil {
			return nil, fmt.Errorf("connecting to NATS %s: %w", c.NATS, err)
		}
		mu.Lock()
		conns = append(conns, nc)
		mu.Unlock()
		return nc, nil
	}
	defer func() {
		for _, nc := range conns {
			nc.Close()
		}
	}()
	var shared *nats.Conn
	if c.SharedConn {
		if shared, err = connect(c.NamePrefix + "shared"); err != nil {
			return err
		}
	}

	// On the way out the workers are stopped, then waited for, then their connections closed.
	var running sync.WaitGroup
	defer running.Wait()
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	start := func(i int) error {
		name := fmt.Sprintf("%s%04d", c.NamePrefix, i)
		nc := shared
		if nc == nil {
			var err error
			if nc, err = connect(name); err != nil {
				return err
			}
		}
		js, err := jetstream.New(nc)
		if err != nil {
			return fmt.Errorf("opening JetStream: %w", err)
		}
		p := newProbe(rec, time.Now())
		q, err := openQueue(wctx, tapJS{JetStream: js, p: p}, log)
		if err != nil {
			return err
		}
		w, err := worker.New(worker.Config{Name: name, Concurrency: 1, PassesPerTile: c.Passes, CheckpointEvery: c.CheckpointEvery},
			worker.Deps{Queue: q, Objects: objects, Checkpoints: ckpts, Scenes: scenes, Metrics: m, Log: log})
		if err != nil {
			return err
		}
		running.Go(func() { _ = w.Run(WithObserver(wctx, p)) })
		return nil
	}
	if err := startAll(c.Count, start); err != nil {
		return err
	}
	if c.Ready != nil {
		c.Ready(ln.Addr().String())
	}
	<-ctx.Done()
	return nil
}

// startAll calls start for 0..n-1, startParallel at a time, and returns their errors joined.
func startAll(n int, start func(int) error) error {
	sem := make(chan struct{}, startParallel)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = start(i)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// openQueue binds to the farm, waiting while the coordinator has not set it up yet.
func openQueue(ctx context.Context, js jetstream.JetStream, log *slog.Logger) (*queue.Queue, error) {
	for {
		q, err := queue.Open(ctx, js)
		if err == nil {
			q.Log = log
			return q, nil
		}
		if !queue.Sleep(ctx, time.Second) {
			return nil, fmt.Errorf("binding to the farm: %w", err)
		}
	}
}
