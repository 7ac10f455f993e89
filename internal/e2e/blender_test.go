//go:build linux

package e2e

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/blender"
	"github.com/tilefarm/tilefarm/blender/blendertest"
	"github.com/tilefarm/tilefarm/render"
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
	t.Parallel()
	dir := t.TempDir()
	r := run(t, "coordinator", "render", blenderExample(t), "--frames", "1-3", "--out", filepath.Join(dir, "f_####.exr"), "--format", "exr",
		"--data", filepath.Join(dir, "data"), "--workers", "2", "--json")
	if r.code != 0 {
		t.Fatalf("render: %s", r)
	}
	for frame := 1; frame <= 3; frame++ {
		got := frameFile(filepath.Join(dir, "f_####.exr"), frame)
		ref := filepath.Join(dir, fmt.Sprintf("ref_%d.exr", frame))
		if r := run(t, "tileworker", "render", blenderExample(t), "--frame", strconv.Itoa(frame), "--out", ref, "--format", "exr", "-q", "-j", "2"); r.code != 0 {
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
	t.Parallel()
	dir := t.TempDir()
	var exrs []string
	for _, size := range []string{"16", "37", "64"} {
		data := filepath.Join(dir, "data-"+size)
		out := filepath.Join(dir, "t"+size+"_####.exr")
		if r := run(t, "coordinator", "render", blenderExample(t), "--frames", "2", "--tile", size, "--out", out, "--format", "exr",
			"--data", data, "--workers", "2", "--json"); r.code != 0 {
			t.Fatalf("render with --tile %s: %s", size, r)
		}
		exrs = append(exrs, frameFile(out, 2))
	}
	sameFloats(t, exrs[1], exrs[0])
	sameFloats(t, exrs[2], exrs[0])

	// The same frame as PNG: the finished frame is reused, its PNG was encoded by the assembler.
	png := filepath.Join(dir, "p_####.png")
	r := run(t, "coordinator", "render", blenderExample(t), "--frames", "2", "--tile", "37", "--out", png, "--format", "png",
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
			if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", child)); err == nil && isBlender(exe) {
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

// Scenes that would render wrong (magenta textures, dropped objects, scripts not run) or not
// at all are refused at submit with a clear message and exit 1, and nothing is half-written:
// no output, no stored scene, no job.
func TestBlenderBadInputIsRefused(t *testing.T) {
	t.Parallel()
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

	// What cannot be split makes the frame render whole, and submit says so; with --split it is
	// switched off instead, one line per setting; a denoiser this Blender lacks is said either way.
	for _, c := range []struct {
		split bool
		want  []string
	}{
		{false, []string{"renders whole", "adaptive sampling", "no denoiser"}},
		{true, []string{"adaptive sampling (noise threshold 0.01) is off", "no denoiser"}},
	} {
		args := []string{"submit", filepath.Join(dir, "unsplittable.blend"), "--frames", "1"}
		if c.split {
			args = append(args, "--split")
		}
		r := f.cli(args...)
		if r.code != 42 {
			t.Fatalf("submitting a scene with unsplittable settings (split %v): %s", c.split, r)
		}
		for _, w := range c.want {
			if n := strings.Count(r.stderr, w); n != 1 {
				t.Errorf("submit (split %v) said %q %d times, want once:\n%s", c.split, w, n, r.stderr)
			}
		}
		if strings.Contains(r.stderr, "compositing") {
			t.Errorf("submit says compositing is off, but the compositor runs at assembly:\n%s", r.stderr)
		}
	}
}

// isBlender reports whether the executable exe runs a Blender build: Blender's own, or a
// Python (with bpy, blender.IsPython).
func isBlender(exe string) bool {
	return strings.Contains(filepath.Base(exe), "blender") || blender.IsPython(exe)
}

// Property: a .blend made on Windows, its files named "//textures\checker.png", renders on the
// farm's Linux workers as Blender on Linux renders it (which reads the backslashes as Windows
// separators), its texture found: equal to Blender's own render of the same file and of the
// example it was made from. A drive letter or a UNC path cannot travel: refused, named.
func TestBlenderWindowsPathsRenderAsBlendersOwn(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.CopyFS(filepath.Join(dir, "textures"), os.DirFS(filepath.Join(filepath.Dir(blenderExample(t)), "textures"))); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(blendertest.Root(t), "blender", "testdata", "make_winpaths.py")
	win := filepath.Join(dir, "windows.blend")
	blendertest.Run(t, blenderExample(t), "--python", script, "--", win)
	out := filepath.Join(dir, "w_####.exr")
	if r := run(t, "coordinator", "render", win, "--frames", "1", "--out", out, "--format", "exr", "--data", filepath.Join(dir, "data")); r.code != 0 {
		t.Fatalf("render of the Windows .blend: %s", r)
	}
	got := blendertest.ReadEXR(t, frameFile(out, 1))
	for what, blend := range map[string]string{"the Windows .blend": win, "the example": blenderExample(t)} {
		own := blendertest.ReadEXR(t, blendertest.OwnRender(t, blend, exampleSettings, 1, false))
		if d := blendertest.MaxRelDiff(got.Pix, own.Pix); d > 1e-5 {
			t.Fatalf("the farm's frame of the Windows .blend differs from Blender's own render of %s by %g relative", what, d)
		}
	}
	abs := filepath.Join(dir, "absolute.blend")
	blendertest.Run(t, blenderExample(t), "--python", script, "--", abs, "absolute")
	r := run(t, "coordinator", "render", abs, "--frames", "1", "--out", out, "--format", "exr", "--data", filepath.Join(dir, "data2"))
	// Blender names them with its own separators.
	if r.code != 1 || !strings.Contains(r.stderr, `image 'Drive' uses the absolute path C:/textures/wood.png`) ||
		!strings.Contains(r.stderr, `image 'Share' uses the absolute path \\server/share/wood.png`) || !strings.Contains(r.stderr, "make paths relative") {
		t.Fatalf("a .blend naming a drive letter and a UNC path: %s", r.String())
	}
}
