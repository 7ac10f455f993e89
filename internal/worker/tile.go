package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/tilefarm/tilefarm/checkpoint"
	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/failure"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/internal/wire"
	"github.com/tilefarm/tilefarm/objstore"
	"github.com/tilefarm/tilefarm/raster"
	"github.com/tilefarm/tilefarm/render"
)

// tileRun is one delivery of one tile job being carried through the Render flow.
type tileRun struct {
	*delivery
	job   wire.TileJob
	lease *queue.Lease
	hb    *heartbeat       // nil until the lease is held
	ckpt  *checkpointer    // nil until the render begins
	left  *leftCheckpoints // nil: unknown, complete deletes both
	// finish ends the heartbeat and releases the lease; after a lost lease it only stops.
	finish func()
}

// leftCheckpoints says which checkpoints of a tile may exist once a run has rendered it: those
// its resume found (or could not rule out) and those it saved. complete deletes only those, so a
// tile rendered in one go costs no store request and no local commit for checkpoints it never
// had. One a zombie saved in between is removed by PruneCheckpoints locally and by GC remotely.
type leftCheckpoints struct{ local, remote bool }

func (r *tileRun) manifestKey() string { return layout.TileManifestKey(r.job.FrameKey, r.job.TileKey) }

// describeTile fills in how a tile delivery is announced when it fails or turns out done.
func (w *Worker) describeTile(d *delivery, job wire.TileJob) {
	d.log = d.log.With("job_id", job.JobID, "frame_key", job.FrameKey, "tile_key", job.TileKey)
	d.jobID = job.JobID
	d.describe = func(ev wire.Event) wire.Event {
		ev.Type, ev.JobID, ev.TileKey, ev.TileIndex, ev.FrameKey = wire.EventTileFailed, job.JobID, job.TileKey, job.Index, job.FrameKey
		return ev
	}
	key := layout.TileManifestKey(job.FrameKey, job.TileKey)
	d.promoted = func(ctx context.Context) (bool, error) { return finalize.ManifestExists(ctx, w.objects, key) }
	d.complete = func(ctx context.Context, d *delivery) error {
		return w.complete(ctx, &tileRun{delivery: d, job: job}, 0, 0, true)
	}
}

// renderTile carries one tile job through the Render flow (docs/design.md, "Flows").
func (w *Worker) renderTile(ctx context.Context, r *tileRun) error {
	if err := checkIdentity(r.job); err != nil {
		return err
	}
	// 1. Already promoted: tell the coordinator (it may have missed the event) and ack. A first
	// delivery skips this read, a store request per tile: the check under the lease below
	// catches a duplicate all the same, at the cost of a lease taken and released.
	if r.num > 1 {
		if done, err := w.promotedNow(ctx, r); err != nil || done {
			return err
		}
	}
	if f := w.cfg.Faults.BeforeLease; f != nil {
		f(r.job)
	}
	w.crashAt(r.log, "before-lease")
	if w.frameDropped(ctx, r) {
		return w.drop(ctx, r)
	}

	// 2. Lease with fencing token; from here on the heartbeat keeps lease and message alive
	// until the tile is settled.
	lease, err := w.acquire(ctx, r)
	if err != nil || lease == nil {
		return err
	}
	r.lease = lease
	r.log = r.log.With("fencing_token", lease.Token)
	// The holder may have promoted the tile just before its lease went: check again, or a
	// duplicate would render the whole tile a second time.
	if done, err := w.promotedNow(ctx, r); err != nil || done {
		w.release(ctx, lease, r)
		return err
	}
	r.hb = w.startHeartbeat(ctx, r.msg, lease, r.log)
	released := false
	r.finish = func() {
		if released {
			return
		}
		released = true
		if lost := r.hb.stop(); lost != nil {
			r.log.Warn("lease lost; abandoning tile", "err", lost)
			return
		}
		w.release(ctx, lease, r)
	}
	defer r.finish()
	w.act.start(r.attempt, api.WorkerTile{JobID: r.job.JobID, Frame: r.job.Frame, TileKey: r.job.TileKey, SamplesTotal: r.job.Settings.SPP})
	defer w.act.end(r.attempt)
	err = w.renderAndPromote(r.hb.ctx, r)
	if errors.Is(err, errDropped) {
		return w.drop(ctx, r)
	}
	if errors.Is(context.Cause(r.hb.ctx), queue.ErrLeaseLost) || errors.Is(err, queue.ErrLeaseLost) {
		// No finalize, no ack: the new lease holder owns the tile now.
		if err != nil && errors.Is(err, queue.ErrLeaseLost) {
			r.log.Warn("lease lost; abandoning tile", "err", err)
		}
		return errSettled
	}
	return err
}

