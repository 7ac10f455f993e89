package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/internal/failure"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/internal/wire"
	"github.com/tilefarm/tilefarm/raster"
	"github.com/tilefarm/tilefarm/tiles"
)

// assembly is one delivery of an assemble job: a frame built from its promoted tiles and
// promoted in every format still missing.
type assembly struct {
	*delivery
	w   *Worker
	job wire.AssembleJob
}

var _ run = (*assembly)(nil)

// newAssembly prepares the run of an assembly delivery.
func (w *Worker) newAssembly(d *delivery, job wire.AssembleJob) *assembly {
	d.log = d.log.With("job_id", job.JobID, "frame_key", job.FrameKey)
	return &assembly{delivery: d, w: w, job: job}
}

// blocklistJob is none: an assembly's failure is the frame's, not a job's to blocklist.
func (a *assembly) blocklistJob() string { return "" }

// failureEvent is frame.failed about this frame's formats.
func (a *assembly) failureEvent(ev wire.Event) wire.Event {
	ev.Type, ev.JobID, ev.FrameKey, ev.Formats = wire.EventFrameFailed, a.job.JobID, a.job.FrameKey, a.job.Formats
	return ev
}

// promoted reports whether every format asked for is promoted.
func (a *assembly) promoted(ctx context.Context) (bool, error) {
	missing, err := a.missingFormats(ctx)
	return err == nil && len(missing) == 0, err
}

// completePromoted announces the frame's formats found promoted and acks.
func (a *assembly) completePromoted(ctx context.Context) error { return a.frameCompleted(ctx, true) }

// missingFormats returns the formats of the job whose frame manifest does not exist yet.
func (a *assembly) missingFormats(ctx context.Context) ([]string, error) {
	var missing []string
	for _, format := range a.job.Formats {
		done, err := finalize.ManifestExists(ctx, a.w.objects, layout.FrameManifestKey(a.job.FrameKey, format))
		if err != nil {
			return nil, err
		}
		if !done {
			missing = append(missing, format)
		}
	}
	return missing, nil
}

// perform builds the frame from its promoted tiles and promotes the frame manifest of every
// format still missing. It needs no lease: the output is a pure function of the tiles, so a
// racing assembler promotes identical bytes and gets idempotent success.
func (a *assembly) perform(ctx context.Context) error {
	w, job := a.w, a.job
	// Reading thousands of tiles and encoding EXR can outlast the ack-wait: keep the message alive.
	hb := w.startHeartbeat(ctx, a.msg, nil, a.log)
	defer hb.stop()
	var missing []string
	err := w.retryStore(ctx, a.delivery, "checking frame manifests", func(ctx context.Context) (err error) {
		missing, err = a.missingFormats(ctx)
		return err
	})
	if err != nil {
		return err
	}
	if len(missing) == 0 {
		w.m.DuplicatesSuppressed.WithLabelValues(metrics.LayerManifestCheck).Inc()
		return a.frameCompleted(ctx, true)
	}
	var outputs [][]finalize.Output
	err = w.retryStore(ctx, a.delivery, "reading tiles", func(ctx context.Context) (err error) {
		outputs, err = a.outputs(ctx, missing)
		return err
	})
	if err != nil {
		return err
	}
	for i, out := range outputs {
		var p finalize.Promotion
		// The manifest was missing just now: the first try skips reading it again.
		opts := []finalize.PromoteOption{finalize.Absent()}
		err = w.retryStore(ctx, a.delivery, "promoting frame", func(ctx context.Context) (err error) {
			p, err = finalize.Promote(ctx, w.objects, layout.FrameManifestKey(job.FrameKey, missing[i]), a.attempt,
				identity.BuildFor(job.Settings), out,
				map[string]string{"frame_key": job.FrameKey, "frame": fmt.Sprint(job.Frame), "format": missing[i], "worker": w.cfg.Name},
				opts...)
			opts = nil // a retry reads the manifest first, and may find its own promotion
			return err
		})
		if err != nil {
			w.m.FinalizeFailures.Inc()
			if errors.Is(err, finalize.ErrConflict) {
				w.m.DuplicatesSuppressed.WithLabelValues(metrics.LayerManifestConflict).Inc()
				return failure.Terminalf("promoting frame: %w", err)
			}
			return err
		}
		if p.Existing {
			w.m.DuplicatesSuppressed.WithLabelValues(metrics.LayerManifestExisting).Inc()
		}
	}
	w.m.FramesAssembled.Inc()
	a.log.Info("frame assembled", "frame", job.Frame, "formats", job.Formats, "promoted", missing)
	return a.frameCompleted(ctx, false)
}

