// Package worker is the tile worker loop: it takes tile and assemble jobs from the shared
// JetStream consumer and carries each through lease, checkpointed rendering, finalization, event
// and ack, in that order, so no crash can lose a tile or publish it twice.
package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/farm"
	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/render"
	"github.com/tilefarm/tilefarm/tiles"
)

// Config tunes a worker. Zero values take the defaults of DESIGN.md.
type Config struct {
	Name              string        // worker identity in logs, leases and events
	Concurrency       int           // tiles rendered at once; default 1
	Heartbeat         time.Duration // InProgress + lease renewal; default 3 s
	CheckpointEvery   time.Duration // minimum time between checkpoints; 0 means the default 2 s, negative means after every pass
	PassesPerTile     int           // passes a tile's samples are split into; default 16
	RemoteCheckpoints bool          // also upload checkpoints to the object store
	RemoteEvery       time.Duration // minimum time between remote checkpoint uploads; 0 means 5 s, negative means every checkpoint
	RetryBase         time.Duration // first NakWithDelay backoff; default 1 s
	RetryMax          time.Duration // backoff cap; default 30 s
	FetchWait         time.Duration // how long one Fetch(1) waits; default 2 s
	InfraRetryFor     time.Duration // how long a storage outage is retried in place before Nak; default 2 min
	SceneCacheDir     string        // disk cache of scene bundles by scene_version; empty: memory only
	Faults            Faults
}

// Faults are test hooks that make the worker misbehave at named seams, so fault tests can
// exercise real processes without special builds.
type Faults struct {
	PanicFrame   int           // with PanicTile: the frame whose tile panics in every attempt
	PanicTile    render.Rect   // the rectangle of that tile
	PanicTileSet bool          // PanicFrame and PanicTile are set
	PassDelay    time.Duration // sleep after each pass, so a test can kill a worker mid-tile
}

func (c *Config) normalize() {
	if c.Concurrency <= 0 {
		c.Concurrency = 1
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = 3 * time.Second
	}
	switch {
	case c.CheckpointEvery == 0:
		c.CheckpointEvery = 2 * time.Second
	case c.CheckpointEvery < 0:
		c.CheckpointEvery = 0
	}
	if c.PassesPerTile <= 0 {
		c.PassesPerTile = 16
	}
	switch {
	case c.RemoteEvery == 0:
		c.RemoteEvery = 5 * time.Second
	case c.RemoteEvery < 0:
		c.RemoteEvery = 0
	}
	if c.RetryBase <= 0 {
		c.RetryBase = time.Second
	}
	if c.RetryMax <= 0 {
		c.RetryMax = 30 * time.Second
	}
	if c.InfraRetryFor <= 0 {
		c.InfraRetryFor = 2 * time.Minute
	}
	if c.FetchWait <= 0 {
		c.FetchWait = 2 * time.Second
	}
	if c.Name == "" {
		c.Name = "worker-" + tiles.NewAttemptID()[:8]
	}
}

// maxCachedScenes bounds the parsed scenes (BVHs, meshes) a worker keeps in memory.
const maxCachedScenes = 4

// Worker renders tiles from the farm queue.
type Worker struct {
	cfg     Config
	farm    *queue.Farm
	objects finalize.Store
	ckpts   *tiles.CheckpointStore
	codec   *tiles.Codec
	log     *slog.Logger
	m       *metrics.Metrics

	mu         sync.Mutex
	scenes     map[string]*render.Scene // by scene_version
	sceneOrder []string                 // oldest first, for eviction

	rngMu sync.Mutex
	rng   *rand.Rand
}

// New builds a worker. ckpts may be shared by the workers of one process.
func New(cfg Config, f *queue.Farm, objects finalize.Store, ckpts *tiles.CheckpointStore, m *metrics.Metrics, log *slog.Logger) (*Worker, error) {
	if cfg.Heartbeat <= 0 {
		// Renew well inside both the ack-wait and the lease TTL the farm runs with.
		cfg.Heartbeat = min(f.Cfg.AckWait, f.Cfg.LeaseTTL) / 5
	}
	cfg.normalize()
	if limit := min(f.Cfg.AckWait, f.Cfg.LeaseTTL) / 2; cfg.Heartbeat > limit {
		return nil, fmt.Errorf("heartbeat %v is too slow for the farm's ack-wait %v and lease TTL %v: use at most %v",
			cfg.Heartbeat, f.Cfg.AckWait, f.Cfg.LeaseTTL, limit)
	}
	codec, err := tiles.NewCodec()
	if err != nil {
		return nil, err
	}
	return &Worker{
		cfg: cfg, farm: f, objects: objects, ckpts: ckpts, codec: codec, m: m,
		log:    log.With("worker", cfg.Name),
		scenes: map[string]*render.Scene{},
		rng:    rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0x7f4a7c15)),
	}, nil
}

