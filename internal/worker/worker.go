// Package worker is the tile worker loop: it takes tile and assemble jobs from the shared
// JetStream consumers and carries each through lease, checkpointed rendering, finalization,
// event and ack, in that order, so no crash can lose a tile or publish it twice
// (docs/design.md, "Flows": Render and Finalize).
package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/checkpoint"
	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/internal/failure"
	"github.com/tilefarm/tilefarm/internal/faults"
	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/internal/wire"
	"github.com/tilefarm/tilefarm/objstore"
)

// Config tunes a worker. Zero values take the defaults.
type Config struct {
	Name        string        // worker identity in logs, leases and events
	Concurrency int           // tiles rendered at once; default 1
	Heartbeat   time.Duration // InProgress + lease renewal; default min(ack-wait, lease TTL)/5
	// CheckpointEvery is the minimum time between checkpoints. 0 is automatic: after a pass,
	// once saving has cost the render at most 2% of the time and 4 MB/s (cadence.go); negative
	// is after every pass.
	CheckpointEvery time.Duration
	PassesPerTile   int // passes a tile's samples are split into; default 32
	// RemoteEvery is the minimum time between remote checkpoint uploads, made with a local
	// checkpoint; 0 (the default) is automatic: never within a second (remoteFloor), so a
	// short tile uploads none; negative uploads with every checkpoint.
	RemoteEvery time.Duration
	RetryBase   time.Duration // first retry backoff; default 1 s
	RetryMax    time.Duration // backoff cap; default 30 s
	FetchWait   time.Duration // server-side expiry of one idle pull; default 2 s
	// HandOnAfter is how long a job waits for its infrastructure in place before the worker
	// hands it on (retryInPlace); default DefaultHandOnAfter.
	HandOnAfter time.Duration
	// BlocklistAfter is how many failed tiles of one job make this worker stop taking the
	// job's tiles; default DefaultBlocklistAfter.
	BlocklistAfter int
	// Faults is what the worker breaks for fault tests (faults.Plan); zero breaks nothing.
	Faults faults.Plan
	// Capabilities are the renderer builds this machine runs and the operator's tags: the
	// worker pulls the tiles of the pools they serve, and announces them in its heartbeat.
	Capabilities queue.Capabilities
	// FFmpeg is the ffmpeg preview movies are encoded with (tileworker --ffmpeg); empty is
	// EnvFFmpeg's, else ffmpeg on the PATH (movie.go).
	FFmpeg string
}

// DefaultPasses is how many passes a JSON scene's tile is split into. A pass is what a kill
// loses at most, so finer is better while a pass costs little: its progress report and, when
// due, a snapshot for the background checkpointer (checkpointer.go).
const DefaultPasses = 32

func (c *Config) normalize(f *queue.Queue) {
	if c.Concurrency <= 0 {
		c.Concurrency = 1
	}
	if c.Heartbeat <= 0 {
		// Renew well inside both the ack-wait and the lease TTL the farm runs with.
		c.Heartbeat = min(f.Cfg.AckWait, f.Cfg.LeaseTTL) / 5
	}
	if c.PassesPerTile <= 0 {
		c.PassesPerTile = DefaultPasses
	}
	if c.RetryBase <= 0 {
		c.RetryBase = time.Second
	}
	if c.RetryMax <= 0 {
		c.RetryMax = 30 * time.Second
	}
	if c.FetchWait <= 0 {
		c.FetchWait = 2 * time.Second
	}
	if c.HandOnAfter <= 0 {
		c.HandOnAfter = DefaultHandOnAfter
	}
	if c.Name == "" {
		c.Name = "worker-" + identity.NewAttemptID()[:8]
	}
	if c.BlocklistAfter <= 0 {
		c.BlocklistAfter = DefaultBlocklistAfter
	}
}

// Deps are what a worker works with. Scenes and Checkpoints may be shared by the workers of
// one process.
type Deps struct {
	Queue       *queue.Queue
	Objects     objstore.Store
	Checkpoints *checkpoint.Local
	Scenes      *Scenes
	Metrics     *metrics.Worker // shared by the workers of a process; nil: a registry of its own
	Log         *slog.Logger
}