// promotedNow checks the tile's manifest (retrying a store outage in place); when it exists
// it announces the tile completed and acks the duplicate delivery.
func (w *Worker) promotedNow(ctx context.Context, r *tileRun) (bool, error) {
	var done bool
	err := w.retryStore(ctx, r.delivery, "checking tile manifest", func(ctx context.Context) (err error) {
		done, err = finalize.ManifestExists(ctx, w.objects, r.manifestKey())
		return err
	})
	if err != nil || !done {
		return false, err
	}
	w.m.DuplicatesSuppressed.WithLabelValues(metrics.LayerManifestCheck).Inc()
	r.log.Info("tile already promoted; acking duplicate delivery")
	return true, w.complete(ctx, r, 0, 0, true)
}

// checkIdentity recomputes the job's keys with this worker's renderer. A mismatch means the job
// was made by a build with another render.Version: rendering it here would resume foreign
// checkpoints and promote pixels under keys that promise other ones.
func checkIdentity(job wire.TileJob) error {
	sh := identity.SettingsHash(job.Settings)
	fk := identity.FrameKey(job.SceneVersion, job.Settings.Camera, job.Frame, sh)
	if fk != job.FrameKey || identity.TileKey(fk, job.Rect) != job.TileKey ||
		identity.InputHashFor(job.SceneVersion, sh, job.Frame, job.Rect) != job.InputHash {
		return failure.Terminalf("build mismatch: tile %s was not made for render version %s (all workers of a farm must run the coordinator's build)", job.TileKey, render.Version)
	}
	return nil
}

// acquire takes the tile's lease. While another live owner holds it (a redelivery or duplicate
// of a tile still rendering elsewhere) it waits for as long as that owner keeps renewing,
// keeping the message alive, instead of spending deliveries: until the tile is promoted (then
// it acks the duplicate) or the lease is free. A nil lease means the message is settled.
func (w *Worker) acquire(ctx context.Context, r *tileRun) (*queue.Lease, error) {
	waiting := false
	for try := 1; ; try++ {
		lease, err := w.queue.Leases.Acquire(ctx, r.job.TileKey, w.cfg.Name+"/"+r.attempt)
		if err == nil {
			return lease, nil
		}
		switch {
		case errors.Is(err, queue.ErrLeaseHeld):
			if !waiting {
				waiting = true
				r.log.Info("tile leased by another worker; waiting while it renews")
			}
		case isInfra(err):
			if try == 1 || try%10 == 0 {
				r.log.Warn("acquiring lease; retrying in place", "err", err)
			}
		default:
			return nil, fmt.Errorf("acquiring lease: %w", err)
		}
		_ = r.msg.InProgress()
		if !queue.Sleep(ctx, w.cfg.Heartbeat) {
			return nil, ctx.Err()
		}
		if !waiting {
			continue
		}
		if done, err := finalize.ManifestExists(ctx, w.objects, r.manifestKey()); err == nil && done {
			w.m.DuplicatesSuppressed.WithLabelValues(metrics.LayerManifestCheck).Inc()
			r.log.Info("tile promoted by the lease holder; acking duplicate delivery")
			return nil, w.complete(ctx, r, 0, 0, true)
		}
	}
}

