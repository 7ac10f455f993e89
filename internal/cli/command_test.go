package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/scene/jsonscene"
	"github.com/tilefarm/tilefarm/objstore"
)

const shotScene = "../../examples/shot/scene.json"

func cmdCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// run runs the coordinator command in-process.
func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Coordinator(cmdCtx(t), args, &out, &errb)
	return code, out.String(), errb.String()
}

func decodePNG(t *testing.T, path string) image.Image {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("opening output: %v", err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("decoding %s: %v", path, err)
	}
	return img
}

// renderSummary is the part of `render --json` the command contract promises.
type renderSummary struct {
	JobID           string   `json:"job_id"`
	State           string   `json:"state"`
	FramesTotal     int      `json:"frames_total"`
	FramesCompleted int      `json:"frames_completed"`
	TilesTotal      int      `json:"tiles_total"`
	TilesCompleted  int      `json:"tiles_completed"`
	TilesRendered   int      `json:"tiles_rendered"`
	TilesReused     int      `json:"tiles_reused"`
	Outputs         []string `json:"outputs"`
}

func TestRenderInProcess(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	pattern := filepath.Join(dir, "out", "shot_####.png")
	args := []string{"render", shotScene, "--frames", "1-2", "--out", pattern, "--width", "48", "--height", "27",
		"--spp", "2", "--tile", "16", "--workers", "2", "--data", data, "--json"}

	code, stdout, stderr := run(t, args...)
	if code != 0 {
		t.Fatalf("render exit %d, stderr:\n%s", code, stderr)
	}
	var sum renderSummary
	if err := json.Unmarshal([]byte(stdout), &sum); err != nil {
		t.Fatalf("--json output is not one JSON object: %v\n%s", err, stdout)
	}
	const tilesPerFrame = 3 * 2 // 48x27 in 16 px tiles
	if sum.JobID == "" || sum.State != "completed" || sum.FramesTotal != 2 || sum.FramesCompleted != 2 ||
		sum.TilesTotal != 2*tilesPerFrame || sum.TilesCompleted != sum.TilesTotal ||
		sum.TilesRendered != sum.TilesTotal || sum.TilesReused != 0 {
		t.Errorf("first render summary = %+v", sum)
	}
	wantOut := []string{filepath.Join(dir, "out", "shot_0001.png"), filepath.Join(dir, "out", "shot_0002.png")}
	if strings.Join(sum.Outputs, ",") != strings.Join(wantOut, ",") {
		t.Errorf("outputs %q, want %q", sum.Outputs, wantOut)
	}
	for _, p := range wantOut {
		if b := decodePNG(t, p).Bounds(); b.Dx() != 48 || b.Dy() != 27 {
			t.Errorf("%s is %dx%d, want 48x27", p, b.Dx(), b.Dy())
		}
	}
	farm1 := decodePNG(t, wantOut[0])

	// A re-run in the same --data renders nothing and writes the outputs again.
	if err := os.Remove(wantOut[0]); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = run(t, args...)
	if code != 0 {
		t.Fatalf("second render exit %d, stderr:\n%s", code, stderr)
	}
	var again renderSummary
	if err := json.Unmarshal([]byte(stdout), &again); err != nil {
		t.Fatalf("second --json output: %v\n%s", err, stdout)
	}
	if again.JobID != sum.JobID || again.TilesRendered != 0 || again.TilesReused != sum.TilesTotal || again.State != "completed" {
		t.Errorf("re-run summary = %+v, want the same job with every tile reused", again)
	}
	if _, err := os.Stat(wantOut[0]); err != nil {
		t.Errorf("re-run did not write %s again: %v", wantOut[0], err)
	}

	// The farm's frame equals the no-farm reference, with another tile size, pixel for pixel.
	ref := filepath.Join(dir, "ref.png")
	var wout, werr bytes.Buffer
	if code := Tileworker(cmdCtx(t), []string{"render", shotScene, "--frame", "1", "--out", ref, "--width", "48",
		"--height", "27", "--spp", "2", "--tile", "7", "-j", "2", "-q"}, &wout, &werr); code != 0 {
		t.Fatalf("tileworker render exit %d: %s", code, werr.String())
	}
	refImg := decodePNG(t, ref)
	for y := 0; y < 27; y++ {
		for x := 0; x < 48; x++ {
			if farm1.At(x, y) != refImg.At(x, y) {
				t.Fatalf("pixel (%d,%d): farm %v, reference %v", x, y, farm1.At(x, y), refImg.At(x, y))
			}
		}
	}
}