// Worker renders tiles from the farm queue.
type Worker struct {
	cfg     Config
	queue   *queue.Queue
	objects objstore.Store
	ckpts   *checkpoint.Local
	scenes  *Scenes
	codec   *checkpoint.Codec
	log     *slog.Logger
	m       *metrics.Worker
	store   *storeHealth
	act     *activity        // what it renders and what it blocklisted (directory.go)
	sources *queue.Sources   // the consumers of the pools it serves
	faults  *faults.Injector // nil unless a fault test asked for some
	publish faults.Publish   // publishes an event: the queue's, wrapped by the faults

	saveCost saveCost  // what the last checkpoint cost the render (cadence.go)
	idle     idleSlots // tile slots that found no work, whose threads a rendering tile may use (lend.go)

	rngMu sync.Mutex
	rng   *rand.Rand
}

// New builds a worker.
func New(cfg Config, d Deps) (*Worker, error) {
	f := d.Queue
	cfg.normalize(f)
	if limit := min(f.Cfg.AckWait, f.Cfg.LeaseTTL) / 2; cfg.Heartbeat > limit {
		return nil, fmt.Errorf("heartbeat %v is too slow for the farm's ack-wait %v and lease TTL %v: use at most %v",
			cfg.Heartbeat, f.Cfg.AckWait, f.Cfg.LeaseTTL, limit)
	}
	codec, err := checkpoint.NewCodec()
	if err != nil {
		return nil, err
	}
	log := d.Log
	if log == nil {
		log = slog.Default()
	}
	log = log.With("worker", cfg.Name)
	if d.Metrics == nil {
		d.Metrics = metrics.NewWorker(metrics.NewRegistry())
	}
	scenes := d.Scenes
	if scenes == nil {
		return nil, errors.New("worker: no scene cache (Deps.Scenes) to load scenes with")
	}
	inj := faults.New(cfg.Faults, log)
	w := &Worker{
		cfg: cfg, queue: f, objects: inj.Store(d.Objects), ckpts: d.Checkpoints, scenes: scenes, codec: codec, m: d.Metrics,
		log: log, act: newActivity(cfg.Concurrency), faults: inj, sources: f.Sources(cfg.Capabilities),
		publish: inj.Publisher(func(ctx context.Context, subject string, data []byte) error {
			_, err := f.Publish(ctx, subject, "", data, nil)
			return err
		}),
		rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0x7f4a7c15)),
	}
	w.store = &storeHealth{w: w, available: true}
	w.m.StoreAvailable.Set(1)
	return w, nil
}

// Name is the worker's identity.
func (w *Worker) Name() string { return w.cfg.Name }

// Run takes jobs until ctx is cancelled: Concurrency slots take tiles, and one more loop takes
// assemblies as soon as they are queued, so a frame completes when its last tile lands even
// while every slot renders. On cancellation in-flight tiles checkpoint, release their leases
// and Nak, so another worker resumes them at once.
func (w *Worker) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		w.beat(ctx)
	}()
	for i := 0; i <= w.cfg.Concurrency; i++ {
		fetch, idle := w.sources.FetchTile, &w.idle
		if i == w.cfg.Concurrency {
			fetch, idle = w.sources.FetchAssembly, nil // the assembly loop renders no tile
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.loop(ctx, fetch, idle)
		}()
	}
	wg.Wait()
	return nil
}

// loop takes one message at a time while the object store is reachable: a worker whose
// store is down takes no new work it could not finish. A tile frees its slot once it is
// rendered, so the slot fetches and renders the next while the tile finalizes: the store's
// writes and fsyncs overlap rendering instead of idling the core. At most one tile finalizes
// behind the one rendering (docs/design.md, "Flows": Render). A tile slot that found no work
// counts in idle until it takes some, so a tile rendering meanwhile may use its threads.
func (w *Worker) loop(ctx context.Context, fetch func(context.Context, time.Duration) (jetstream.Msg, error), idle *idleSlots) {
	finalizing := make(chan struct{})
	close(finalizing)
	defer func() { <-finalizing }()
	var mine idleSlot
	defer mine.set(idle, false)
	handedBack := 0 // hand-backs in a row
	for ctx.Err() == nil {
		if !w.store.wait(ctx) {
			return
		}
		if handedBack > 0 && !queue.Sleep(ctx, handBackPause(handedBack)) {
			return
		}
		began := time.Now()
		msg, err := fetch(ctx, w.cfg.FetchWait)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.log.Warn("fetching work", "err", err)
			queue.Sleep(ctx, w.cfg.RetryBase)
			continue
		}
		mine.set(idle, msg == nil)
		if msg == nil {
			continue
		}
		done, freed := make(chan struct{}), make(chan struct{})
		var once sync.Once
		var back bool
		go func() {
			defer close(done)
			back = w.serve(ctx, msg, began, func() { once.Do(func() { close(freed) }) })
		}()
		select {
		case <-freed:
			handedBack = 0
		case <-done:
			if back {
				handedBack++
			} else {
				handedBack = 0
			}
		}
		<-finalizing
		finalizing = done
	}
}

