// Package coordinator turns submissions into tile jobs and keeps the view of where every job,
// frame and tile stands. The truth is the manifests in object storage; the coordinator's
// database is a projection of it, kept current by events and repaired by a reconciler that
// compares unfinished frames with their manifests (docs/design.md, "Manifests are the truth").
package coordinator

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/faults"
	"github.com/tilefarm/tilefarm/internal/flight"
	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/internal/notify"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/objstore"
)

// Config tunes a coordinator. Zero values take the defaults.
type Config struct {
	// MaxPendingTiles is how many tiles may wait to be rendered: a submission that would take
	// the farm over it is refused with a BusyError saying when to retry; 0 means no limit.
	MaxPendingTiles int
	// ReconcileEvery is how often unfinished frames are compared with their manifests; default 30 s.
	ReconcileEvery time.Duration
	// StaleAssembly is how long a frame may wait for its assembly before the reconciler asks
	// for it again (its message may have been lost with a JetStream server's unsynced data);
	// default 10 min.
	StaleAssembly time.Duration
	// RetirePoolsAfter is how long a pool no unfinished frame is dispatched to keeps its
	// consumers before it is retired (retirePools): an artist's next job of the same pool
	// within it finds the workers already pulling; default DefaultRetirePoolsAfter; negative
	// retires a pool at the first look that finds it idle.
	RetirePoolsAfter time.Duration
	// MaxUploads bounds the scene files uploaded at once, each streamed to the store through a
	// buffer of at most one multipart part (objstore.Store.PutStream); default 4.
	MaxUploads int
	// SceneLimits bound what one scene's manifest may name (files, bytes of content); the
	// zero value is bundle.DefaultLimits.
	SceneLimits bundle.Limits
	// SceneGrace is how long a scene's manifest that no job names is kept (uploaded for a
	// submission still to come); scene gc looks every hour. Default DefaultSceneGrace;
	// negative keeps every scene.
	SceneGrace time.Duration
	// Faults is what the coordinator breaks for fault tests (faults.Plan: a crash at one of
	// faults.CoordinatorSeams); zero breaks nothing.
	Faults faults.Plan
	// Notify is where the notifier delivers job events besides the NATS subject: the
	// farm-wide receivers and the secret signing every delivery (docs/design.md,
	// "Notifications").
	Notify notify.Config
	// Address is where clients reach this coordinator's HTTP API, named in its leadership
	// lease so another coordinator of the farm can say who leads (leadership.go).
	Address string
	// CompactJournalAt is the size of the farm's journal above which its leader compacts it
	// (journal.go), if it is also more than four times the database's size; default 64 MiB.
	CompactJournalAt int64
	// CompactJournalEvery is how often the leader looks at the journal's size; default 1 min.
	CompactJournalEvery time.Duration
	// JetStreamHealth says why the farm's JetStream cannot store anything, when the process
	// knows (the embedded server's data disk is full: an error wrapping syscall.ENOSPC), and
	// nil otherwise; a write this coordinator cannot journal is answered with it. nil: never.
	JetStreamHealth func() error
	// ID names this coordinator in its leadership lease: its database's, so a coordinator
	// restarted on the same data takes its own lease back at once; "" is one per run.
	ID string
}

func (c *Config) normalize() {
	if c.ReconcileEvery <= 0 {
		c.ReconcileEvery = 30 * time.Second
	}
	if c.StaleAssembly <= 0 {
		c.StaleAssembly = 10 * time.Minute
	}
	if c.MaxUploads <= 0 {
		c.MaxUploads = 4
	}
	if c.SceneGrace == 0 {
		c.SceneGrace = DefaultSceneGrace
	}
	if c.SceneLimits.Files <= 0 {
		c.SceneLimits.Files = bundle.DefaultLimits.Files
	}
	if c.CompactJournalAt <= 0 {
		c.CompactJournalAt = 64 << 20
	}
	if c.CompactJournalEvery <= 0 {
		c.CompactJournalEvery = time.Minute
	}
	if c.RetirePoolsAfter == 0 {
		c.RetirePoolsAfter = DefaultRetirePoolsAfter
	}
}

// Deps are what a coordinator works with.
type Deps struct {
	DB      *coorddb.DB
	Queue   *queue.Queue
	Kinds   scene.Kinds // the kinds of scene submissions may be of
	NATS    *nats.Conn  // carries the relay's asynchronous publishes
	Objects objstore.Store
	Metrics *metrics.Coordinator // nil: a registry of its own
	Log     *slog.Logger
}