// Name is the worker's identity.
func (w *Worker) Name() string { return w.cfg.Name }

// Run takes jobs until ctx is cancelled. On cancellation in-flight tiles checkpoint, release
// their leases and Nak, so another worker resumes them at once.
func (w *Worker) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for i := 0; i < w.cfg.Concurrency; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.slot(ctx)
		}()
	}
	wg.Wait()
	return nil
}

func (w *Worker) slot(ctx context.Context) {
	for ctx.Err() == nil {
		msg, err := w.farm.FetchOne(ctx, w.cfg.FetchWait)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.log.Warn("fetching work", "err", err)
			queue.Sleep(ctx, w.cfg.RetryBase)
			continue
		}
		if msg == nil {
			continue
		}
		w.handle(ctx, msg)
	}
}

// handle dispatches one message and settles it: ack on success, NakWithDelay on a retryable
// failure, dead-letter on a terminal one or when the deliveries are used up.
func (w *Worker) handle(ctx context.Context, msg jetstream.Msg) {
	attempt := tiles.NewAttemptID()
	log := w.log.With("attempt_id", attempt, "subject", msg.Subject())
	var describe func(error) farm.Event
	err := func() (err error) {
		defer func() {
			// A panic anywhere in a job must not take the process (and its other slots) down.
			if r := recover(); r != nil {
				err = &farm.PanicError{Value: r}
			}
		}()
		switch msg.Subject() {
		case queue.SubjectRender:
			var job farm.TileJob
			if err := json.Unmarshal(msg.Data(), &job); err != nil {
				return farm.Terminalf("decoding tile job: %w", err)
			}
			log = log.With("job_id", job.JobID, "frame_key", job.FrameKey, "tile_key", job.TileKey)
			describe = func(e error) farm.Event {
				return farm.Event{Type: farm.EventTileFailed, JobID: job.JobID, TileKey: job.TileKey, FrameKey: job.FrameKey}
			}
			return w.renderTile(ctx, msg, job, attempt, log)
		case queue.SubjectAssemble:
			var job farm.AssembleJob
			if err := json.Unmarshal(msg.Data(), &job); err != nil {
				return farm.Terminalf("decoding assemble job: %w", err)
			}
			log = log.With("job_id", job.JobID, "frame_key", job.FrameKey)
			describe = func(e error) farm.Event {
				return farm.Event{Type: farm.EventFrameFailed, JobID: job.JobID, FrameKey: job.FrameKey}
			}
			return w.assemble(ctx, msg, job, attempt, log)
		}
		return farm.Terminalf("unknown subject %q", msg.Subject())
	}()
	if err == nil || errors.Is(err, errSettled) {
		return
	}
	w.fail(ctx, msg, attempt, err, describe, log)
}

// errSettled means the handler already acked or nakked the message itself.
var errSettled = errors.New("message settled")