func TestRenderRejectsBadArgumentsBeforeStarting(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	out := filepath.Join(dir, "o_####.png")
	for _, c := range []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"no scene", []string{"render", "--out", out, "--data", data}, 2, "SCENE"},
		{"two scenes", []string{"render", shotScene, shotScene, "--out", out, "--data", data}, 2, "SCENE"},
		{"no out", []string{"render", shotScene, "--data", data}, 2, "--out"},
		{"unknown flag", []string{"render", shotScene, "--out", out, "--bogus", "--data", data}, 2, "bogus"},
		{"bad frames", []string{"render", shotScene, "--frames", "a-b", "--out", out, "--data", data}, 2, "--frames"},
		{"reversed frames", []string{"render", shotScene, "--frames", "5-2", "--out", out, "--data", data}, 1, "reversed"},
		{"no #### for many frames", []string{"render", shotScene, "--frames", "1-3", "--out", filepath.Join(dir, "o.png"), "--data", data}, 2, "####"},
		{"zero tile", []string{"render", shotScene, "--tile", "0", "--out", out, "--data", data}, 2, "--tile"},
		{"bad format", []string{"render", shotScene, "--format", "jpg", "--out", out, "--data", data}, 2, "jpg"},
		{"missing scene", []string{"render", filepath.Join(dir, "nope.json"), "--out", out, "--data", data}, 1, "nope.json"},
		{"unknown command", []string{"rendr"}, 2, "rendr"},
	} {
		code, stdout, stderr := run(t, c.args...)
		if code != c.code || !strings.Contains(stderr, c.msg) || stdout != "" {
			t.Errorf("%s: exit %d, stderr %q, stdout %q; want exit %d mentioning %q", c.name, code, stderr, stdout, c.code, c.msg)
		}
	}
	if _, err := os.Stat(data); !os.IsNotExist(err) {
		t.Errorf("rejected commands created %s (err %v): nothing may be half-written", data, err)
	}

	// Settings the scene rejects are bad input (exit 1) naming the field. The coordinator
	// validates them, so these reach a started node: they get a --data of their own.
	data2 := filepath.Join(dir, "data2")
	for _, c := range []struct {
		name string
		args []string
		msg  string
	}{
		{"negative spp", []string{"--spp", "-1"}, "spp"},
		{"absurd spp", []string{"--spp", "1000000000"}, "spp"},
		{"unknown camera", []string{"--camera", "dolly"}, "dolly"},
	} {
		args := append([]string{"render", shotScene, "--frames", "1", "--out", out, "--data", data2}, c.args...)
		code, stdout, stderr := run(t, args...)
		if code != api.ExitFailed || !strings.Contains(stderr, c.msg) || stdout != "" {
			t.Errorf("%s: exit %d, stderr %q, stdout %q; want exit 1 naming %q", c.name, code, stderr, stdout, c.msg)
		}
	}
	if matches, _ := filepath.Glob(filepath.Join(dir, "o_*.png")); len(matches) != 0 {
		t.Errorf("rejected renders wrote %v", matches)
	}
}

func TestStatusUnreachableIsRetryable(t *testing.T) {
	code, _, stderr := run(t, "status", "job-123", "--server", "http://127.0.0.1:1")
	if code != api.ExitBusy || !strings.Contains(stderr, "retry later") {
		t.Errorf("status against no coordinator: exit %d, stderr %q; want 75 and a retry hint", code, stderr)
	}
}

