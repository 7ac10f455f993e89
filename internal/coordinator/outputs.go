package coordinator

import (
	"context"
	"fmt"
	"slices"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/layout"
)

// FrameOutput returns one encoded output of a job's frame, read through its manifest and verified.
func (c *Coordinator) FrameOutput(ctx context.Context, jobID string, frame int, format string) ([]byte, error) {
	name, ok := layout.FrameOutputName(format)
	if !ok {
		return nil, fmt.Errorf("%w: unknown output format %q", api.ErrBadInput, format)
	}
	var fk string
	err := c.db.View(ctx, func(tx *coorddb.Tx) error {
		j, err := tx.Job(jobID)
		if err != nil {
			return err
		}
		if frame < j.First || frame > j.Last {
			return fmt.Errorf("%w: frame %d is not in job %s (frames %d-%d)", api.ErrBadInput, frame, jobID, j.First, j.Last)
		}
		fk = j.FrameKey(frame)
		f, err := tx.Frame(fk)
		if err != nil {
			return err
		}
		if !slices.Contains(f.Formats, format) {
			return fmt.Errorf("%w: frame %d was not requested as %s (submit again with --format %s)", api.ErrBadInput, frame, format, format)
		}
		// Each format is served from its own manifest as soon as it is promoted, whatever
		// other formats of the frame are still being assembled for other jobs.
		if !slices.Contains(f.Done, format) {
			return fmt.Errorf("frame %d is %s: %w", frame, f.StateFor([]string{format}), api.ErrNotReady)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	m, err := finalize.ReadManifest(ctx, c.objects, layout.FrameManifestKey(fk, format))
	if err != nil {
		return nil, fmt.Errorf("reading manifest of frame %d: %w", frame, err)
	}
	data, err := finalize.ReadObject(ctx, c.objects, m, name)
	if err != nil {
		return nil, fmt.Errorf("reading %s of frame %d: %w", format, frame, err)
	}
	return data, nil
}