// Coordinator is the farm's brain. Create with New, then Run.
type Coordinator struct {
	cfg      Config
	leaderID string   // this coordinator's name in the farm's leadership lease (leadership.go)
	journal  *journal // the farm's journal, which the database writes to while this coordinator leads
	db       *coorddb.DB
	queue    *queue.Queue
	kinds    scene.Kinds
	nc       *nats.Conn
	objects  objstore.Store
	m        *metrics.Coordinator
	log      *slog.Logger
	now      func() time.Time
	scenes   *flight.Cache[*sceneInfo] // what submissions need of stored scenes, by version
	uploads  chan struct{}             // one token per scene file upload in progress
	sceneGC  sync.RWMutex              // held for writing while scene gc deletes manifests (CollectScenes)
	limits   bundle.Limits             // of a scene's manifest (Config.SceneLimits)
	// uploaded are the files PutContent stored lately, which a manifest's check need not ask
	// the store about (stored).
	uploaded *flight.Cache[uploadedContent]

	faults    *faults.Injector // nil unless a fault test asked for a crash
	progress  *progressTracker // tiles in progress, in memory only (progress.go)
	directory workerDirectory  // live workers, refreshed by watchWorkers (operate.go)
	eta       *etaTracker      // samples per second of unfinished jobs (operate.go)
	statuses  statusCache      // each job's status by the fingerprint of its records (status.go)
	lost      lostTracker      // frames the last reconciliation found with lost tiles (lost.go)
	notifier  *notify.Notifier // delivers the events announce records (announce.go)
	thumbs    *thumbnails      // finished frames' thumbnails, by frame key (thumbnails.go)
	fleet     *fleetHistory    // each worker's busy slots and recent failures (fleet.go)

	completions atomic.Int64 // tile completions seen in events, for the drain rate
	drainMu     sync.Mutex
	drain       rateMeter // completions per second, sampled by sampleMetrics

	relayKick chan struct{}
	poolsKick chan struct{} // retireLoop's
	// poolIdle is when each pool retirePools found idle was first found so, by Pool.ID; only
	// retireLoop's goroutine touches it.
	poolIdle  map[string]time.Time
	changedMu sync.Mutex
	changed   chan struct{} // closed and replaced on every projection change, for waiters

	// streamMax is how long one GET /v1/events stream lasts before the server ends it (the
	// page reconnects); streamsDone is closed by StopStreams to end every stream at once.
	streamMax   time.Duration
	streamsDone chan struct{}
	stopStreams sync.Once
}

// New wires a coordinator.
func New(cfg Config, d Deps) *Coordinator {
	cfg.normalize()
	log := d.Log
	if log == nil {
		log = slog.Default()
	}
	if d.Metrics == nil {
		d.Metrics = metrics.NewCoordinator(metrics.NewRegistry())
	}
	c := &Coordinator{
		cfg: cfg, db: d.DB, queue: d.Queue, kinds: d.Kinds, nc: d.NATS, objects: d.Objects, m: d.Metrics, log: log,
		now:       func() time.Time { return time.Now().UTC() },
		faults:    faults.New(cfg.Faults, log),
		scenes:    flight.New[*sceneInfo](8),
		uploads:   make(chan struct{}, cfg.MaxUploads),
		limits:    cfg.SceneLimits,
		uploaded:  flight.New[uploadedContent](maxFreshUploads),
		relayKick: make(chan struct{}, 1),
		poolsKick: make(chan struct{}, 1),
		poolIdle:  map[string]time.Time{},
		changed:   make(chan struct{}),
		eta:       newETATracker(),
		thumbs:    newThumbnails(),
		fleet:     newFleetHistory(),

		streamMax:   defaultStreamMax,
		streamsDone: make(chan struct{}),
		leaderID:    cfg.ID,
	}
	if c.leaderID == "" {
		c.leaderID = identity.NewAttemptID()
	}
	c.journal = &journal{ended: make(chan struct{}, 1), await: c.awaitLeading, refusals: c.m.JournalRefusals.Inc, health: cfg.JetStreamHealth}
	if d.Queue != nil && d.Queue.Journal != nil && d.DB != nil {
		c.journal.js, c.journal.writer = d.Queue.JS, c.leaderID
		d.DB.SetJournal(c.journal)
	}
	c.notifier = notify.New(cfg.Notify, notify.Deps{DB: d.DB, NATS: d.NATS, Metrics: d.Metrics, Faults: c.faults, Log: log})
	// The tracker asks c.now at each use, so a test that sets the clock sets it for progress too.
	c.progress = newProgressTracker(func() time.Time { return c.now() }, log)
	return c
}