// delivery is one delivery of one message: what a job's run needs to settle it and to place
// its events in causal order.
type delivery struct {
	msg      jetstream.Msg
	msgID    string
	seq      uint64 // TILES stream sequence
	num      uint64 // delivery count, 1-based
	consumer string // the TILES consumer that delivered it
	attempt  string
	log      *slog.Logger
	// rec keeps the last lines log wrote, debug ones included, for the failure event
	// (attemptlog.go).
	rec *attemptLog
	// free lets the slot take its next job while this one finishes: called once a tile is
	// rendered (loop). Nil when nothing waits for it.
	free func()
	// ready is when the message could first be taken by this slot: the later of its
	// publication and the start of the fetch that returned it; zero when not known.
	ready time.Time
}

// run is one delivery carried through its flow: a tileRun (the Render flow), an assembly or a
// movieRun.
// What differs between the two is this interface; how a failure is settled (fail) is the same.
type run interface {
	// perform carries the delivery through its flow; errSettled means it settled the message.
	perform(ctx context.Context) error
	// failureEvent fills in what a failure event says about the work.
	failureEvent(ev wire.Event) wire.Event
	// promoted reports whether the work is promoted already: the manifests are the truth.
	promoted(ctx context.Context) (bool, error)
	// completePromoted announces and acks work found promoted after all.
	completePromoted(ctx context.Context) error
	// blocklistJob is the job whose failures count toward blocklisting it, "" for none.
	blocklistJob() string
}

// handle dispatches one message and settles it: ack on success, NakWithDelay on a retryable
// failure, dead-letter on a terminal one or when the failure budget is used up.
func (w *Worker) handle(ctx context.Context, msg jetstream.Msg) { w.serve(ctx, msg, time.Time{}, nil) }

// serve is handle for a message a slot began fetching at began (zero if not known), calling
// free (if not nil) as soon as the slot may take its next job. It reports whether it handed
// the message back unrendered.
func (w *Worker) serve(ctx context.Context, msg jetstream.Msg, began time.Time, free func()) (handedBack bool) {
	d := &delivery{msg: msg, msgID: queue.MsgID(msg.Headers()), attempt: identity.NewAttemptID(), num: 1, free: free}
	if md, err := msg.Metadata(); err == nil {
		d.seq, d.num, d.consumer = md.Sequence.Stream, md.NumDelivered, md.Consumer
		if !began.IsZero() {
			d.ready = began
			if md.Timestamp.After(began) {
				d.ready = md.Timestamp
			}
		}
	}
	d.rec = &attemptLog{}
	d.log = recorded(w.log, d.rec).With("attempt_id", d.attempt, "subject", msg.Subject(), "stream_seq", d.seq, "delivery", d.num)
	var r run
	err := func() (err error) {
		defer func() {
			// A panic anywhere in a job must not take the process (and its other slots) down.
			if p := recover(); p != nil {
				err = &failure.PanicError{Value: p}
			}
		}()
		if r, err = w.runOf(d); err != nil {
			return err
		}
		if err := w.lostTooOften(ctx, d); err != nil {
			return err
		}
		if job := r.blocklistJob(); job != "" {
			if w.act.isBlocked(job) {
				// No pause of the slot: the worker avoids the consumer instead, and takes
				// other work meanwhile.
				d.log.Debug("handing back a tile of a blocklisted job")
				w.queue.HandBack(ctx, msg, blocklistNakDelay)
				w.avoidAfterHandBack(d.consumer)
				return errSettled
			}
			w.act.tookFrom(d.consumer)
		}
		return r.perform(ctx)
	}()
	if err == nil || errors.Is(err, errSettled) {
		return handedBack
	}
	return w.fail(ctx, d, r, err)
}

