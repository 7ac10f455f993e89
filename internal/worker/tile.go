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
	"github.com/tilefarm/tilefarm/internal/faults"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/internal/wire"
	"github.com/tilefarm/tilefarm/objstore"
	"github.com/tilefarm/tilefarm/raster"
	"github.com/tilefarm/tilefarm/render"
)

// tileRun is one delivery of one tile job carried through the Render flow (docs/design.md,
// "Flows"): one value per delivery, holding what the flow has taken (the lease, its heartbeat,
// the checkpoints it saves) so every step can settle it.
type tileRun struct {
	*delivery
	w     *Worker
	job   wire.TileJob
	lease *queue.Lease
	hb    *heartbeat       // nil until the lease is held
	ckpt  *checkpointer    // nil until the render begins
	left  *leftCheckpoints // nil: unknown, complete deletes both
	// released is set once finish has ended the heartbeat and let the lease go.
	released bool
	// waited is set when the lease was held by another worker when this run first asked.
	waited bool
	// copies is set when the tile's frame has copies queued in another band (queue.FrameMark),
	// or that is not known.
	copies bool
	// object is the tile's promoted object, once this run promoted it or found it promoted by
	// reading its manifest: tile.completed reports it (wire.TileObject).
	object *wire.TileObject
	// rendered is how long this run's passes took, once they are done: tile.completed reports
	// it (wire.Event.RenderMillis).
	rendered time.Duration
	// lend gives the tile the threads of the worker's idle slots (lend.go); nil until the
	// render begins.
	lend *lender
}

// fresh reports whether the run may skip the store reads that find an earlier attempt of the
// tile: the manifest check under the lease and the remote checkpoint. That is the tile's first
// dispatch (wire.TileJob.First), delivered the first time, with nobody holding its lease
// before, and its frame's tiles never dispatched again in another band: no attempt of it can
// have begun.
func (r *tileRun) fresh() bool { return r.job.First && r.num == 1 && !r.waited && !r.copies }

var _ run = (*tileRun)(nil)

// leftCheckpoints says which checkpoints of a tile may exist once a run has rendered it: those
// its resume found (or could not rule out) and those it saved. complete deletes only those, so a
// tile rendered in one go costs no store request and no local commit for checkpoints it never
// had. One a zombie saved in between is removed by PruneCheckpoints locally and by GC remotely.
type leftCheckpoints struct{ local, remote bool }

// newTileRun prepares the run of a tile delivery.
func (w *Worker) newTileRun(d *delivery, job wire.TileJob) *tileRun {
	d.log = d.log.With("job_id", job.JobID, "frame_key", job.FrameKey, "tile_key", job.TileKey)
	return &tileRun{delivery: d, w: w, job: job}
}

func (r *tileRun) manifestKey() string { return layout.TileManifestKey(r.job.FrameKey, r.job.TileKey) }

// blocklistJob is the tile's job: its failures count toward this worker blocklisting it.
func (r *tileRun) blocklistJob() string { return r.job.JobID }

// failureEvent is tile.failed about this tile.
func (r *tileRun) failureEvent(ev wire.Event) wire.Event {
	ev.Type, ev.JobID, ev.TileKey, ev.TileIndex, ev.FrameKey = wire.EventTileFailed, r.job.JobID, r.job.TileKey, r.job.Index, r.job.FrameKey
	return ev
}

// promoted reports whether the tile's manifest exists.
func (r *tileRun) promoted(ctx context.Context) (bool, error) {
	return finalize.ManifestExists(ctx, r.w.objects, r.manifestKey())
}

// completePromoted announces the tile found promoted and acks.
func (r *tileRun) completePromoted(ctx context.Context) error { return r.complete(ctx, 0, 0, true) }