func TestCoordinatorUsage(t *testing.T) {
	code, stdout, stderr := run(t)
	if code != api.ExitUsage || !strings.Contains(stderr, "Usage:\n  coordinator") || stdout != "" {
		t.Errorf("no args: exit %d, stderr %q", code, stderr)
	}
	for _, h := range []string{"-h", "--help", "help"} {
		code, stdout, _ := run(t, h)
		if code != api.ExitOK || !strings.Contains(stdout, "Usage:\n  coordinator") {
			t.Errorf("coordinator %s: exit %d, stdout %q; want 0 and the usage", h, code, stdout)
		}
		for _, cmd := range []string{"render", "serve", "submit", "status", "watch", "jobs", "outputs", "cancel", "reprioritize",
			"workers", "dlq", "gc", "credentials", "completion"} {
			if !strings.Contains(stdout, "\n  "+cmd+" ") {
				t.Errorf("coordinator %s does not list %q:\n%s", h, cmd, stdout)
			}
		}
	}
	code, stdout, _ = run(t, "--version")
	if code != api.ExitOK || !strings.HasPrefix(stdout, "coordinator ") || !strings.Contains(stdout, jsonscene.Build()) {
		t.Errorf("--version: exit %d, %q", code, stdout)
	}
	code, stdout, _ = run(t, "completion", "bash")
	if code != api.ExitOK || !strings.Contains(stdout, "bash completion") {
		t.Errorf("completion bash: exit %d, %.200q", code, stdout)
	}
}

func TestSubcommandHelp(t *testing.T) {
	type helpCase struct {
		name        string
		run         func(stdout, stderr *bytes.Buffer) int
		synopsis    string
		description string
		flag        string
	}
	coord := func(args ...string) func(stdout, stderr *bytes.Buffer) int {
		return func(stdout, stderr *bytes.Buffer) int { return Coordinator(cmdCtx(t), args, stdout, stderr) }
	}
	tw := func(args ...string) func(stdout, stderr *bytes.Buffer) int {
		return func(stdout, stderr *bytes.Buffer) int { return Tileworker(cmdCtx(t), args, stdout, stderr) }
	}
	cases := []helpCase{
		{"coordinator render", coord("render", "-h"), "coordinator render SCENE", "Render frames of SCENE on this machine", "--frames"},
		{"coordinator serve", coord("serve", "-h"), "coordinator serve", "Run the coordinator daemon", "--max-pending-tiles"},
		{"coordinator submit", coord("submit", "-h"), "coordinator submit SCENE", "Submit SCENE to a running coordinator", "--idempotency-key"},
		{"coordinator submit (dependencies)", coord("submit", "-h"), "coordinator submit SCENE", "--after JOB[,JOB...] makes the job wait", "--after-frames"},
		{"coordinator status", coord("status", "-h"), "coordinator status JOB", "Show where JOB stands", "--json"},
		{"coordinator cancel", coord("cancel", "--help"), "coordinator cancel JOB", "Cancel JOB", "--server"},
		{"coordinator reprioritize", coord("reprioritize", "-h"), "coordinator reprioritize JOB PRIORITY", "new priority", "--server"},
		{"coordinator workers", coord("workers", "-h"), "coordinator workers", "List the live workers", "--json"},
		{"coordinator jobs", coord("jobs", "-h"), "coordinator jobs", "List every job", "--server"},
		{"coordinator outputs", coord("outputs", "-h"), "coordinator outputs JOB", "Download the finished frames", "--out"},
		{"coordinator dlq list", coord("dlq", "list", "-h"), "coordinator dlq list", "List dead-lettered tiles", "--server"},
		{"coordinator gc", coord("gc", "-h"), "coordinator gc", "Delete attempt objects", "--grace"},
		{"coordinator render (flag after positional)", coord("render", shotScene, "-h"), "coordinator render SCENE", "Render frames of SCENE", "--out"},
		{"tileworker", tw("-h"), "tileworker [--nats URL]", "Run a worker daemon", "--concurrency"},
		{"tileworker render", tw("render", "-h"), "tileworker render SCENE", "Render one frame of SCENE", "--frame"},
	}
	codes := map[int][]string{}
	for _, c := range cases {
		var stdout, stderr bytes.Buffer
		code := c.run(&stdout, &stderr)
		codes[code] = append(codes[code], c.name)
		text := stdout.String()
		if !strings.Contains(text, "Usage:\n  "+c.synopsis) {
			t.Errorf("%s -h: usage lacks the synopsis %q:\n%s", c.name, c.synopsis, text)
		}
		if !strings.Contains(text, c.description) || !strings.Contains(text, "Flags:") || !strings.Contains(text, c.flag) {
			t.Errorf("%s -h: help lacks the description %q or the flag %q:\n%s", c.name, c.description, c.flag, text)
		}
		if strings.Contains(text, "--fault-") {
			t.Errorf("%s -h shows a test-only fault flag:\n%s", c.name, text)
		}
		if stderr.Len() != 0 {
			t.Errorf("%s -h wrote to stderr: %q", c.name, stderr.String())
		}
	}
	if len(codes) != 1 {
		t.Errorf("-h exit codes differ between subcommands: %v", codes)
	}
	for code := range codes {
		if code != api.ExitOK {
			t.Errorf("-h exits %d, want 0: help was asked for, nothing went wrong", code)
		}
	}
}