// renderAndPromote is steps 3-5 of the Render flow, run under a live lease.
func (w *Worker) renderAndPromote(ctx context.Context, r *tileRun) error {
	var sc scene.Renderer
	err := w.retryStore(ctx, r.delivery, "fetching scene", func(ctx context.Context) (err error) {
		sc, err = w.scenes.Get(ctx, r.job.SceneVersion)
		return err
	})
	if err != nil {
		return err
	}
	tile, err := sc.NewTile(ctx, r.job.Settings, r.job.Frame, r.job.Rect)
	if err != nil {
		return err
	}

	// 3. Resume from a checkpoint made from the same inputs by the same build.
	r.left = &leftCheckpoints{}
	recovered := w.resume(ctx, tile, r)
	if err := w.retryInPlace(ctx, r.delivery, "publishing start event", func(ctx context.Context) error {
		return w.publishEvent(ctx, r.delivery, wire.Event{Type: wire.EventTileStarted, JobID: r.job.JobID, TileKey: r.job.TileKey,
			TileIndex: r.job.Index, FrameKey: r.job.FrameKey, SamplesRecovered: recovered})
	}); err != nil {
		return err
	}

	// 4. Render in passes; a lost lease cancels ctx at once.
	start := time.Now()
	r.ckpt = w.startCheckpointer(ctx, r, start)
	defer r.ckpt.stop()
	err = func() error {
		// Deferred: a panic in a pass (recovered by handle) must not leave the tile in flight.
		w.m.TilesInFlight.Inc()
		defer w.m.TilesInFlight.Dec()
		return w.renderPasses(ctx, tile, r)
	}()
	if err != nil {
		if ctx.Err() != nil && context.Cause(ctx) == ctx.Err() {
			// Shutting down: keep what was rendered for whoever resumes the tile, but never hang
			// the shutdown on a slow store.
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			r.ckpt.saveNow(sctx, tile, true)
			cancel()
		}
		return err
	}
	w.m.TileRenderSeconds.Observe(time.Since(start).Seconds())
	if r.free != nil {
		r.free() // the slot renders its next tile while this one finalizes
	}
	// The finished state is checkpointed too when it is due, so a storage outage during finalize
	// costs no more rendering than a kill would.
	if r.ckpt.stop(); r.ckpt.local.due(time.Now()) {
		r.ckpt.saveNow(ctx, tile, false)
	}

	// 5. Finalize, but only while still holding the lease (fencing).
	if err := r.hb.check(ctx); err != nil {
		return fmt.Errorf("before finalize: %w", err)
	}
	var p finalize.Promotion
	// The manifest was absent when the lease was taken: the first try skips reading it again.
	opts := []finalize.PromoteOption{finalize.AfterUpload(func() { w.crashAt(r.log, "after-upload") }), finalize.Absent()}
	err = w.retryStore(ctx, r.delivery, "promoting tile", func(ctx context.Context) (err error) {
		p, err = finalize.Promote(ctx, w.objects, r.manifestKey(), r.attempt, identity.BuildFor(r.job.Settings),
			[]finalize.Output{{Name: layout.TileOutputName, Data: raster.EncodeTile(tile.Pixels())}},
			map[string]string{"tile_key": r.job.TileKey, "frame_key": r.job.FrameKey, "input_hash": r.job.InputHash, "worker": w.cfg.Name},
			opts...)
		opts = opts[:1] // a retry reads the manifest first, and may find its own promotion
		return err
	})
	if err != nil {
		w.m.FinalizeFailures.Inc()
		if errors.Is(err, finalize.ErrConflict) {
			w.m.DuplicatesSuppressed.WithLabelValues(metrics.LayerManifestConflict).Inc()
			return failure.Terminalf("promoting tile: %w", err)
		}
		return err
	}
	w.crashAt(r.log, "after-manifest")
	if p.Existing {
		w.m.DuplicatesSuppressed.WithLabelValues(metrics.LayerManifestExisting).Inc()
	} else {
		w.m.TilesCompleted.Inc()
	}
	return w.complete(ctx, r, r.job.Settings.SPP-recovered, recovered, p.Existing)
}

func (w *Worker) release(ctx context.Context, lease *queue.Lease, r *tileRun) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := w.queue.Leases.Release(rctx, lease); err != nil {
		r.log.Warn("releasing lease", "err", err)
	}
}

