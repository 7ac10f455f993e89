package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/client"
)

// blendJob is a completed job of format blend whose frames' indexes name their files as the
// case needs: a jobSource for writeOutputs, and a coordinator's HTTP API for the outputs
// command (serve). Each file's bytes say which frame and file they are.
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

// serve answers the coordinator's routes the outputs command reads, and returns their URL.
func (j blendJob) serve(t *testing.T) string {
	t.Helper()
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, v any) {
		if b, ok := v.([]byte); ok {
			w.Write(b)
			return
		}
		json.NewEncoder(w).Encode(v)
	}
	frame := func(r *http.Request) int {
		n, err := strconv.Atoi(r.PathValue("frame"))
		if err != nil {
			t.Errorf("request for frame %q", r.PathValue("frame"))
		}
		return n
	}
	mux.HandleFunc("GET /v1/jobs/job-1", func(w http.ResponseWriter, r *http.Request) { reply(w, j.status()) })
	mux.HandleFunc("GET /v1/jobs/job-1/frames/{frame}/blend/index", func(w http.ResponseWriter, r *http.Request) {
		reply(w, j[frame(r)])
	})
	mux.HandleFunc("GET /v1/jobs/job-1/frames/{frame}/blend", func(w http.ResponseWriter, r *http.Request) {
		if q := r.URL.Query().Get("file"); q != "" {
			i, _ := strconv.Atoi(q)
			data, _ := j.FrameFile(r.Context(), "job-1", frame(r), formatBlend, i)
			reply(w, data)
			return
		}
		data, _ := j.FrameOutput(r.Context(), "job-1", frame(r), formatBlend)
		reply(w, data)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Setenv(client.EnvToken, "")
	return srv.URL
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

// Property: outputs --dir writes a .blend's own output under the directory and nowhere else: a
// scene's output path that leaves it (by "..", also after cleaning) or is absolute is refused
// with exit 1, naming the path and --out, and so is a File Output file that leaves it; every
// frame's paths are checked before any is written, so nothing at all is written, not even the
// frames before the one refused nor the main file of a frame whose File Output file is.
func TestOutputsDirKeepsTheScenesOutputUnderIt(t *testing.T) {
	for _, c := range []struct {
		name string
		// job is the case's job under root, and what stderr must say of it.
		job func(root string) (blendJob, []string)
	}{
		{"parent of the directory", func(string) (blendJob, []string) {
			return blendJob{1: {Name: "//../../escaped_0001.png"}}, []string{`"//../../escaped_0001.png" leaves --dir`, "give --out"}
		}},
		{"parent after cleaning", func(string) (blendJob, []string) {
			return blendJob{1: {Name: "//render/../../escaped_0001.png"}}, []string{`"//render/../../escaped_0001.png" leaves --dir`, "give --out"}
		}},
		{"absolute", func(root string) (blendJob, []string) {
			abs := filepath.Join(root, "abs", "abs_0001.png")
			return blendJob{1: {Name: abs}}, []string{strconv.Quote(abs) + " is absolute", "give --out"}
		}},
		{"the last frame of several", func(string) (blendJob, []string) {
			return blendJob{1: {Name: "//render/plate_0001.png"}, 2: {Name: "//render/plate_0002.png"}, 3: {Name: "//../../escaped_0003.png"}},
				[]string{"frame 3", `"//../../escaped_0003.png" leaves --dir`, "give --out"}
		}},
		{"a File Output file", func(string) (blendJob, []string) {
			return blendJob{1: {Name: "//render/plate_0001.png", Files: []string{"depth/depth_0001.png", "../escape_0001.png"}}},
				[]string{"frame 1", `File Output file "../escape_0001.png" leaves --dir`}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			root, dir := outputRoot(t)
			job, says := c.job(root)
			code, stdout, stderr := run(t, "outputs", "job-1", "--dir", dir, "--server", job.serve(t))
			if code != api.ExitFailed {
				t.Errorf("exit %d, stderr %q: want 1", code, stderr)
			}
			for _, s := range says {
				if !strings.Contains(stderr, s) {
					t.Errorf("stderr %q does not say %q", stderr, s)
				}
			}
			if stdout != "" {
				t.Errorf("stdout %q: want no path, none was written", stdout)
			}
			if got := tree(t, root); len(got) != 0 {
				t.Errorf("written under the temporary root: %q; want nothing", got)
			}
		})
	}
}

// Property: the rule is the scene's paths' only: a scene path that stays under --dir after
// cleaning is written there with its File Output files, and --out, the user's own, is written
// where it says even absolute and even when the scene's own path would leave --dir.
func TestOutputsDirWritesWhatStaysUnderIt(t *testing.T) {
	root, dir := outputRoot(t)
	server := blendJob{1: {Name: "//render/../plate_0001.png", Files: []string{"depth/depth_0001.png"}}}.serve(t)
	if code, _, stderr := run(t, "outputs", "job-1", "--dir", dir, "--server", server); code != 0 {
		t.Fatalf("outputs --dir: exit %d, stderr %q", code, stderr)
	}
	for path, want := range map[string]string{"plate_0001.png": "main of frame 1", "depth/depth_0001.png": "file 0 of frame 1"} {
		if got, err := os.ReadFile(filepath.Join(dir, path)); err != nil || string(got) != want {
			t.Errorf("%s: %q, %v; want %q", path, got, err, want)
		}
	}

	root, dir = outputRoot(t)
	server = blendJob{1: {Name: "//../../escaped_0001.png"}}.serve(t)
	out := filepath.Join(root, "mine", "f_####")
	if code, _, stderr := run(t, "outputs", "job-1", "--dir", dir, "--out", out, "--server", server); code != 0 {
		t.Fatalf("outputs --out %s: exit %d, stderr %q", out, code, stderr)
	}
	if got := tree(t, root); !slices.Equal(got, []string{"mine", "mine/f_0001.png"}) {
		t.Errorf("written under the temporary root: %q; want only mine/f_0001.png", got)
	}
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

// parseBytes reads the sizes operators give --cache-size and --max-scene-bytes, and refuses
// what is not one.
func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"512": 512, "1K": 1 << 10, "512M": 512 << 20, "100G": 100 << 30, "2T": 2 << 40, "2TiB": 2 << 40, "3gb": 3 << 30} {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "-1G", "G", "1X", "1.5G", "99999999999T"} {
		if _, err := parseBytes(in); err == nil {
			t.Errorf("parseBytes(%q) accepted", in)
		}
	}
}