// lostTooOften is the MaxDeliver safety net (docs/design.md, "Failures, deliveries and the
// failure budget"): ErrLostDeliveries, terminal, when MaxDeliver earlier deliveries of d's
// message ended without a failure or a hand-back being recorded (its workers killed, their
// connections lost), nil otherwise. It reads the message's tally only once the delivery count
// alone could reach the limit, so a first delivery costs nothing.
func (w *Worker) lostTooOften(ctx context.Context, d *delivery) error {
	limit := uint64(w.queue.Cfg.MaxDeliver)
	if d.num <= limit {
		return nil
	}
	var tally queue.Tally
	if err := w.retryInPlace(ctx, d, "reading the message's deliveries", func(ctx context.Context) (err error) {
		tally, err = w.queue.Failures.Count(ctx, d.msgID)
		return err
	}); err != nil {
		return err
	}
	lost := d.num - 1 - min(d.num-1, uint64(tally.Explained()))
	if lost < limit {
		return nil
	}
	return failure.Terminal(fmt.Errorf("%w: %d of %d deliveries lost without a word (limit %d)",
		failure.ErrLostDeliveries, lost, d.num-1, limit))
}

// runOf decodes a delivery's message into the run of its flow.
func (w *Worker) runOf(d *delivery) (run, error) {
	switch subject := d.msg.Subject(); {
	case queue.IsRenderSubject(subject):
		var job wire.TileJob
		if err := json.Unmarshal(d.msg.Data(), &job); err != nil {
			return nil, failure.Terminalf("decoding tile job: %w", err)
		}
		return w.newTileRun(d, job), nil
	case queue.IsAssembleSubject(subject) && wire.IsMovieJob(d.msg.Data()):
		var job wire.MovieJob
		if err := json.Unmarshal(d.msg.Data(), &job); err != nil {
			return nil, failure.Terminalf("decoding movie job: %w", err)
		}
		return w.newMovieRun(d, job), nil
	case queue.IsAssembleSubject(subject):
		var job wire.AssembleJob
		if err := json.Unmarshal(d.msg.Data(), &job); err != nil {
			return nil, failure.Terminalf("decoding assemble job: %w", err)
		}
		return w.newAssembly(d, job), nil
	}
	return nil, failure.Terminalf("unknown subject %q", d.msg.Subject())
}

// errSettled means the handler already acked or nakked the message itself.
var errSettled = errors.New("message settled")

