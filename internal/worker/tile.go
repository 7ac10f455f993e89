package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/farm"
	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/render"
	"github.com/tilefarm/tilefarm/tiles"
)

// renderTile carries one tile job through steps 1-5 of the Render flow in DESIGN.md.
func (w *Worker) renderTile(ctx context.Context, msg jetstream.Msg, job farm.TileJob, attempt string, log *slog.Logger) error {
	if err := checkIdentity(job); err != nil {
		return err
	}
	manifestKey := farm.TileManifestKey(job.TileKey)

	// 1. Already promoted: tell the coordinator (it may have missed the event) and ack.
	var done bool
	err := w.retryInfra(ctx, msg, log, "checking tile manifest", func(ctx context.Context) (err error) {
		done, err = finalize.ManifestExists(ctx, w.objects, manifestKey)
		return err
	})
	if err != nil {
		return err
	}
	if done {
		w.m.DuplicatesSuppressed.WithLabelValues(metrics.LayerManifestCheck).Inc()
		log.Info("tile already promoted; acking duplicate delivery")
		return w.complete(ctx, msg, job, attempt, 0, 0, true, nil, log)
	}

	// 2. Lease with fencing token; from here on the heartbeat keeps lease and message alive
	// until the tile is settled.
	lease, err := w.acquire(ctx, msg, job, attempt, log)
	if err != nil || lease == nil {
		return err
	}
	log = log.With("fencing_token", lease.Token)
	hb := w.startHeartbeat(ctx, msg, lease, log)
	released := false
	// finish ends the heartbeat and releases the lease; after a lost lease there is nothing to release.
	finish := func() {
		if released {
			return
		}
		released = true
		if lost := hb.stop(); lost != nil {
			log.Warn("lease lost; abandoning tile", "err", lost)
			return
		}
		w.release(ctx, lease, log)
	}
	defer finish()
	err = w.renderAndPromote(hb.ctx, msg, job, attempt, hb, finish, log)
	if errors.Is(context.Cause(hb.ctx), queue.ErrLeaseLost) || errors.Is(err, queue.ErrLeaseLost) {
		// No finalize, no ack: the new lease holder owns the tile now.
		if err != nil && errors.Is(err, queue.ErrLeaseLost) {
			log.Warn("lease lost; abandoning tile", "err", err)
		}
		return errSettled
	}
	return err
}

// checkIdentity recomputes the job's keys with this worker's renderer. A mismatch means the job
// was made by a build with another render.Version: rendering it here would resume foreign
// checkpoints and promote pixels under keys that promise other ones.
func checkIdentity(job farm.TileJob) error {
	fk := tiles.FrameKey(job.SceneVersion, job.Settings.Camera, job.Frame, tiles.SettingsHash(job.Settings))
	if fk != job.FrameKey || tiles.TileKey(fk, job.Rect) != job.TileKey ||
		tiles.InputHash(job.SceneVersion, job.Settings, job.Frame, job.Rect) != job.InputHash {
		return farm.Terminalf("build mismatch: tile %s was not made for render version %s (all workers of a farm must run the coordinator's build)", job.TileKey, render.Version)
	}
	return nil
}