// complete publishes tile.completed (retrying a NATS outage in place), drops the checkpoints,
// releases the lease and acks last.
func (w *Worker) complete(ctx context.Context, r *tileRun, rendered, recovered int, duplicate bool) error {
	ev := wire.Event{ID: wire.EventTileCompleted + ":" + r.job.TileKey, Type: wire.EventTileCompleted, JobID: r.job.JobID,
		TileKey: r.job.TileKey, TileIndex: r.job.Index, FrameKey: r.job.FrameKey,
		SamplesRendered: rendered, SamplesRecovered: recovered, Duplicate: duplicate}
	if err := w.retryInPlace(ctx, r.delivery, "publishing completion event", func(ctx context.Context) error {
		return w.publishEvent(ctx, r.delivery, ev)
	}); err != nil {
		return fmt.Errorf("publishing completion event: %w", err)
	}
	w.crashAt(r.log, "after-event")
	if r.left == nil || r.left.local {
		if err := w.ckpts.Delete(ctx, r.job.TileKey); err != nil {
			r.log.Warn("deleting local checkpoint", "err", err)
		}
	}
	if r.left == nil || r.left.remote {
		if err := w.objects.Delete(ctx, layout.CheckpointKey(r.job.TileKey)); err != nil {
			r.log.Warn("deleting remote checkpoint", "err", err)
		}
	}
	if r.finish != nil {
		r.finish()
	}
	w.crashAt(r.log, "before-ack")
	// The lease release above ends the heartbeat context; the ack must still go out.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := r.msg.DoubleAck(actx); err != nil {
		// The manifest exists, so a redelivery is acked by the manifest check.
		r.log.Warn("ack failed after promotion", "err", err)
	}
	return nil
}

// resume imports the newest usable checkpoint, local first, then remote: one of this tile,
// made from the same inputs by the same build. It returns the samples recovered.
func (w *Worker) resume(ctx context.Context, tile scene.Tile, r *tileRun) int {
	candidates := []func() (checkpoint.Checkpoint, bool){
		func() (checkpoint.Checkpoint, bool) {
			c, ok, err := w.ckpts.Load(ctx, r.job.TileKey)
			if err != nil {
				r.log.Warn("loading local checkpoint", "err", err)
			}
			r.left.local = ok || err != nil
			return c, ok && err == nil
		},
		func() (checkpoint.Checkpoint, bool) {
			data, err := w.objects.Get(ctx, layout.CheckpointKey(r.job.TileKey))
			r.left.remote = !errors.Is(err, objstore.ErrNotFound)
			if err != nil {
				if !errors.Is(err, objstore.ErrNotFound) {
					r.log.Warn("loading remote checkpoint", "err", err)
				}
				return checkpoint.Checkpoint{}, false
			}
			c, err := w.codec.Decode(data)
			if err != nil {
				r.log.Warn("discarding corrupt remote checkpoint", "err", err)
				return checkpoint.Checkpoint{}, false
			}
			return c, true
		},
	}
	build := identity.BuildFor(r.job.Settings)
	best := checkpoint.Checkpoint{}
	for _, load := range candidates {
		c, ok := load()
		if !ok {
			continue
		}
		if !c.Matches(r.job.TileKey, r.job.InputHash) {
			r.log.Warn("discarding checkpoint with a different input hash", "checkpoint_input_hash", c.InputHash)
			continue
		}
		if c.Build != build {
			r.log.Warn("discarding checkpoint made by another build", "checkpoint_build", c.Build, "build", build)
			continue
		}
		if c.Next > best.Next {
			best = c
		}
	}
	if best.Next == 0 {
		return 0
	}
	if err := tile.Import(render.State{Next: best.Next, Sum: best.Sum}); err != nil {
		r.log.Warn("discarding checkpoint that does not fit the tile", "err", err)
		return 0
	}
	r.log.Info("resuming from checkpoint", "samples_recovered", best.Next)
	w.m.CheckpointResumes.Inc()
	w.m.SamplesRecovered.Add(float64(best.Next))
	return best.Next
}

