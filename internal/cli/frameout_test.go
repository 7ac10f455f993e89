package cli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tilefarm/tilefarm/internal/api"
)

// blendJob is a completed job of format blend whose frames' indexes name their files as the
// case needs, a jobSource for writeOutputs. Each file's bytes say which frame and file they are.
type blendJob map[int]api.FrameIndex

func (j blendJob) status() api.Status {
	frames := slices.Sorted(maps.Keys(j))
	st := api.Status{JobID: "job-1", State: api.JobCompleted, Formats: []string{formatBlend},
		FirstFrame: frames[0], LastFrame: frames[len(frames)-1], FramesTotal: len(frames), FramesCompleted: len(frames)}
	for _, f := range frames {
		st.Frames = append(st.Frames, api.FrameStatus{Frame: f, State: api.FrameCompleted})
	}
	return st
}

func (j blendJob) Status(context.Context, string) (api.Status, error) { return j.status(), nil }

func (j blendJob) FrameOutput(_ context.Context, _ string, frame int, _ string) ([]byte, error) {
	return fmt.Appendf(nil, "main of frame %d", frame), nil
}

func (j blendJob) FrameIndex(_ context.Context, _ string, frame int, _ string) (api.FrameIndex, error) {
	return j[frame], nil
}

func (j blendJob) FrameFile(_ context.Context, _ string, frame int, _ string, i int) ([]byte, error) {
	return fmt.Appendf(nil, "file %d of frame %d", i, frame), nil
}

// outputRoot is a temporary root with the directory outputs are written under two levels
// down (root/a/b/out), so that a path escaping it by "../.." still lands under root, where
// tree sees it.
func outputRoot(t *testing.T) (root, dir string) {
	root = t.TempDir()
	dir = filepath.Join(root, "a", "b", "out")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return root, dir
}

// tree lists everything under root but the directories outputRoot made.
func tree(t *testing.T, root string) []string {
	t.Helper()
	var got []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if rel = filepath.ToSlash(rel); !slices.Contains([]string{".", "a", "a/b", "a/b/out"}, rel) {
			got = append(got, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// Property: writeOutputs checks every frame's paths before writing the first byte, also where
// Blender's own relative paths are kept (render, with the .blend's directory as the base): a
// File Output file leaving the base refuses the job's outputs as bad input and leaves nothing
// written, not the frames before nor its own frame's main file.
func TestWriteOutputsChecksEveryPathBeforeWriting(t *testing.T) {
	for _, job := range []blendJob{
		{1: {Name: "//render/plate_0001.png", Files: []string{"../escape_0001.png"}}},
		{1: {Name: "//render/plate_0001.png"}, 2: {Name: "//render/plate_0002.png", Files: []string{"depth/../../escape_0002.png"}}},
	} {
		root, dir := outputRoot(t)
		st := job.status()
		err := writeOutputs(cmdCtx(t), job, &st, outputDest{Base: dir}, formatBlend)
		if !errors.Is(err, api.ErrBadInput) || !strings.Contains(err.Error(), "escape_000") {
			t.Errorf("writeOutputs(%v) = %v; want bad input naming the file", job, err)
		}
		if len(st.Outputs) != 0 {
			t.Errorf("writeOutputs(%v) reports %q written; want none", job, st.Outputs)
		}
		if got := tree(t, root); len(got) != 0 {
			t.Errorf("writeOutputs(%v) wrote %q under the temporary root; want nothing", job, got)
		}
	}
}