// acquire takes the tile's lease. While another live owner holds it (a redelivery or duplicate
// of a tile still rendering elsewhere) it waits, keeping the message alive, instead of burning a
// delivery per try: until the tile is promoted (then it acks the duplicate), the lease is free,
// or two lease TTLs pass (then it hands the message back). A nil lease means the message is settled.
func (w *Worker) acquire(ctx context.Context, msg jetstream.Msg, job farm.TileJob, attempt string, log *slog.Logger) (*queue.Lease, error) {
	deadline := time.Now().Add(2 * w.farm.Cfg.LeaseTTL)
	for {
		lease, err := w.farm.Leases.Acquire(ctx, job.TileKey, w.cfg.Name+"/"+attempt)
		if err == nil {
			return lease, nil
		}
		if !errors.Is(err, queue.ErrLeaseHeld) {
			return nil, fmt.Errorf("acquiring lease: %w", err)
		}
		if time.Now().After(deadline) {
			log.Info("tile still leased by another worker; handing it back")
			_ = msg.NakWithDelay(w.farm.Cfg.LeaseTTL)
			return nil, nil
		}
		_ = msg.InProgress()
		queue.Sleep(ctx, w.cfg.Heartbeat)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if done, err := finalize.ManifestExists(ctx, w.objects, farm.TileManifestKey(job.TileKey)); err == nil && done {
			w.m.DuplicatesSuppressed.WithLabelValues(metrics.LayerManifestCheck).Inc()
			log.Info("tile promoted by the lease holder; acking duplicate delivery")
			return nil, w.complete(ctx, msg, job, attempt, 0, 0, true, nil, log)
		}
	}
}

// renderAndPromote is steps 3-5 of the Render flow, run under a live lease.
func (w *Worker) renderAndPromote(ctx context.Context, msg jetstream.Msg, job farm.TileJob, attempt string, hb *heartbeat, finish func(), log *slog.Logger) error {
	var scene *render.Scene
	err := w.retryInfra(ctx, msg, log, "fetching scene", func(ctx context.Context) (err error) {
		scene, err = w.scene(ctx, job.SceneVersion)
		return err
	})
	if err != nil {
		return err
	}
	tile, err := render.NewTile(scene, job.Settings, job.Frame, job.Rect)
	if err != nil {
		return farm.Terminalf("creating tile: %w", err)
	}

	// 3. Resume from a checkpoint whose input hash matches.
	recovered := w.resume(ctx, tile, job, log)
	if err := w.publishEvent(ctx, farm.Event{
		ID: farm.EventTileStarted + ":" + attempt, Type: farm.EventTileStarted, JobID: job.JobID,
		TileKey: job.TileKey, FrameKey: job.FrameKey, Attempt: attempt, Worker: w.cfg.Name, SamplesRecovered: recovered,
	}); err != nil {
		return fmt.Errorf("publishing start event: %w", err)
	}

	// 4. Render in passes; a lost lease cancels ctx at once.
	w.m.TilesInFlight.Inc()
	start := time.Now()
	err = w.renderPasses(ctx, tile, job, attempt, hb, log)
	w.m.TilesInFlight.Dec()
	if err != nil {
		if ctx.Err() != nil && context.Cause(ctx) == ctx.Err() {
			// Shutting down: keep what was rendered for whoever resumes the tile, but never hang
			// the shutdown on a slow store.
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			w.saveCheckpoint(sctx, tile, job, attempt, hb, log)
			cancel()
		}
		return err
	}
	w.m.TileRenderSeconds.Observe(time.Since(start).Seconds())
	w.m.SamplesRendered.Add(float64(job.Settings.SPP - recovered))
	// The finished state is checkpointed too, so a storage outage during finalize costs no rendering.
	w.saveCheckpoint(ctx, tile, job, attempt, nil, log)

	// 5. Finalize, but only while still holding the lease (fencing).
	if err := hb.check(ctx); err != nil {
		return fmt.Errorf("before finalize: %w", err)
	}
	var p finalize.Promotion
	err = w.retryInfra(ctx, msg, log, "promoting tile", func(ctx context.Context) (err error) {
		p, err = finalize.Promote(ctx, w.objects, farm.TileManifestKey(job.TileKey), attempt, farm.BuildFingerprint(),
			[]finalize.Output{{Name: farm.TileOutputName, Data: finalize.EncodeTile(tile.Pixels())}},
			map[string]string{"tile_key": job.TileKey, "frame_key": job.FrameKey, "input_hash": job.InputHash, "worker": w.cfg.Name})
		return err
	})
	if err != nil {
		w.m.FinalizeFailures.Inc()
		if errors.Is(err, finalize.ErrConflict) {
			w.m.DuplicatesSuppressed.WithLabelValues(metrics.LayerManifestConflict).Inc()
			return farm.Terminalf("promoting tile: %w", err)
		}
		return err
	}
	if p.Existing {
		w.m.DuplicatesSuppressed.WithLabelValues(metrics.LayerManifestExisting).Inc()
	} else {
		w.m.TilesCompleted.Inc()
	}
	return w.complete(ctx, msg, job, attempt, job.Settings.SPP-recovered, recovered, p.Existing, finish, log)
}