// frameCompleted announces the frame's formats promoted (retrying a NATS outage in place) and
// acks; the coordinator checks the claim against the manifests.
func (a *assembly) frameCompleted(ctx context.Context, duplicate bool) error {
	job := a.job
	ev := wire.Event{ID: wire.EventFrameAssembled + ":" + job.FrameKey + ":" + strings.Join(job.Formats, "+"),
		Type: wire.EventFrameAssembled, JobID: job.JobID, FrameKey: job.FrameKey, Duplicate: duplicate, Formats: job.Formats}
	return a.w.announce(ctx, a.delivery, "frame", ev)
}

// announce publishes ev, the claim that d's work (what: frame, movie) is promoted, retrying a
// NATS outage in place, and acks d's message; the coordinator checks the claim against the
// manifests.
func (w *Worker) announce(ctx context.Context, d *delivery, what string, ev wire.Event) error {
	if err := w.retryInPlace(ctx, d, "publishing "+what+" event", func(ctx context.Context) error {
		return w.publishEvent(ctx, d, ev)
	}); err != nil {
		return fmt.Errorf("publishing %s event: %w", what, err)
	}
	if err := d.msg.DoubleAck(ctx); err != nil {
		d.log.Warn("ack failed after the promotion", "what", what, "err", err)
	}
	return nil
}

// outputs reads the frame's tiles, each straight from the object its worker reported where the
// job names one (one request), else through its manifest, and encodes the formats asked for,
// with the scene's renderer (a Blender scene's by Blender, compositor and all): per format the
// objects of its manifest.
func (a *assembly) outputs(ctx context.Context, formats []string) ([][]finalize.Output, error) {
	job := a.job
	st := job.Settings
	sc, err := a.w.scenes.Get(ctx, job.SceneVersion)
	if err != nil {
		return nil, err
	}
	frame := raster.NewFrameOf(st.Width, st.Height, sc.Channels(st))
	frameTiles, err := tiles.FrameTiles(job.FrameKey, st.Width, st.Height, job.TileSize)
	if err != nil {
		return nil, failure.Terminalf("tiling frame: %w", err)
	}
	reported := job.TileBuild != "" && job.TileBuild == identity.BuildFor(st) && len(job.TileObjects) == len(frameTiles)
	for i, t := range frameTiles {
		var pix []float32
		if reported && job.TileObjects[i] != "" {
			pix, err = layout.ReadReportedTile(ctx, a.w.objects, job.FrameKey, t, st, job.TileObjects[i])
			if errors.Is(err, layout.ErrNotReported) {
				a.log.Warn("reading the tile through its manifest", "tile_key", t.Key, "err", err)
				pix, err = layout.ReadTile(ctx, a.w.objects, job.FrameKey, t, st)
			}
		} else {
			pix, err = layout.ReadTile(ctx, a.w.objects, job.FrameKey, t, st)
		}
		if err != nil {
			return nil, err
		}
		if err := frame.Place(t.Rect.X0, t.Rect.Y0, t.Rect.X1, t.Rect.Y1, pix); err != nil {
			return nil, failure.Terminalf("placing tile %s: %w", t.Key, err)
		}
	}
	return encodeFrame(ctx, sc, frame, job.Frame, st, formats)
}