// renderPasses renders the remaining samples pass by pass (the partition the settings fix, or
// the worker's), checkpointing after passes and reporting progress while passes remain.
func (w *Worker) renderPasses(ctx context.Context, tile scene.Tile, r *tileRun) error {
	spp := r.job.Settings.SPP
	var lastDropCheck time.Time
	for passes, to := range r.job.Settings.PassEnds(w.cfg.PassesPerTile) {
		if to <= tile.Next() {
			continue
		}
		if f := w.cfg.Faults; f.PanicTileSet && r.job.Frame == f.PanicFrame && r.job.Rect == f.PanicTile {
			panic(fmt.Sprintf("injected fault in frame %d tile %v", r.job.Frame, r.job.Rect))
		}
		// Half a pass rendered and not checkpointed: the state a kill inside a pass leaves. A real
		// pass outlasts the background save of the one before; this one renders in milliseconds,
		// so it waits for that save first, and strikes only once a checkpoint is in the store.
		if passes >= 1 && w.cfg.Faults.CrashAt == "mid-pass" && to-tile.Next() > 1 && r.job.Settings.Passes == 0 && r.ckpt.settle(ctx) {
			if err := w.renderSamples(ctx, r, tile, tile.Next()+(to-tile.Next())/2); err != nil {
				return err
			}
			w.crashAt(r.log, "mid-pass")
		}
		if err := w.renderSamples(ctx, r, tile, to); err != nil {
			return err
		}
		if w.cfg.Faults.PassDelay > 0 {
			queue.Sleep(ctx, w.cfg.Faults.PassDelay)
		}
		if to == spp {
			break
		}
		w.reportProgress(r, to)
		r.ckpt.afterPass(tile)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if now := time.Now(); now.Sub(lastDropCheck) >= dropCheckEvery {
			lastDropCheck = now
			if w.frameDropped(ctx, r) {
				r.ckpt.saveNow(ctx, tile, true) // a job asking for the frame again resumes here
				return errDropped
			}
		}
	}
	return nil
}

// dropCheckEvery is how often a tile in progress asks whether its frame was dropped: after a
// pass, but at most this often, since the answer is a round trip to JetStream and a tile may
// have dozens of short passes.
const dropCheckEvery = 250 * time.Millisecond

// renderSamples renders the tile's samples from its next one up to to, and counts in
// tilefarm_samples_rendered_total the samples the tile really gained, even when the render
// stops early (cancelled, lease lost): samples recovered from a checkpoint are never counted,
// and samples rendered by an attempt that fails later always are.
//
// With Faults.SampleDelay the samples render one at a time, each after the delay and counted as
// it lands, the way a slow real render gains them: a kill then loses the samples rendered since
// the last checkpoint, and the counter shows them.
func (w *Worker) renderSamples(ctx context.Context, r *tileRun, tile scene.Tile, to int) error {
	if d := w.cfg.Faults.SampleDelay; d > 0 {
		for tile.Next() < to {
			if !queue.Sleep(ctx, d) {
				return ctx.Err()
			}
			if err := w.renderRange(ctx, r, tile, tile.Next()+1); err != nil {
				return err
			}
		}
		return nil
	}
	return w.renderRange(ctx, r, tile, to)
}

// renderRange renders the tile up to sample to in one call and counts what it gained.
func (w *Worker) renderRange(ctx context.Context, r *tileRun, tile scene.Tile, to int) error {
	from := tile.Next()
	err := tile.Render(ctx, from, to)
	if n := tile.Next() - from; n > 0 {
		w.m.SamplesRendered.Add(float64(n))
		w.act.pass(r.attempt, tile.Next(), n)
	}
	return err
}

// reportProgress tells the coordinator how far a tile is, best effort: a lost report loses
// nothing (docs/design.md, "Progress").
func (w *Worker) reportProgress(r *tileRun, samples int) {
	data, err := json.Marshal(wire.Progress{JobID: r.job.JobID, FrameKey: r.job.FrameKey, TileKey: r.job.TileKey,
		Samples: samples, SPP: r.job.Settings.SPP, Worker: w.cfg.Name, Time: time.Now().UTC()})
	if err == nil {
		err = w.queue.PublishProgress(data)
	}
	if err != nil {
		r.log.Debug("reporting progress", "err", err)
	}
}