func (w *Worker) release(ctx context.Context, lease *queue.Lease, log *slog.Logger) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := w.farm.Leases.Release(rctx, lease); err != nil {
		log.Warn("releasing lease", "err", err)
	}
}

// retryInfra runs op, retrying in place with backoff while it fails with a retryable storage
// error, for at most InfraRetryFor. The message's ack-wait is extended meanwhile, so a storage
// outage does not burn the tile's deliveries and end in a dead letter.
func (w *Worker) retryInfra(ctx context.Context, msg jetstream.Msg, log *slog.Logger, what string, op func(context.Context) error) error {
	deadline := time.Now().Add(w.cfg.InfraRetryFor)
	for try := 1; ; try++ {
		err := op(ctx)
		if err == nil || !finalize.IsRetryable(err) || ctx.Err() != nil || time.Now().After(deadline) {
			if err != nil && !farm.IsTerminal(err) {
				err = fmt.Errorf("%s: %w", what, err)
			}
			return err
		}
		delay := queue.Backoff(try, w.cfg.RetryBase, 8*w.cfg.RetryBase, w.jitter)
		log.Warn("storage unavailable; retrying in place", "op", what, "try", try, "delay", delay, "err", err)
		w.m.Retries.Inc()
		_ = msg.InProgress()
		queue.Sleep(ctx, delay)
	}
}

// complete publishes tile.completed, drops the checkpoints, releases the lease and acks last.
func (w *Worker) complete(ctx context.Context, msg jetstream.Msg, job farm.TileJob, attempt string, rendered, recovered int, duplicate bool, release func(), log *slog.Logger) error {
	if err := w.publishEvent(ctx, farm.Event{
		ID: farm.EventTileCompleted + ":" + job.TileKey, Type: farm.EventTileCompleted, JobID: job.JobID,
		TileKey: job.TileKey, FrameKey: job.FrameKey, Attempt: attempt, Worker: w.cfg.Name,
		SamplesRendered: rendered, SamplesRecovered: recovered, Duplicate: duplicate,
	}); err != nil {
		return fmt.Errorf("publishing completion event: %w", err)
	}
	if err := w.ckpts.Delete(ctx, job.TileKey); err != nil {
		log.Warn("deleting local checkpoint", "err", err)
	}
	if w.cfg.RemoteCheckpoints {
		if err := w.objects.Delete(ctx, farm.CheckpointKey(job.TileKey)); err != nil {
			log.Warn("deleting remote checkpoint", "err", err)
		}
	}
	if release != nil {
		release()
	}
	// The lease release above ends the heartbeat context; the ack must still go out.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := msg.DoubleAck(actx); err != nil {
		// The manifest exists, so a redelivery is acked by the manifest check.
		log.Warn("ack failed after promotion", "err", err)
	}
	return nil
}