func (w *Worker) fail(ctx context.Context, msg jetstream.Msg, attempt string, err error, describe func(error) farm.Event, log *slog.Logger) {
	// Cleanup must happen even while shutting down.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if ctx.Err() != nil && !farm.IsTerminal(err) {
		// Graceful shutdown: give the message straight back so another worker resumes it.
		log.Info("shutting down: returning tile to the queue", "err", err)
		_ = msg.Nak()
		return
	}
	delivered := uint64(1)
	if md, mdErr := msg.Metadata(); mdErr == nil {
		delivered = md.NumDelivered
	}
	terminal := farm.IsTerminal(err) || delivered >= uint64(w.farm.Cfg.MaxDeliver)
	if terminal {
		log.Error("dead-lettering", "err", err, "deliveries", delivered)
		if dlErr := w.farm.DeadLetterNow(cctx, msg, err.Error()); dlErr != nil {
			log.Error("dead-lettering failed; leaving message for redelivery", "err", dlErr)
			return
		}
		w.m.DeadLetters.Inc()
	}
	// The failure event goes out only once the message's fate is sealed (copied to the DLQ, or about to be retried).
	if describe != nil {
		ev := describe(err)
		ev.Error, ev.Terminal, ev.Attempt, ev.Worker = err.Error(), terminal, attempt, w.cfg.Name
		ev.Code = farm.ErrorCode(err, finalize.IsRetryable)
		ev.ID = fmt.Sprintf("%s:%s", ev.Type, attempt)
		if perr := w.publishEvent(cctx, ev); perr != nil {
			log.Warn("publishing failure event", "err", perr)
		}
	}
	if terminal {
		return
	}
	delay := queue.Backoff(int(delivered), w.cfg.RetryBase, w.cfg.RetryMax, w.jitter)
	log.Warn("retrying later", "err", err, "deliveries", delivered, "delay", delay)
	w.m.Retries.Inc()
	_ = msg.NakWithDelay(delay)
}

func (w *Worker) jitter() float64 {
	w.rngMu.Lock()
	defer w.rngMu.Unlock()
	return w.rng.Float64()
}

// publishEvent publishes an event and waits for its PubAck.
func (w *Worker) publishEvent(ctx context.Context, ev farm.Event) error {
	if ev.Time.IsZero() {
		ev.Time = time.Now().UTC()
	}
	data, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	_, err = w.farm.Publish(ctx, ev.Subject(), ev.ID, data, nil)
	return err
}

// scene returns the parsed scene for a version: from memory, else the local disk cache, else
// the object store (then cached on disk, so a restarted worker does not download it again).
func (w *Worker) scene(ctx context.Context, version string) (*render.Scene, error) {
	w.mu.Lock()
	s, ok := w.scenes[version]
	w.mu.Unlock()
	if ok {
		return s, nil
	}
	b, err := w.cachedBundle(version)
	if err != nil {
		data, gerr := w.objects.Get(ctx, farm.SceneKey(version))
		if gerr != nil {
			if errors.Is(gerr, finalize.ErrNotFound) {
				return nil, farm.Terminalf("scene %s is not in the object store: %w", version, gerr)
			}
			return nil, fmt.Errorf("fetching scene %s: %w", version, gerr)
		}
		if b, err = farm.DecodeBundle(data); err != nil {
			return nil, farm.Terminal(err)
		}
		if got := b.Version(); got != version {
			return nil, fmt.Errorf("scene bundle %s has version %s: corrupt download", version, got)
		}
		if w.cfg.SceneCacheDir != "" {
			err := os.MkdirAll(w.cfg.SceneCacheDir, 0o755)
			if err == nil {
				err = finalize.WriteFileAtomic(w.scenePath(version), data)
			}
			if err != nil {
				w.log.Warn("caching scene", "scene_version", version, "err", err)
			}
		}
	}
	s, err = b.Parse()
	if err != nil {
		return nil, farm.Terminalf("parsing scene %s: %w", version, err)
	}
	w.mu.Lock()
	if _, ok := w.scenes[version]; !ok {
		w.sceneOrder = append(w.sceneOrder, version)
		if len(w.sceneOrder) > maxCachedScenes {
			// A long-lived worker sees many shots; keep only the newest parsed scenes in memory.
			delete(w.scenes, w.sceneOrder[0])
			w.sceneOrder = w.sceneOrder[1:]
		}
	}
	w.scenes[version] = s
	w.mu.Unlock()
	return s, nil
}

func (w *Worker) scenePath(version string) string {
	return filepath.Join(w.cfg.SceneCacheDir, version+".json")
}

// cachedBundle reads a bundle from the disk cache; one that does not hash to its name is ignored.
func (w *Worker) cachedBundle(version string) (*farm.Bundle, error) {
	if w.cfg.SceneCacheDir == "" {
		return nil, os.ErrNotExist
	}
	data, err := os.ReadFile(w.scenePath(version))
	if err != nil {
		return nil, err
	}
	b, err := farm.DecodeBundle(data)
	if err != nil || b.Version() != version {
		w.log.Warn("ignoring corrupt cached scene", "scene_version", version)
		return nil, errors.New("corrupt cached scene")
	}
	return b, nil
}
