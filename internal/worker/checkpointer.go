package worker

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/tilefarm/tilefarm/checkpoint"
	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/scene"
)

// checkpointer saves a tile run's checkpoints one at a time in the background: after a pass
// the render only snapshots the tile's state (a copy of its sums), and the encoding, the local
// commit with its fsync and the upload run beside the next passes. A save is due when none is
// in flight and the cadences allow it (cadence.go); the last one in flight is waited for
// before the run saves on its own (finished, dropped, shutting down) or deletes its checkpoints.
type checkpointer struct {
	r             *tileRun
	local, remote cadence
	busy          atomic.Bool
	jobs          chan saveJob
	done          chan struct{}
	stopped       bool
}

// saveJob is one snapshot to save, locally and, if remote, in the object store.
type saveJob struct {
	c      checkpoint.Checkpoint
	remote bool
	took   time.Duration // the snapshot's share of the save's cost
}

// startCheckpointer starts the saver of a tile run whose render begins at start; ctx is the
// lease's, so a lost lease ends a save in flight.
func (r *tileRun) startCheckpointer(ctx context.Context, start time.Time) *checkpointer {
	w := r.w
	k := &checkpointer{r: r, local: newCadence(w.cfg.CheckpointEvery, &w.saveCost, start),
		remote: newRemoteCadence(w.cfg.RemoteEvery, &w.saveCost, start), jobs: make(chan saveJob, 1), done: make(chan struct{})}
	go func() {
		defer close(k.done)
		for j := range k.jobs {
			r.writeCheckpoint(ctx, j)
			k.busy.Store(false)
		}
	}()
	return k
}

// afterPass hands a snapshot of the tile to the saver when a save is due.
func (k *checkpointer) afterPass(tile scene.Tile) {
	now := time.Now()
	if k.stopped || k.busy.Load() || !k.local.due(now) {
		return
	}
	j, ok := k.r.snapshot(tile, k.remote.due(now))
	if !ok {
		return
	}
	k.local.mark(now)
	if j.remote {
		k.remote.mark(now)
	}
	k.busy.Store(true)
	k.jobs <- j
}

// stop waits for the save in flight and ends the saver. It is safe to call twice.
func (k *checkpointer) stop() {
	if k.stopped {
		return
	}
	k.stopped = true
	close(k.jobs)
	<-k.done
}

// saveNow stops the saver and saves the tile's state at once, remotely too if remote.
func (k *checkpointer) saveNow(ctx context.Context, tile scene.Tile, remote bool) {
	k.stop()
	if j, ok := k.r.snapshot(tile, remote); ok {
		k.r.writeCheckpoint(ctx, j)
	}
}

// snapshot copies the tile's state into a checkpoint of the run, and marks in the run which
// checkpoints it may leave (leftCheckpoints). ok is false before the first sample.
func (r *tileRun) snapshot(tile scene.Tile, remote bool) (saveJob, bool) {
	if tile.Next() == 0 {
		return saveJob{}, false
	}
	start := time.Now()
	st := tile.Export()
	c := checkpoint.Checkpoint{TileKey: r.job.TileKey, FrameKey: r.job.FrameKey, InputHash: r.job.InputHash, Next: st.Next, Sum: st.Sum,
		Attempt: r.attempt, Build: identity.BuildFor(r.job.Settings), SavedAt: time.Now().UTC()}
	r.left.local = true
	r.left.remote = r.left.remote || remote
	return saveJob{c: c, remote: remote, took: time.Since(start)}, true
}

// writeCheckpoint encodes j once, saves it locally and, if j.remote, uploads it as the remote
// checkpoint, but only while the lease is still ours: a worker that slept through losing its
// lease must not overwrite the new holder's newer checkpoint.
func (r *tileRun) writeCheckpoint(ctx context.Context, j saveJob) {
	w := r.w
	start := time.Now()
	data, err := w.codec.Encode(j.c)
	w.saveCost.set(j.took+time.Since(start), len(data))
	if err != nil {
		r.log.Warn("encoding checkpoint", "err", err)
		return
	}
	if err := w.ckpts.SaveEncoded(ctx, j.c.TileKey, data); err != nil {
		r.log.Warn("saving local checkpoint", "err", err)
	} else {
		r.log.Debug("checkpoint saved", "next_sample", j.c.Next)
	}
	if !j.remote {
		return
	}
	if err := r.hb.check(ctx); err != nil {
		r.log.Warn("not uploading checkpoint: lease no longer ours", "err", err)
		return
	}
	if err := w.objects.Put(ctx, layout.CheckpointKey(j.c.TileKey), data); err != nil {
		r.log.Warn("uploading remote checkpoint", "err", err)
		return
	}
	r.log.Debug("remote checkpoint uploaded", "next_sample", j.c.Next)
}
