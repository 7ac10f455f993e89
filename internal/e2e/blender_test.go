package e2e

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/blender/blendertest"
	"github.com/tilefarm/tilefarm/render"
	"github.com/tilefarm/tilefarm/tiles"
)

// blenderExample is the bundled Blender scene.
func blenderExample(t *testing.T) string { return blendertest.Example(t) }

// exampleSettings are the example scene's own settings, as the farm resolves them.
var exampleSettings = render.Settings{Camera: "Camera", Width: 160, Height: 120, SPP: 32, Seed: 7}

// sameFloats asserts two EXR files hold the same float pixels, bit for bit.
func sameFloats(t *testing.T, got, want string) {
	t.Helper()
	a, b := blendertest.ReadEXR(t, got), blendertest.ReadEXR(t, want)
	if a.Width != b.Width || a.Height != b.Height {
		t.Fatalf("%s is %dx%d, %s is %dx%d", got, a.Width, a.Height, want, b.Width, b.Height)
	}
	diff := 0
	for i := range a.Pix {
		if math.Float32bits(a.Pix[i]) != math.Float32bits(b.Pix[i]) {
			diff++
		}
	}
	if diff > 0 {
		t.Fatalf("%s differs from %s in %d of %d floats", got, want, diff, len(a.Pix))
	}
}

// Property: a Blender shot rendered by the farm equals `tileworker render` of each frame bit for
// bit, and Blender's own full-frame render of it to within float rounding.
func TestBlenderFarmEqualsReferenceAndBlender(t *testing.T) {
	dir := t.TempDir()
	r := run(t, "coordinator", "render", blenderExample(t), "--frames", "1-3", "--out", filepath.Join(dir, "f_####.exr"),
		"--data", filepath.Join(dir, "data"), "--workers", "2", "--json")
	if r.code != 0 {
		t.Fatalf("render: %s", r)
	}
	for frame := 1; frame <= 3; frame++ {
		got := frameFile(filepath.Join(dir, "f_####.exr"), frame)
		ref := filepath.Join(dir, fmt.Sprintf("ref_%d.exr", frame))
		if r := run(t, "tileworker", "render", blenderExample(t), "--frame", strconv.Itoa(frame), "--out", ref, "-q", "-j", "2"); r.code != 0 {
			t.Fatalf("reference: %s", r)
		}
		sameFloats(t, got, ref)
		own := blendertest.ReadEXR(t, blendertest.OwnRender(t, blenderExample(t), exampleSettings, frame, false))
		if d := blendertest.MaxRelDiff(blendertest.ReadEXR(t, got).Pix, own.Pix); d > 1e-5 {
			t.Fatalf("frame %d differs from Blender's own render by %g relative, want rounding only (< 1e-5)", frame, d)
		} else {
			t.Logf("frame %d: bit-identical to the reference, within %.2g relative of Blender's own render", frame, d)
		}
	}
}

// Property: tile size never changes a float (16, 37 and 64 px tiles give the same frame), and
// the farm's PNG of a Blender frame is Blender's own PNG of it to within one 8-bit level.
func TestBlenderTileSizesAndPNG(t *testing.T) {
	dir := t.TempDir()
	var exrs []string
	for _, size := range []string{"16", "37", "64"} {
		data := filepath.Join(dir, "data-"+size)
		out := filepath.Join(dir, "t"+size+"_####.exr")
		if r := run(t, "coordinator", "render", blenderExample(t), "--frames", "2", "--tile", size, "--out", out,
			"--data", data, "--workers", "2", "--json"); r.code != 0 {
			t.Fatalf("render with --tile %s: %s", size, r)
		}
		exrs = append(exrs, frameFile(out, 2))
	}
	sameFloats(t, exrs[1], exrs[0])
	sameFloats(t, exrs[2], exrs[0])

	// The same frame as PNG: the finished frame is reused, its PNG was encoded by the assembler.
	png := filepath.Join(dir, "p_####.png")
	r := run(t, "coordinator", "render", blenderExample(t), "--frames", "2", "--tile", "37", "--out", png,
		"--data", filepath.Join(dir, "data-37"), "--workers", "2", "--json")
	if r.code != 0 || !strings.Contains(r.stdout, `"tiles_rendered": 0`) {
		t.Fatalf("PNG of a finished frame rendered tiles again or failed: %s", r)
	}
	ours, theirs := decodePNG(t, frameFile(png, 2)), decodePNG(t, blendertest.OwnRender(t, blenderExample(t), exampleSettings, 2, true))
	d := blendertest.MaxLevelDiff(ours, theirs)
	if d > 1 {
		t.Fatalf("the farm's PNG differs from Blender's own by %d levels, want at most 1", d)
	}
	t.Logf("PNG within %d level of Blender's own", d)
}