// perform carries the tile through the Render flow.
func (r *tileRun) perform(ctx context.Context) error {
	w := r.w
	if err := checkIdentity(r.job); err != nil {
		return err
	}
	// 1. Already promoted: tell the coordinator (it may have missed the event) and ack. A first
	// delivery skips this read, a store request per tile: the check under the lease below
	// catches a duplicate all the same, at the cost of a lease taken and released.
	if r.num > 1 {
		if done, err := r.promotedNow(ctx); err != nil || done {
			return err
		}
	}
	w.faults.BeforeLease(r.job)
	w.faults.At(r.log, faults.BeforeLease)
	if r.frameDropped(ctx) {
		return r.drop(ctx)
	}

	// 2. Lease with fencing token; from here on the heartbeat keeps lease and message alive
	// until the tile is settled.
	lease, err := r.acquire(ctx)
	if err != nil || lease == nil {
		return err
	}
	r.lease = lease
	r.log = r.log.With("fencing_token", lease.Token)
	if r.num == 1 && !r.waited && !r.ready.IsZero() {
		// Dispatch latency: a first delivery leased without waiting for another holder.
		w.m.TileDispatchSeconds.Observe(time.Since(r.ready).Seconds())
	}
	// The holder may have promoted the tile just before its lease went: check again, or a
	// duplicate would render the whole tile a second time. A fresh run had no holder before it.
	if !r.fresh() {
		if done, err := r.promotedNow(ctx); err != nil || done {
			r.release(ctx)
			return err
		}
	}
	r.hb = w.startHeartbeat(ctx, r.msg, lease, r.log)
	defer r.finish(ctx)
	w.act.start(r.attempt, api.WorkerTile{JobID: r.job.JobID, Frame: r.job.Frame, TileKey: r.job.TileKey, SamplesTotal: r.job.Settings.SPP})
	defer w.act.end(r.attempt)
	err = r.renderAndPromote(r.hb.ctx)
	if errors.Is(err, errDropped) {
		return r.drop(ctx)
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

// finish ends the heartbeat and releases the lease, once; after a lost lease it only stops.
func (r *tileRun) finish(ctx context.Context) {
	if r.hb == nil || r.released {
		return
	}
	r.released = true
	if lost := r.hb.stop(); lost != nil {
		r.log.Warn("lease lost; abandoning tile", "err", lost)
		return
	}
	r.release(ctx)
}

// promotedNow checks the tile's manifest (retrying a store outage in place); when it exists
// it announces the tile completed and acks the duplicate delivery.
func (r *tileRun) promotedNow(ctx context.Context) (bool, error) {
	var done bool
	err := r.w.retryStore(ctx, r.delivery, "checking tile manifest", func(ctx context.Context) (err error) {
		done, err = r.promoted(ctx)
		return err
	})
	if err != nil || !done {
		return false, err
	}
	r.w.m.DuplicatesSuppressed.WithLabelValues(metrics.LayerManifestCheck).Inc()
	r.log.Info("tile already promoted; acking duplicate delivery")
	return true, r.complete(ctx, 0, 0, true)
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
func (r *tileRun) acquire(ctx context.Context) (*queue.Lease, error) {
	w := r.w
	waiting := false
	for try := 1; ; try++ {
		lease, err := w.queue.Leases.Acquire(ctx, r.job.TileKey, w.cfg.Name+"/"+r.attempt)
		if err == nil {
			return lease, nil
		}
		switch {
		case errors.Is(err, queue.ErrLeaseHeld):
			r.waited = true
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
		if done, err := r.promoted(ctx); err == nil && done {
			w.m.DuplicatesSuppressed.WithLabelValues(metrics.LayerManifestCheck).Inc()
			r.log.Info("tile promoted by the lease holder; acking duplicate delivery")
			return nil, r.complete(ctx, 0, 0, true)
		}
	}
}

// renderAndPromote is steps 3-5 of the Render flow, run under a live lease.
func (r *tileRun) renderAndPromote(ctx context.Context) error {
	w := r.w
	var sc scene.Renderer
	err := w.retryStore(ctx, r.delivery, "fetching scene", func(ctx context.Context) (err error) {
		sc, err = w.scenes.Get(ctx, r.job.SceneVersion)
		return err
	})
	if err != nil {
		return err
	}
	t, err := sc.NewTile(ctx, r.job.Settings, r.job.Frame, r.job.Rect)
	if err != nil {
		return err
	}
	r.lend = newLender(t, &w.idle)
	tile := w.faults.Tile(counted{Tile: t, r: r}, r.job.TileKey, r.job.Frame, r.job.Rect, r.job.Settings, r.log)

	// 3. Resume from a checkpoint made from the same inputs by the same build.
	r.left = &leftCheckpoints{}
	recovered, err := r.resume(ctx, tile)
	if err != nil {
		return err
	}
	if err := w.retryInPlace(ctx, r.delivery, "publishing start event", func(ctx context.Context) error {
		return w.publishEvent(ctx, r.delivery, wire.Event{Type: wire.EventTileStarted, JobID: r.job.JobID, TileKey: r.job.TileKey,
			TileIndex: r.job.Index, FrameKey: r.job.FrameKey, SamplesRecovered: recovered})
	}); err != nil {
		return err
	}

	// 4. Render in passes; a lost lease cancels ctx at once.
	r.log.Debug("rendering tile", "frame", r.job.Frame, "tile", r.job.Index, "rect", r.job.Rect, "spp", r.job.Settings.SPP,
		"samples_recovered", recovered)
	start := time.Now()
	r.ckpt = r.startCheckpointer(ctx, start)
	defer r.ckpt.stop()
	err = func() error {
		// Deferred: a panic in a pass (recovered by serve) must not leave the tile in flight.
		w.m.TilesInFlight.Inc()
		defer w.m.TilesInFlight.Dec()
		return r.renderPasses(ctx, tile)
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
	r.rendered = time.Since(start)
	w.m.TileRenderSeconds.Observe(r.rendered.Seconds())
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
	opts := []finalize.PromoteOption{finalize.Absent()}
	err = w.retryStore(ctx, r.delivery, "promoting tile", func(ctx context.Context) (err error) {
		p, err = finalize.Promote(ctx, w.objects, r.manifestKey(), r.attempt, identity.BuildFor(r.job.Settings),
			[]finalize.Output{{Name: layout.TileOutputName, Data: raster.EncodeTile(tile.Pixels())}},
			map[string]string{"tile_key": r.job.TileKey, "frame_key": r.job.FrameKey, "input_hash": r.job.InputHash, "worker": w.cfg.Name},
			opts...)
		opts = nil // a retry reads the manifest first, and may find its own promotion
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
	if o, ok := p.Manifest.Object(layout.TileOutputName); ok && o.Key == finalize.AttemptKey(r.manifestKey(), p.Manifest.Attempt, o.Name) {
		r.object = &wire.TileObject{Attempt: p.Manifest.Attempt, SHA256: o.SHA256, Build: p.Manifest.Build}
	}
	// What an operator tailing a worker's log follows, each tile completed with its job, frame,
	// tile and attempt (the logger's), and what tests read.
	if p.Existing {
		w.m.DuplicatesSuppressed.WithLabelValues(metrics.LayerManifestExisting).Inc()
		r.log.Info("tile promoted by another attempt first; this render was a duplicate", "frame", r.job.Frame, "tile", r.job.Index,
			"render_seconds", r.rendered.Seconds())
	} else {
		w.m.TilesCompleted.Inc()
		r.log.Info("tile promoted", "frame", r.job.Frame, "tile", r.job.Index, "rect", r.job.Rect, "render_seconds", r.rendered.Seconds(),
			"samples_recovered", recovered)
	}
	return r.complete(ctx, r.job.Settings.SPP-recovered, recovered, p.Existing)
}

func (r *tileRun) release(ctx context.Context) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := r.w.queue.Leases.Release(rctx, r.lease); err != nil {
		r.log.Warn("releasing lease", "err", err)
	}
}

// complete publishes tile.completed (retrying a NATS outage in place), drops the checkpoints,
// releases the lease and acks last.
func (r *tileRun) complete(ctx context.Context, rendered, recovered int, duplicate bool) error {
	w := r.w
	ev := wire.Event{ID: wire.EventTileCompleted + ":" + r.job.TileKey, Type: wire.EventTileCompleted, JobID: r.job.JobID,
		TileKey: r.job.TileKey, TileIndex: r.job.Index, FrameKey: r.job.FrameKey,
		SamplesRendered: rendered, SamplesRecovered: recovered, Duplicate: duplicate, Object: r.object}
	if r.rendered > 0 {
		ev.RenderMillis = max(r.rendered.Milliseconds(), 1) // 0 says nothing was rendered
	}
	if err := w.retryInPlace(ctx, r.delivery, "publishing completion event", func(ctx context.Context) error {
		return w.publishEvent(ctx, r.delivery, ev)
	}); err != nil {
		return fmt.Errorf("publishing completion event: %w", err)
	}
	w.faults.At(r.log, faults.AfterEvent)
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
	r.finish(ctx)
	w.faults.At(r.log, faults.BeforeAck)
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
// made from the same inputs by the same build. It returns the samples recovered. The remote
// checkpoint is read like every store read of the tile, retried in place through an outage, so
// a store that is slow for a moment does not cost the samples it holds; an outage that outlasts
// the hand-on time returns its error (errHandOn), and the tile goes to a worker that reaches it.
func (r *tileRun) resume(ctx context.Context, tile scene.Tile) (int, error) {
	w := r.w
	candidates := []func() (checkpoint.Checkpoint, bool, error){
		func() (checkpoint.Checkpoint, bool, error) {
			c, ok, err := w.ckpts.Load(ctx, r.job.TileKey)
			if err != nil {
				r.log.Warn("loading local checkpoint", "err", err)
			}
			r.left.local = ok || err != nil
			return c, ok && err == nil, nil
		},
		func() (checkpoint.Checkpoint, bool, error) {
			if r.fresh() { // no attempt of the tile began: there is no remote checkpoint
				return checkpoint.Checkpoint{}, false, nil
			}
			var data []byte
			err := w.retryStore(ctx, r.delivery, "loading remote checkpoint", func(ctx context.Context) (err error) {
				data, err = w.objects.Get(ctx, layout.CheckpointKey(r.job.TileKey))
				return err
			})
			r.left.remote = !errors.Is(err, objstore.ErrNotFound)
			if err != nil {
				if errors.Is(err, objstore.ErrNotFound) {
					return checkpoint.Checkpoint{}, false, nil
				}
				if errors.Is(err, errHandOn) || ctx.Err() != nil {
					return checkpoint.Checkpoint{}, false, err
				}
				r.log.Warn("loading remote checkpoint", "err", err)
				return checkpoint.Checkpoint{}, false, nil
			}
			c, err := w.codec.Decode(data)
			if err != nil {
				r.log.Warn("discarding corrupt remote checkpoint", "err", err)
				return checkpoint.Checkpoint{}, false, nil
			}
			return c, true, nil
		},
	}
	build := identity.BuildFor(r.job.Settings)
	best := checkpoint.Checkpoint{}
	for _, load := range candidates {
		c, ok, err := load()
		if err != nil {
			return 0, err
		}
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
		return 0, nil
	}
	if err := tile.Import(render.State{Next: best.Next, Sum: best.Sum}); err != nil {
		r.log.Warn("discarding checkpoint that does not fit the tile", "err", err)
		return 0, nil
	}
	r.log.Info("resuming from checkpoint", "samples_recovered", best.Next)
	w.m.CheckpointResumes.Inc()
	w.m.SamplesRecovered.Add(float64(best.Next))
	return best.Next, nil
}

// renderPasses renders the remaining samples pass by pass (the partition the settings fix, or
// the worker's), checkpointing after passes and reporting progress while passes remain.
func (r *tileRun) renderPasses(ctx context.Context, tile scene.Tile) error {
	spp := r.job.Settings.SPP
	if n, lent := r.lend.borrow(); lent {
		r.log.Debug("rendering with idle slots' threads too", "threads", n)
	}
	defer r.lend.giveBack()
	var lastDropCheck, lastReport time.Time
	for _, to := range r.job.Settings.PassEnds(r.w.cfg.PassesPerTile) {
		if to <= tile.Next() {
			continue
		}
		if err := tile.Render(ctx, tile.Next(), to); err != nil {
			return err
		}
		if to == spp {
			break
		}
		now := time.Now()
		if now.Sub(lastReport) >= progressEvery {
			lastReport = now
			r.reportProgress(to)
		}
		r.ckpt.afterPass(tile)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if now.Sub(lastDropCheck) >= dropCheckEvery {
			lastDropCheck = now
			if r.frameDropped(ctx) {
				r.ckpt.saveNow(ctx, tile, true) // a job asking for the frame again resumes here
				return errDropped
			}
		}
	}
	return nil
}

// A tile in progress reports its samples and asks whether its frame was dropped after a pass,
// but at most this often: a tile may have dozens of short passes, and at 32 passes a second
// per worker a fleet's reports and checks would be most of its messages, which grow with the
// passes and not with the work done (docs/benchmarks.md, "Fleet"). The first pass reports at
// once, so a tile shows progress as soon as it has any.
const (
	progressEvery  = time.Second
	dropCheckEvery = time.Second
)

// counted is a tile of a run that counts in tilefarm_samples_rendered_total, and in the
// worker's activity, the samples the tile really gains, even when a render stops early
// (cancelled, lease lost): samples recovered from a checkpoint are never counted, and samples
// rendered by an attempt that fails later always are.
type counted struct {
	scene.Tile
	r *tileRun
}

func (t counted) Render(ctx context.Context, from, to int) error {
	err := t.Tile.Render(ctx, from, to)
	if n := t.Next() - from; n > 0 {
		t.r.w.m.SamplesRendered.Add(float64(n))
		t.r.w.act.pass(t.r.attempt, t.Next(), n)
	}
	return err
}

// reportProgress tells the coordinator how far a tile is, best effort: a lost report loses
// nothing (docs/design.md, "Progress").
func (r *tileRun) reportProgress(samples int) {
	data, err := json.Marshal(wire.Progress{JobID: r.job.JobID, FrameKey: r.job.FrameKey, TileKey: r.job.TileKey,
		Samples: samples, SPP: r.job.Settings.SPP, Worker: r.w.cfg.Name, Time: time.Now().UTC()})
	if err == nil {
		err = r.w.queue.PublishProgress(data)
	}
	if err != nil {
		r.log.Debug("reporting progress", "err", err)
	}
}
