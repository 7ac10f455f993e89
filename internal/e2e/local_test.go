//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
)

func renderJSON(t *testing.T, args ...string) api.Status {
	t.Helper()
	r := run(t, "coordinator", append([]string{"render", "--json"}, args...)...)
	if r.code != 0 {
		t.Fatalf("coordinator render: %s", r)
	}
	var st api.Status
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("decoding --json output: %v\n%s", err, r)
	}
	return st
}

// A one-shot farm render equals the reference, and a re-run renders nothing.
func TestRenderEqualsReferenceAndRerunReusesEverything(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	data := t.TempDir()
	out := filepath.Join(t.TempDir(), "shot_####.png")
	args := append([]string{scene, "--frames", "1-3", "--out", out, "--data", data, "--workers", "2"}, small...)

	st := renderJSON(t, args...)
	if st.State != "completed" || st.FramesCompleted != 3 || st.TilesTotal != 3*6 || st.TilesCompleted != st.TilesTotal {
		t.Fatalf("first render: %+v", st)
	}
	if st.TilesRendered != st.TilesTotal || st.TilesReused != 0 {
		t.Fatalf("first render: tiles_rendered %d tiles_reused %d, want %d and 0", st.TilesRendered, st.TilesReused, st.TilesTotal)
	}
	if len(st.Outputs) != 3 {
		t.Fatalf("outputs %v, want 3 files", st.Outputs)
	}
	for f := 1; f <= 3; f++ {
		got := filepath.Join(filepath.Dir(out), fmt.Sprintf("shot_%04d.png", f))
		samePixels(t, got, reference(t, scene, f, small...))
	}

	again := renderJSON(t, args...)
	if again.JobID != st.JobID {
		t.Fatalf("re-run job %s, first %s", again.JobID, st.JobID)
	}
	if again.TilesRendered != 0 || again.TilesReused != again.TilesTotal || again.TileAttempts != st.TileAttempts {
		t.Fatalf("re-run: tiles_rendered %d tiles_reused %d of %d, attempts %d (first %d): want nothing rendered",
			again.TilesRendered, again.TilesReused, again.TilesTotal, again.TileAttempts, st.TileAttempts)
	}
}

// Another tile size is the same picture: tiling is not part of a frame's identity.
func TestRenderTileSizeDoesNotChangePixels(t *testing.T) {
	t.Parallel()
	scene := example("cornell")
	out := filepath.Join(t.TempDir(), "c_####.png")
	st := renderJSON(t, scene, "--frames", "1", "--out", out, "--data", t.TempDir(),
		"--width", "64", "--height", "64", "--spp", "4", "--tile", "23")
	if st.TilesTotal != 9 {
		t.Fatalf("tiles_total %d, want 9 tiles of 23 px on 64x64", st.TilesTotal)
	}
	samePixels(t, st.Outputs[0], reference(t, scene, 1, "--width", "64", "--height", "64", "--spp", "4", "--tile", "64"))
}

func TestRenderBadInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"reversed frames", []string{"render", example("shot"), "--frames", "5-2", "--out", dir + "/x_####.png"}, 1, "reversed"},
		{"missing scene", []string{"render", dir + "/nope.json", "--out", dir + "/x.png"}, 1, "nope.json"},
		{"no out", []string{"render", example("shot"), "--frames", "1"}, 2, "--out"},
		{"pattern without ####", []string{"render", example("shot"), "--frames", "1-2", "--out", dir + "/x.png"}, 2, "####"},
		{"bad frames", []string{"render", example("shot"), "--frames", "a-b", "--out", dir + "/x.png"}, 2, "--frames"},
		{"unknown flag", []string{"render", "--bogus"}, 2, "bogus"},
		{"unknown command", []string{"frobnicate"}, 2, "unknown command"},
		{"absurd spp", []string{"render", example("shot"), "--frames", "1", "--spp", "999999999", "--out", dir + "/x.png"}, 1, "spp"},
		{"unknown camera", []string{"render", example("shot"), "--frames", "1", "--camera", "nope", "--out", dir + "/x.png"}, 1, "nope"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := run(t, "coordinator", append(c.args, "--data", dir+"/d")...)
			if r.code != c.code || !containsFold(r.stderr, c.want) {
				t.Fatalf("want exit %d and %q in stderr, got %s", c.code, c.want, r)
			}
		})
	}
	if matches, _ := filepath.Glob(dir + "/x*"); len(matches) > 0 {
		t.Fatalf("bad input left outputs behind: %v", matches)
	}
}

// Ctrl-C during `coordinator render`, then the same command again: finished tiles are reused,
// the rest are rendered (in-flight ones from their checkpoints), and the frames equal the reference.
func TestRenderInterruptedThenResumed(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	data := t.TempDir()
	out := filepath.Join(t.TempDir(), "i_####.png")
	// Heavy enough (about 0.3 s a tile on this machine, 24 tiles on one worker: 7 s) that the first progress line,
	// printed after 2 s when not on a terminal, comes well before the end.
	heavy := []string{"--width", "64", "--height", "36", "--spp", "2048", "--tile", "16"}
	args := append([]string{"render", scene, "--frames", "1-2", "--out", out, "--data", data, "--workers", "1"}, heavy...)
	p := start(t, "coordinator", args...)
	if _, err := p.WaitLog(t.Context(), regexp.MustCompile(`\b[1-9]\d*/24 tiles`), 0, 60*time.Second); err != nil {
		t.Fatalf("no progress before the interrupt: %v\n%s", err, p.Log())
	}
	p.Signal(syscall.SIGINT)
	if !p.WaitExit(30 * time.Second) {
		t.Fatalf("render did not stop on SIGINT:\n%s", p.Log())
	}
	if code := p.ExitCode(); code != 130 {
		t.Fatalf("exit code %d after SIGINT, want 130:\n%s", code, p.Log())
	}
	st := renderJSON(t, append(args[1:], "--workers", "2")...)
	if st.State != "completed" || st.TilesReused == 0 || st.TilesReused+st.TilesRendered != st.TilesTotal || st.TilesRendered == 0 {
		t.Fatalf("resumed render: reused %d rendered %d of %d (%s)", st.TilesReused, st.TilesRendered, st.TilesTotal, st.State)
	}
	for f := 1; f <= 2; f++ {
		samePixels(t, frameFile(out, f), reference(t, scene, f, heavy...))
	}
}
