package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/objstore"
)

// jobSource is what waiting and downloading need from a coordinator; both the in-process
// coordinator and the HTTP client provide it.
type jobSource interface {
	Status(ctx context.Context, jobID string) (api.Status, error)
	FrameOutput(ctx context.Context, jobID string, frame int, format string) ([]byte, error)
	FrameIndex(ctx context.Context, jobID string, frame int, format string) (api.FrameIndex, error)
	FrameFile(ctx context.Context, jobID string, frame int, format string, i int) ([]byte, error)
}

// waitJob polls until the job is completed, failed, blocked or cancelled (api.JobState.Finished:
// nothing more happens without an operator), showing progress; a job waiting for other jobs
// is waited for.
func waitJob(ctx context.Context, src jobSource, jobID string, p *progress, changed func() <-chan struct{}) (api.Status, error) {
	for {
		st, err := src.Status(ctx, jobID)
		if err != nil {
			return st, err
		}
		p.show(jobProgress(st))
		if st.State.Finished() {
			p.done()
			return st, nil
		}
		var wake <-chan struct{}
		if changed != nil {
			wake = changed()
		}
		select {
		case <-ctx.Done():
			p.done()
			return st, ctx.Err()
		case <-wake:
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// countReuse fills the per-request counters: tiles already completed when the request was made
// were reused; the rest completed since were rendered for it.
func countReuse(st *api.Status, completedBefore int) {
	st.TilesReused = completedBefore
	st.TilesRendered = max(0, st.TilesCompleted-completedBefore)
}

// writeOutputs downloads every completed frame of a job in format to dest (frameout.go): a
// Blender scene's own output (format blend) with the files of its File Output nodes. Every
// frame's paths are checked (framePaths) before the first frame is downloaded, so a path
// refused in the last frame leaves the first ones unwritten too.
func writeOutputs(ctx context.Context, src jobSource, st *api.Status, dest outputDest, format string) error {
	type frameDest struct {
		frame int
		to    []string
	}
	var dests []frameDest
	for _, f := range st.Frames {
		if f.State != api.FrameCompleted {
			continue
		}
		var index api.FrameIndex
		if format == formatBlend {
			var err error
			if index, err = src.FrameIndex(ctx, st.JobID, f.Frame, format); err != nil {
				return fmt.Errorf("fetching frame %d: %w", f.Frame, err)
			}
		}
		to, err := framePaths(dest, f.Frame, index.Name, index.Files)
		if err != nil {
			return err
		}
		dests = append(dests, frameDest{f.Frame, to})
	}
	for _, d := range dests {
		data, err := src.FrameOutput(ctx, st.JobID, d.frame, format)
		if err != nil {
			return fmt.Errorf("fetching frame %d: %w", d.frame, err)
		}
		written, err := writeFrame(d.frame, d.to, data, func(i int) ([]byte, error) {
			return src.FrameFile(ctx, st.JobID, d.frame, format, i)
		})
		st.Outputs = append(st.Outputs, written...)
		if err != nil {
			return err
		}
	}
	return nil
}

// checkPattern rejects an output pattern that would write several frames to one file.
func checkPattern(pattern string, first, last int) error {
	if pattern == "" {
		return usagef("--out is required, e.g. --out 'out/shot_####.png'")
	}
	a, err := expandPattern(pattern, first)
	if err != nil {
		return usagef("--out %q: %v", pattern, err)
	}
	if b, _ := expandPattern(pattern, last); first != last && a == b {
		return usagef("--out %q has no #### for the frame number, but frames %d-%d were asked for", pattern, first, last)
	}
	return nil
}

// writeFile writes an output atomically, creating its directory: a reader never sees half a frame.
func writeFile(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("creating output directory: %w", err)
	}
	return objstore.WriteFileAtomic(path, data)
}
