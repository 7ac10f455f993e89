package coordinator

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/objstore"
)

// FrameOutput returns one encoded output of a job's frame (its main file), read through its
// manifest and verified.
func (c *Coordinator) FrameOutput(ctx context.Context, jobID string, frame int, format string) ([]byte, error) {
	name, ok := layout.FrameOutputName(format)
	if !ok {
		return nil, fmt.Errorf("%w: unknown output format %q", api.ErrBadInput, format)
	}
	return c.frameObject(ctx, jobID, frame, format, name)
}

// FrameIndex names the files of one output of a job's frame, as its renderer named them: the
// main file (a Blender scene's own output: "//render/plate_0001.exr") and the other files
// (its File Output nodes'), which FrameFile serves by their index.
func (c *Coordinator) FrameIndex(ctx context.Context, jobID string, frame int, format string) (api.FrameIndex, error) {
	data, err := c.frameObject(ctx, jobID, frame, format, layout.FrameIndexName)
	if err != nil {
		return api.FrameIndex{}, err
	}
	var index layout.FrameIndex
	if err := json.Unmarshal(data, &index); err != nil {
		return api.FrameIndex{}, fmt.Errorf("reading the index of frame %d: %w: %v", frame, objstore.ErrCorrupt, err)
	}
	if index.Files == nil {
		index.Files = []string{} // the API's arrays are arrays, never null
	}
	return api.FrameIndex{Name: index.Name, Files: index.Files}, nil
}

// FrameFile returns file i of one output of a job's frame (FrameIndex.Files[i]).
func (c *Coordinator) FrameFile(ctx context.Context, jobID string, frame int, format string, i int) ([]byte, error) {
	if i < 0 {
		return nil, fmt.Errorf("%w: file %d", api.ErrBadInput, i)
	}
	return c.frameObject(ctx, jobID, frame, format, layout.FrameFileName(i))
}

// frameObject reads one object of a frame output's manifest, verified: a format the job did
// not ask for is bad input, one not promoted yet not ready, a name the manifest lacks not found.
func (c *Coordinator) frameObject(ctx context.Context, jobID string, frame int, format, name string) ([]byte, error) {
	fk, err := c.frameDone(ctx, jobID, frame, format)
	if err != nil {
		return nil, err
	}
	return c.readFrameObject(ctx, fk, frame, format, name)
}

// frameDone returns the key of a job's frame once format of it is promoted: a format the job
// did not ask for is bad input, one not promoted yet not ready.
func (c *Coordinator) frameDone(ctx context.Context, jobID string, frame int, format string) (string, error) {
	if _, ok := layout.FrameOutputName(format); !ok {
		return "", fmt.Errorf("%w: unknown output format %q", api.ErrBadInput, format)
	}
	var fk string
	err := c.db.View(ctx, func(tx *coorddb.Tx) error {
		j, err := tx.Job(jobID)
		if err != nil {
			return err
		}
		if !j.HasFrame(frame) {
			return fmt.Errorf("%w: frame %d is not in job %s (%s)", api.ErrBadInput, frame, jobID, j.FrameRange())
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
	return fk, err
}

// readFrameObject reads one object of frame fk's output in format through its manifest,
// verified; a name the manifest lacks is not found.
func (c *Coordinator) readFrameObject(ctx context.Context, fk string, frame int, format, name string) ([]byte, error) {
	m, err := finalize.ReadManifest(ctx, c.objects, layout.FrameManifestKey(fk, format))
	if err != nil {
		return nil, fmt.Errorf("reading manifest of frame %d: %w", frame, err)
	}
	if _, ok := m.Object(name); !ok {
		return nil, fmt.Errorf("%w: frame %d's %s output has no %s", api.ErrNotFound, frame, format, name)
	}
	data, err := finalize.ReadObject(ctx, c.objects, m, name)
	if err != nil {
		return nil, fmt.Errorf("reading %s of frame %d: %w", format, frame, err)
	}
	return data, nil
}
