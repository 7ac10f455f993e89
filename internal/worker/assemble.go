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

// describeAssembly fills in how an assembly delivery is announced when it fails or turns
// out done.
func (w *Worker) describeAssembly(d *delivery, job wire.AssembleJob) {
	d.log = d.log.With("job_id", job.JobID, "frame_key", job.FrameKey)
	d.describe = func(ev wire.Event) wire.Event {
		ev.Type, ev.JobID, ev.FrameKey, ev.Formats = wire.EventFrameFailed, job.JobID, job.FrameKey, job.Formats
		return ev
	}
	d.promoted = func(ctx context.Context) (bool, error) {
		missing, err := w.missingFormats(ctx, job)
		return err == nil && len(missing) == 0, err
	}
	d.complete = func(ctx context.Context, d *delivery) error { return w.frameCompleted(ctx, d, job, true) }
}

// missingFormats returns the formats of job whose frame manifest does not exist yet.
func (w *Worker) missingFormats(ctx context.Context, job wire.AssembleJob) ([]string, error) {
	var missing []string
	for _, format := range job.Formats {
		done, err := finalize.ManifestExists(ctx, w.objects, layout.FrameManifestKey(job.FrameKey, format))
		if err != nil {
			return nil, err
		}
		if !done {
			missing = append(missing, format)
		}
	}
	return missing, nil
}

// assemble builds a frame from its promoted tiles and promotes the frame manifest of every
// format still missing. It needs no lease: the output is a pure function of the tiles, so a
// racing assembler promotes identical bytes and gets idempotent success.
func (w *Worker) assemble(ctx context.Context, d *delivery, job wire.AssembleJob) error {
	// Reading thousands of tiles and encoding EXR can outlast the ack-wait: keep the message alive.
	hb := w.startHeartbeat(ctx, d.msg, nil, d.log)
	defer hb.stop()
	var missing []string
	err := w.retryStore(ctx, d, "checking frame manifests", func(ctx context.Context) (err error) {
		missing, err = w.missingFormats(ctx, job)
		return err
	})
	if err != nil {
		return err
	}
	if len(missing) == 0 {
		w.m.DuplicatesSuppressed.WithLabelValues(metrics.LayerManifestCheck).Inc()
		return w.frameCompleted(ctx, d, job, true)
	}
	var outputs []finalize.Output
	err = w.retryStore(ctx, d, "reading tiles", func(ctx context.Context) (err error) {
		outputs, err = w.assembleOutputs(ctx, job, missing)
		return err
	})
	if err != nil {
		return err
	}
	for i, out := range outputs {
		var p finalize.Promotion
		err = w.retryStore(ctx, d, "promoting frame", func(ctx context.Context) (err error) {
			p, err = finalize.Promote(ctx, w.objects, layout.FrameManifestKey(job.FrameKey, missing[i]), d.attempt,
				identity.BuildFor(job.Settings), []finalize.Output{out},
				map[string]string{"frame_key": job.FrameKey, "frame": fmt.Sprint(job.Frame), "format": missing[i], "worker": w.cfg.Name})
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
	d.log.Info("frame assembled", "frame", job.Frame, "formats", job.Formats, "promoted", missing)
	return w.frameCompleted(ctx, d, job, false)
}

// frameCompleted announces the frame's formats promoted (retrying a NATS outage in place) and
// acks; the coordinator checks the claim against the manifests.
func (w *Worker) frameCompleted(ctx context.Context, d *delivery, job wire.AssembleJob, duplicate bool) error {
	ev := wire.Event{ID: wire.EventFrameAssembled + ":" + job.FrameKey + ":" + strings.Join(job.Formats, "+"),
		Type: wire.EventFrameAssembled, JobID: job.JobID, FrameKey: job.FrameKey, Duplicate: duplicate, Formats: job.Formats}
	if err := w.retryInPlace(ctx, d, "publishing frame event", func(ctx context.Context) error {
		return w.publishEvent(ctx, d, ev)
	}); err != nil {
		return fmt.Errorf("publishing frame event: %w", err)
	}
	if err := d.msg.DoubleAck(ctx); err != nil {
		d.log.Warn("ack failed after frame promotion", "err", err)
	}
	return nil
}

// assembleOutputs reads the frame's tiles through their manifests and encodes the formats asked
// for, with the scene's renderer (a Blender scene's PNGs are encoded by Blender).
func (w *Worker) assembleOutputs(ctx context.Context, job wire.AssembleJob, formats []string) ([]finalize.Output, error) {
	st := job.Settings
	sc, err := w.scenes.Get(ctx, job.SceneVersion)
	if err != nil {
		return nil, err
	}
	frame := raster.NewFrame(st.Width, st.Height)
	frameTiles, err := tiles.FrameTiles(job.FrameKey, st.Width, st.Height, job.TileSize)
	if err != nil {
		return nil, failure.Terminalf("tiling frame: %w", err)
	}
	for _, t := range frameTiles {
		pix, err := layout.ReadTile(ctx, w.objects, job.FrameKey, t, st)
		if err != nil {
			return nil, err
		}
		if err := frame.Place(t.Rect.X0, t.Rect.Y0, t.Rect.X1, t.Rect.Y1, pix); err != nil {
			return nil, failure.Terminalf("placing tile %s: %w", t.Key, err)
		}
	}
	return encodeFrame(ctx, sc, frame, st, formats)
}