// TestRenderSameDataOtherFormat: rendering PNGs and then the same frames as EXR into the same
// --data is an ordinary thing to do and must give the EXR (see the coordinator tests
// TestSubmitOtherFormatWithoutKeyIsNoConflict and TestSubmitSharedFrameGetsRequestedFormats).
func TestRenderSameDataOtherFormat(t *testing.T) {
	dir := t.TempDir()
	common := []string{shotScene, "--frames", "3", "--width", "32", "--height", "18", "--spp", "1", "--workers", "2",
		"--data", filepath.Join(dir, "data"), "--json"}
	if code, _, stderr := run(t, append([]string{"render", "--out", filepath.Join(dir, "a_####.png")}, common...)...); code != 0 {
		t.Fatalf("png render exit %d: %s", code, stderr)
	}
	exr := filepath.Join(dir, "a_####.exr")
	code, _, stderr := run(t, append([]string{"render", "--out", exr}, common...)...)
	if code != 0 {
		t.Fatalf("exr render after a png render in the same --data: exit %d: %s", code, stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "a_0003.exr")); err != nil {
		t.Errorf("exr not written: %v", err)
	}
}

// Property: gc never deletes the checkpoint of a tile not promoted (its frame may render again
// or be revived and resume from it), and deletes an old one of a promoted tile.
func TestGCKeepsCheckpointsOfTilesNotPromoted(t *testing.T) {
	data := t.TempDir()
	store, err := objstore.NewFSStore(filepath.Join(data, "store"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := cmdCtx(t)
	for _, tile := range []string{"done", "open"} {
		if err := store.Put(ctx, layout.CheckpointKey(tile), []byte("checkpoint of "+tile)); err != nil {
			t.Fatal(err)
		}
		old := time.Now().Add(-48 * time.Hour)
		if err := os.Chtimes(filepath.Join(data, "store", layout.CheckpointKey(tile)), old, old); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := finalize.Promote(ctx, store, layout.TileManifestKey("frame", "done"), "a1", "build",
		[]finalize.Output{{Name: layout.TileOutputName, Data: []byte("pixels")}}, nil); err != nil {
		t.Fatal(err)
	}
	code, out, errs := run(t, "gc", "--data", data)
	if code != 0 {
		t.Fatalf("gc: %d %s %s", code, out, errs)
	}
	if _, err := store.Get(ctx, layout.CheckpointKey("open")); err != nil {
		t.Fatalf("gc deleted the checkpoint of a tile not promoted: %v (%s)", err, out)
	}
	if _, err := store.Get(ctx, layout.CheckpointKey("done")); !errors.Is(err, objstore.ErrNotFound) {
		t.Fatalf("gc kept the old checkpoint of a promoted tile: %v (%s)", err, out)
	}
}