// fail settles a delivery that failed with err; r is its run, nil when the message did not
// even decode. Work that is promoted after all is announced and acked, never failed. A
// shutdown, or an outage that leaves unknown whether the work is done or how often it failed,
// hands the message back: no failure, no delivery spent. Anything else is a classified
// failure: counted against the message's failure budget and retried with backoff, or
// dead-lettered when terminal or when the budget is spent. It reports whether it handed the
// message back.
func (w *Worker) fail(ctx context.Context, d *delivery, r run, err error) (handedBack bool) {
	// Cleanup must happen even while shutting down.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if ctx.Err() != nil && !failure.IsTerminal(err) {
		// Graceful shutdown: give the message straight back so another worker resumes it. It
		// is no failure of the tile's.
		d.log.Info("shutting down: returning the job to the queue", "err", err)
		w.queue.HandBack(cctx, d.msg, 0)
		return true
	}
	handBack := func() bool {
		w.m.Retries.WithLabelValues(metrics.RetryAttempt).Inc()
		w.queue.HandBack(cctx, d.msg, queue.Backoff(int(d.num), w.cfg.RetryBase, w.cfg.RetryMax, w.jitter))
		return true
	}
	if errors.Is(err, errHandOn) {
		d.log.Warn("handing the job on to a worker that can reach the farm's store and NATS", "err", err)
		return handBack()
	}
	if r != nil {
		if done, perr := r.promoted(cctx); perr == nil && done {
			d.log.Warn("attempt failed after its work was promoted; completing it", "err", err)
			if cerr := r.completePromoted(cctx); cerr != nil {
				// The reconciler finds the manifest; a redelivery acks it.
				d.log.Warn("completing promoted work", "err", cerr)
			}
			return false
		} else if perr != nil {
			// Unknown whether it is done: retry without spending the failure budget.
			d.log.Warn("cannot tell whether the work is promoted; handing it back", "err", err, "check_err", perr)
			return handBack()
		}
	}
	failures := 0
	terminal := failure.IsTerminal(err)
	if !terminal {
		n, cerr := w.queue.Failures.Add(cctx, d.msgID)
		if cerr != nil {
			d.log.Warn("counting failure; handing the job back without counting it", "err", err, "count_err", cerr)
			return handBack()
		}
		failures = n
		terminal = n >= w.queue.Cfg.MaxFailures
		if terminal {
			err = fmt.Errorf("failed %d times (limit %d): %w", n, w.queue.Cfg.MaxFailures, err)
		}
	}
	// Every failure is logged once with its class, what an operator tailing the worker reads and
	// what the failure event quotes: the renderer's last output first, if the error has any.
	class := failure.Classify(err, objstore.IsRetryable)
	d.rec.add(rendererLines(scene.RendererOutput(err))...)
	var delay time.Duration
	if terminal {
		d.log.Error("dead-lettering", "err", err, "class", class, "failures", failures)
		if dlErr := w.queue.DeadLetterNow(cctx, d.msg, err.Error()); dlErr != nil {
			d.log.Error("dead-lettering failed; leaving message for redelivery", "err", dlErr)
			return false
		}
	} else {
		delay = queue.Backoff(failures, w.cfg.RetryBase, w.cfg.RetryMax, w.jitter)
		d.log.Warn("retrying later", "err", err, "class", class, "failures", failures, "delay", delay)
	}
	// The failure event goes out only once the message's fate is sealed (copied to the DLQ,
	// or about to be retried). A message that did not even decode names nothing to report.
	// It is retried in place like a completion (up to Config.HandOnAfter): a lost one would leave the
	// coordinator believing the tile renders, or, for a dead letter, lost.
	if r != nil {
		ev := r.failureEvent(wire.Event{Error: err.Error(), Terminal: terminal, Code: class, Log: d.rec.tail()})
		if perr := w.retryInPlace(context.WithoutCancel(ctx), d, "publishing failure event", func(ctx context.Context) error {
			return w.publishEvent(ctx, d, ev)
		}); perr != nil {
			d.log.Warn("publishing failure event", "err", perr)
		}
	}
	// Only failures a retry might cure count against the job here: a dead-lettered tile is the
	// farm's verdict on the tile, not on this worker.
	if job := blocklistJob(r); !terminal && job != "" && w.act.failed(job, w.cfg.BlocklistAfter) {
		d.log.Warn("blocklisting job: this worker takes none of its tiles any more", "failed_tiles", w.cfg.BlocklistAfter)
	}
	if terminal {
		return false
	}
	w.m.Retries.WithLabelValues(metrics.RetryAttempt).Inc()
	_ = d.msg.NakWithDelay(delay)
	return false
}

// blocklistJob is r's job for blocklisting, "" for none.
func blocklistJob(r run) string {
	if r == nil {
		return ""
	}
	return r.blocklistJob()
}

func (w *Worker) jitter() float64 {
	w.rngMu.Lock()
	defer w.rngMu.Unlock()
	return w.rng.Float64()
}

// publishEvent publishes an event about delivery d and waits for its PubAck. It goes out
// without a dedup id: the coordinator's projection is idempotent (coorddb.NextTileState), so a
// republished event changes nothing, and EVENTS keeps no dedup entry per event. Seq and
// delivery give the event its causal order.
func (w *Worker) publishEvent(ctx context.Context, d *delivery, ev wire.Event) error {
	ev.Attempt, ev.Worker, ev.Seq, ev.Delivery = d.attempt, w.cfg.Name, d.seq, d.num
	if ev.Time.IsZero() {
		ev.Time = time.Now().UTC()
	}
	if ev.ID == "" {
		ev.ID = ev.Type + ":" + d.attempt
	}
	data, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	return w.publish(ctx, ev.Subject(), data)
}
