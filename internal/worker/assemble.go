package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/farm"
	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/tiles"
)

// assemble builds a frame from its promoted tiles and promotes the frame manifest. It needs no
// lease: the output is a pure function of the tiles, so a racing assembler promotes identical
// bytes and gets idempotent success.
func (w *Worker) assemble(ctx context.Context, msg jetstream.Msg, job farm.AssembleJob, attempt string, log *slog.Logger) error {
	// Reading thousands of tiles and encoding EXR can outlast the ack-wait: keep the message alive.
	hb := w.startHeartbeat(ctx, msg, nil, log)
	defer hb.stop()
	var missing []string
	for _, format := range job.Formats {
		var done bool
		err := w.retryInfra(ctx, msg, log, "checking frame manifest", func(ctx context.Context) (err error) {
			done, err = finalize.ManifestExists(ctx, w.objects, farm.FrameManifestKey(job.FrameKey, format))
			return err
		})
		if err != nil {
			return err
		}
		if !done {
			missing = append(missing, format)
		}
	}
	if len(missing) == 0 {
		w.m.DuplicatesSuppressed.WithLabelValues(metrics.LayerManifestCheck).Inc()
	} else {
		var outputs []finalize.Output
		err := w.retryInfra(ctx, msg, log, "reading tiles", func(ctx context.Context) (err error) {
			outputs, err = w.assembleOutputs(ctx, job, missing)
			return err
		})
		if err != nil {
			return err
		}
		for i, out := range outputs {
			var p finalize.Promotion
			err = w.retryInfra(ctx, msg, log, "promoting frame", func(ctx context.Context) (err error) {
				p, err = finalize.Promote(ctx, w.objects, farm.FrameManifestKey(job.FrameKey, missing[i]), attempt,
					farm.BuildFingerprint(), []finalize.Output{out},
					map[string]string{"frame_key": job.FrameKey, "frame": fmt.Sprint(job.Frame), "format": missing[i], "worker": w.cfg.Name})
				return err
			})
			if err != nil {
				w.m.FinalizeFailures.Inc()
				if errors.Is(err, finalize.ErrConflict) {
					w.m.DuplicatesSuppressed.WithLabelValues(metrics.LayerManifestConflict).Inc()
					return farm.Terminalf("promoting frame: %w", err)
				}
				return err
			}
			if p.Existing {
				w.m.DuplicatesSuppressed.WithLabelValues(metrics.LayerManifestExisting).Inc()
			}
		}
		w.m.FramesCompleted.Inc()
	}
	if err := w.publishEvent(ctx, farm.Event{
		ID:   farm.EventFrameCompleted + ":" + job.FrameKey + ":" + strings.Join(job.Formats, "+"),
		Type: farm.EventFrameCompleted, JobID: job.JobID, FrameKey: job.FrameKey, Attempt: attempt,
		Worker: w.cfg.Name, Duplicate: len(missing) == 0, Formats: job.Formats,
	}); err != nil {
		return fmt.Errorf("publishing frame event: %w", err)
	}
	log.Info("frame assembled", "frame", job.Frame, "formats", job.Formats, "promoted", missing)
	if err := msg.DoubleAck(ctx); err != nil {
		log.Warn("ack failed after frame promotion", "err", err)
	}
	return nil
}

// assembleOutputs reads the frame's tiles through their manifests and encodes the formats asked for.
func (w *Worker) assembleOutputs(ctx context.Context, job farm.AssembleJob, formats []string) ([]finalize.Output, error) {
	st := job.Settings
	frame := finalize.NewFrame(st.Width, st.Height)
	frameTiles, err := tiles.FrameTiles(job.FrameKey, st.Width, st.Height, job.TileSize)
	if err != nil {
		return nil, farm.Terminalf("tiling frame: %w", err)
	}
	for _, t := range frameTiles {
		m, err := finalize.ReadManifest(ctx, w.objects, farm.TileManifestKey(t.Key))
		if err != nil {
			if errors.Is(err, finalize.ErrNotFound) {
				return nil, farm.Terminalf("tile %s has no manifest", t.Key)
			}
			return nil, fmt.Errorf("reading tile manifest %s: %w", t.Key, err)
		}
		if m.Build != farm.BuildFingerprint() {
			return nil, farm.Terminalf("build mismatch: tile %s was rendered by %q, this assembler is %q", t.Key, m.Build, farm.BuildFingerprint())
		}
		data, err := finalize.ReadObject(ctx, w.objects, m, farm.TileOutputName)
		if err != nil {
			return nil, fmt.Errorf("reading tile %s: %w", t.Key, err)
		}
		n := (t.Rect.X1 - t.Rect.X0) * (t.Rect.Y1 - t.Rect.Y0) * 3
		pix, err := finalize.DecodeTile(data, n)
		if err != nil {
			return nil, farm.Terminalf("decoding tile %s: %w", t.Key, err)
		}
		if err := frame.Place(t.Rect.X0, t.Rect.Y0, t.Rect.X1, t.Rect.Y1, pix); err != nil {
			return nil, farm.Terminalf("placing tile %s: %w", t.Key, err)
		}
	}
	return EncodeFrame(frame, st.Exposure, formats)
}

// EncodeFrame encodes a frame in each of formats, in order.
func EncodeFrame(frame *finalize.Frame, exposure float64, formats []string) ([]finalize.Output, error) {
	outs := make([]finalize.Output, 0, len(formats))
	for _, f := range formats {
		name, ok := farm.FrameOutputName(f)
		if !ok {
			return nil, farm.Terminalf("unknown output format %q", f)
		}
		var data []byte
		var err error
		switch f {
		case "png":
			data, err = finalize.EncodePNG8(frame, exposure)
		case "png16":
			data, err = finalize.EncodePNG16(frame, exposure)
		case "exr":
			data, err = finalize.EncodeEXR(frame, finalize.EXRZip)
		}
		if err != nil {
			return nil, farm.Terminalf("encoding %s: %w", f, err)
		}
		outs = append(outs, finalize.Output{Name: name, Data: data})
	}
	return outs, nil
}