// loop is one of the coordinator's long-running duties; runLoops restarts it after an error.
type loop func(context.Context) error

// Run runs the coordinator until ctx is done. Every coordinator of a farm runs the progress
// watcher, the metrics sampler, the worker directory (read from a watch of the heartbeats) and
// its part in the farm's leadership (leadLoop): following the farm's journal while another
// leads, and, while it leads, the loops that act on the farm (leaderLoops: the outbox relay,
// the event consumer, the reconciler, pool retirement, the notifier and scene gc). Each
// restarts after an error, so a NATS or storage outage heals by itself.
func (c *Coordinator) Run(ctx context.Context) error {
	// The workers page's recent failures, read before any event is applied (fleet.go); a
	// failure to read them is tried again when the page asks.
	if err := c.seedFleetFailures(ctx); err != nil && ctx.Err() == nil {
		c.log.Warn("reading the workers' recent failures", "err", err)
	}
	runLoops(ctx, c.log, map[string]loop{
		"progress watcher":  c.watchProgress,
		"metrics sampler":   c.sampleMetrics,
		"worker directory":  c.watchWorkers,
		"worker heartbeats": func(ctx context.Context) error { return c.queue.Workers.Follow(ctx, c.fleet.beat) },
		"leadership":        c.leadLoop,
	})
	return nil
}

// leaderLoops are the loops only the farm's leader runs, during a term (journal.go).
func (c *Coordinator) leaderLoops() map[string]loop {
	return map[string]loop{
		"outbox relay":       c.relay,
		"event consumer":     c.consumeEvents,
		"reconciler":         c.reconcileLoop,
		"pool retirement":    c.retireLoop,
		"notifier":           c.notifier.Run,
		"scene gc":           c.sceneGCLoop,
		"journal compaction": c.compactLoop,
	}
}

// runLoops runs every loop until ctx is done, each restarted a second after an error.
func runLoops(ctx context.Context, log *slog.Logger, loops map[string]loop) {
	var wg sync.WaitGroup
	for name, loop := range loops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if err := loop(ctx); err != nil && ctx.Err() == nil {
					log.Error("coordinator loop failed; restarting", "loop", name, "err", err)
					queue.Sleep(ctx, time.Second)
				}
			}
		}()
	}
	wg.Wait()
}

func (c *Coordinator) kickRelay() {
	select {
	case c.relayKick <- struct{}{}:
	default:
	}
}

// notify wakes everyone waiting for a projection change.
func (c *Coordinator) notify() {
	c.changedMu.Lock()
	close(c.changed)
	c.changed = make(chan struct{})
	c.changedMu.Unlock()
}

// Changed returns a channel closed at the next projection change.
func (c *Coordinator) Changed() <-chan struct{} {
	c.changedMu.Lock()
	defer c.changedMu.Unlock()
	return c.changed
}

// counted adds to the metrics what a committed projection changed.
func (c *Coordinator) counted(p *projection) {
	if p == nil {
		return
	}
	c.m.DeadLetters.WithLabelValues(metrics.DeadLetterTile).Add(float64(p.tileDeadLetters))
	c.m.DeadLetters.WithLabelValues(metrics.DeadLetterAssembly).Add(float64(p.assemblyDeadLetters))
	c.m.FramesCompleted.Add(float64(p.framesCompleted))
	if p.notices > 0 {
		c.notifier.Kick()
	}
	if p.framesCompleted > 0 || p.stopped {
		c.kickPools() // a pool may have no frame wanted left (dispatch.go)
	}
}

// sampleMetrics keeps the gauges of the queue and the outbox current, every 2 s.
func (c *Coordinator) sampleMetrics(ctx context.Context) error {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		depth, oldest, err := c.queue.Depth(ctx)
		if err == nil {
			c.m.QueueDepth.Set(float64(depth))
			c.m.OldestMessageAge.Set(oldest.Seconds())
		}
		if n, err := c.db.OutboxLen(ctx); err == nil {
			c.m.OutboxPending.Set(float64(n))
		}
		c.drainMu.Lock()
		c.drain.observe(c.now(), float64(c.completions.Load()))
		c.drainMu.Unlock()
		c.sampleETAs(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