// blenderChildren lists the Blender processes pid started.
func blenderChildren(t *testing.T, pid int) []int {
	t.Helper()
	var out []int
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, f := range tasks {
		data, _ := os.ReadFile(f)
		for _, field := range strings.Fields(string(data)) {
			child, err := strconv.Atoi(field)
			if err != nil {
				continue
			}
			if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", child)); err == nil && strings.Contains(filepath.Base(exe), "blender") {
				out = append(out, child)
			}
		}
	}
	return out
}

func processGone(pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if err := syscall.Kill(pid, 0); err == syscall.ESRCH {
			return true
		}
		// A zombie is gone too: it renders nothing and holds nothing but its exit status.
		if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
			if f := strings.Fields(string(data)); len(f) > 2 && f[2] == "Z" {
				return true
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// A tileworker killed with SIGKILL in the middle of a Blender tile: its Blender process dies
// with it, and another worker with an empty local directory resumes the tile from the remote
// checkpoint, rendering only the missing passes, into a frame equal to the reference.
func TestBlenderWorkerKilledMidTileResumesElsewhere(t *testing.T) {
	f := startServe(t, t.TempDir(), "--ack-wait", "4s", "--lease-ttl", "4s")
	// One tile per frame, 8 passes of 32 samples, each checkpointed remotely as it ends.
	const spp, pass = 256, 32
	settings := []string{"--tile", "160", "--spp", strconv.Itoa(spp), "--passes", strconv.Itoa(spp / pass)}
	a := f.worker("victim", t.TempDir(), "--checkpoint-every", "0", "--remote-checkpoint-every", "0")
	st, r := f.submit(append([]string{blenderExample(t), "--frames", "5", "--format", "exr"}, settings...)...)
	if r.code != 42 && r.code != 3 {
		t.Fatalf("submit: %s", r)
	}
	ft, err := tiles.FrameTiles(st.Frames[0].FrameKey, 160, 120, 160)
	if err != nil || len(ft) != 1 {
		t.Fatalf("tiles of the frame: %v %v", ft, err)
	}
	waitRemoteCheckpoint(t, f, ft[0].Key, 2*pass)
	// The tile's progress shows in the job's status while it renders, pass by pass.
	for deadline := time.Now().Add(10 * time.Second); ; {
		now, _ := f.status(st.JobID)
		if now.SamplesDone >= 2*pass && now.TilesCompleted == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status shows %d/%d samples done while the tile renders, want at least %d", now.SamplesDone, now.SamplesTotal, 2*pass)
		}
		time.Sleep(50 * time.Millisecond)
	}
	children := blenderChildren(t, a.Pid())
	if len(children) == 0 {
		t.Fatal("the victim runs no Blender process")
	}
	a.Kill()
	if now, _ := f.status(st.JobID); now.State == "completed" || now.TilesCompleted != 0 {
		t.Fatalf("the kill landed after the tile was done: %+v", now)
	}
	for _, pid := range children {
		if !processGone(pid, 10*time.Second) {
			t.Fatalf("Blender process %d outlived its killed worker", pid)
		}
	}

	b := f.worker("successor", t.TempDir()) // an empty local directory: only the remote checkpoint
	done := f.waitDone(st.JobID, 3*time.Minute)
	if done.State != "completed" {
		t.Fatalf("job after the kill: %+v", done)
	}
	if done.SamplesRecovered < 2*pass || done.SamplesRecovered%pass != 0 || done.SamplesRecovered >= spp {
		t.Fatalf("samples recovered %d: want whole passes, at least the %d checkpointed before the kill", done.SamplesRecovered, 2*pass)
	}
	// Blender prints "Sample 32/32" as each 32-sample pass ends: the successor rendered only
	// the passes the checkpoint lacked.
	passes := len(regexp.MustCompile(fmt.Sprintf(`Sample %d/%d\b`, pass, pass)).FindAllString(b.Log(), -1))
	if want := (spp - done.SamplesRecovered) / pass; passes != want {
		t.Fatalf("the successor rendered %d passes, want the %d missing ones", passes, want)
	}
	if !strings.Contains(b.Log(), "resuming from checkpoint") {
		t.Fatal("the successor did not say it resumed from the checkpoint")
	}
	out := filepath.Join(t.TempDir(), "f_####.exr")
	if r := f.cli("outputs", st.JobID, "--out", out, "--format", "exr"); r.code != 0 {
		t.Fatalf("outputs: %s", r)
	}
	ref := filepath.Join(t.TempDir(), "ref.exr")
	if r := run(t, "tileworker", append([]string{"render", blenderExample(t), "--frame", "5", "--out", ref, "-q"}, settings...)...); r.code != 0 {
		t.Fatalf("reference: %s", r)
	}
	sameFloats(t, frameFile(out, 5), ref)
	f.assertNoDeadLetters()
}

// Scenes that would render wrong (magenta textures, dropped objects, scripts not run) or not
// at all are refused at submit with a clear message and exit 1, and nothing is half-written:
// no output, no stored scene, no job.
func TestBlenderBadInputIsRefused(t *testing.T) {
	dir := t.TempDir()
	blendertest.Run(t, "--python", filepath.Join(blendertest.Root(t), "blender", "testdata", "make_bad.py"), "--", blenderExample(t), dir)
	if err := os.Remove(filepath.Join(dir, "lib", "props.blend")); err != nil {
		t.Fatal(err)
	}
	blend, err := os.ReadFile(blenderExample(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "bare"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"bare/scene.blend": blend, "notes.blend": []byte("not a blend file\n")} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct{ name, file, want string }{
		{"missing texture", "bare/scene.blend", "needs //textures/checker.png, which is missing"},
		{"missing linked library", "linked.blend", "needs //lib/props.blend, which is missing"},
		{"not a blend", "notes.blend", "is not a .blend file"},
		{"no camera", "nocamera.blend", "has no camera"},
		{"needs autoexec", "autoexec.blend", "needs Python scripts to run"},
	}
	f := startServe(t, t.TempDir())
	for _, c := range cases {
		scene := filepath.Join(dir, c.file)
		out := t.TempDir()
		for _, cmd := range []struct {
			name string
			r    result
		}{
			{"coordinator render", run(t, "coordinator", "render", scene, "--frames", "1", "--out", filepath.Join(out, "f_####.png"), "--data", filepath.Join(out, "data"))},
			{"tileworker render", run(t, "tileworker", "render", scene, "--frame", "1", "--out", filepath.Join(out, "ref.png"))},
			{"coordinator submit", f.cli("submit", scene, "--frames", "1")},
		} {
			if cmd.r.code != 1 || !strings.Contains(cmd.r.stderr, c.want) {
				t.Errorf("%s of a scene with a %s: want exit 1 saying %q, got %s", cmd.name, c.name, c.want, cmd.r)
			}
		}
		if outs, _ := filepath.Glob(filepath.Join(out, "*.png")); len(outs) > 0 {
			t.Errorf("%s: outputs written: %v", c.name, outs)
		}
	}
	if r := f.cli("jobs", "--json"); r.code != 0 || strings.Contains(r.stdout, "job-") {
		t.Fatalf("refused submissions left jobs: %s", r)
	}
	if scenes, _ := filepath.Glob(filepath.Join(f.Data, "store", "scenes", "*")); len(scenes) > 0 {
		t.Fatalf("refused submissions stored scenes: %v", scenes)
	}

	// What cannot be split is switched off, and submit says so, one line per setting.
	r := f.cli("submit", filepath.Join(dir, "unsplittable.blend"), "--frames", "1")
	if r.code != 42 {
		t.Fatalf("submitting a scene with unsplittable settings: %s", r)
	}
	for _, w := range []string{"adaptive sampling", "denoising", "compositing"} {
		if n := strings.Count(r.stderr, w); n != 1 {
			t.Errorf("submit said %d times that %s is switched off, want once:\n%s", n, w, r.stderr)
		}
	}
}