// resume imports the newest valid checkpoint, local first, then remote. It returns the samples recovered.
func (w *Worker) resume(ctx context.Context, tile *render.Tile, job farm.TileJob, log *slog.Logger) int {
	candidates := []func() (tiles.Checkpoint, bool){
		func() (tiles.Checkpoint, bool) {
			c, ok, err := w.ckpts.Load(ctx, job.TileKey)
			if err != nil {
				log.Warn("loading local checkpoint", "err", err)
			}
			return c, ok && err == nil
		},
	}
	if w.cfg.RemoteCheckpoints {
		candidates = append(candidates, func() (tiles.Checkpoint, bool) {
			data, err := w.objects.Get(ctx, farm.CheckpointKey(job.TileKey))
			if err != nil {
				if !errors.Is(err, finalize.ErrNotFound) {
					log.Warn("loading remote checkpoint", "err", err)
				}
				return tiles.Checkpoint{}, false
			}
			c, err := w.codec.Decode(data)
			if err != nil {
				log.Warn("discarding corrupt remote checkpoint", "err", err)
				return tiles.Checkpoint{}, false
			}
			return c, true
		})
	}
	best := tiles.Checkpoint{}
	for _, load := range candidates {
		c, ok := load()
		if !ok {
			continue
		}
		if !c.Matches(job.TileKey, job.InputHash) {
			log.Warn("discarding checkpoint with a different input hash", "checkpoint_input_hash", c.InputHash)
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
		log.Warn("discarding checkpoint that does not fit the tile", "err", err)
		return 0
	}
	log.Info("resuming from checkpoint", "samples_recovered", best.Next)
	w.m.CheckpointResumes.Inc()
	w.m.SamplesRecovered.Add(float64(best.Next))
	return best.Next
}

// renderPasses renders the remaining samples in contiguous passes, checkpointing after passes.
func (w *Worker) renderPasses(ctx context.Context, tile *render.Tile, job farm.TileJob, attempt string, hb *heartbeat, log *slog.Logger) error {
	spp := job.Settings.SPP
	pass := (spp + w.cfg.PassesPerTile - 1) / w.cfg.PassesPerTile
	var lastLocal, lastRemote time.Time
	for tile.Next() < spp {
		if f := w.cfg.Faults; f.PanicTileSet && job.Frame == f.PanicFrame && job.Rect == f.PanicTile {
			panic(fmt.Sprintf("injected fault in frame %d tile %v", job.Frame, job.Rect))
		}
		to := min(tile.Next()+pass, spp)
		if err := tile.Render(ctx, tile.Next(), to); err != nil {
			return err
		}
		if w.cfg.Faults.PassDelay > 0 {
			queue.Sleep(ctx, w.cfg.Faults.PassDelay)
		}
		if to == spp {
			break
		}
		now := time.Now()
		if now.Sub(lastLocal) >= w.cfg.CheckpointEvery {
			lastLocal = now
			fence := hb // a non-nil fence also uploads the remote checkpoint
			if !w.cfg.RemoteCheckpoints || now.Sub(lastRemote) < w.cfg.RemoteEvery {
				fence = nil
			} else {
				lastRemote = now
			}
			w.saveCheckpoint(ctx, tile, job, attempt, fence, log)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

// saveCheckpoint saves the tile's state locally and, given a fence, uploads it as the remote
// checkpoint, but only while the lease is still ours: a worker that slept through losing its
// lease must not overwrite the new holder's newer checkpoint.
func (w *Worker) saveCheckpoint(ctx context.Context, tile *render.Tile, job farm.TileJob, attempt string, fence *heartbeat, log *slog.Logger) {
	if tile.Next() == 0 {
		return
	}
	st := tile.Export()
	c := tiles.Checkpoint{TileKey: job.TileKey, InputHash: job.InputHash, Next: st.Next, Sum: st.Sum, Attempt: attempt, SavedAt: time.Now().UTC()}
	if err := w.ckpts.Save(ctx, c); err != nil {
		log.Warn("saving local checkpoint", "err", err)
	} else {
		log.Debug("checkpoint saved", "next_sample", st.Next)
	}
	if fence == nil || !w.cfg.RemoteCheckpoints {
		return
	}
	if err := fence.check(ctx); err != nil {
		log.Warn("not uploading checkpoint: lease no longer ours", "err", err)
		return
	}
	data, err := w.codec.Encode(c)
	if err == nil {
		err = w.objects.Put(ctx, farm.CheckpointKey(job.TileKey), data)
	}
	if err != nil {
		log.Warn("uploading remote checkpoint", "err", err)
	}
}
