// Package blendertest gives tests a real Blender: the binary, the bundled example scene and a
// process pool cleaned up with the test. A test that needs Blender fails when it is missing,
// never skips: the test command installs the pinned Blender first.
package blendertest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/tilefarm/tilefarm/blender"
	"github.com/tilefarm/tilefarm/raster"
	"github.com/tilefarm/tilefarm/render"
)

// EnvBinary names the variable that points tests at a Blender executable.
const EnvBinary = "TILEFARM_BLENDER"

// Binary returns the Blender executable: $TILEFARM_BLENDER, else blender on PATH.
func Binary(t testing.TB) string {
	t.Helper()
	if b := os.Getenv(EnvBinary); b != "" {
		return b
	}
	b, err := exec.LookPath("blender")
	if err != nil {
		t.Fatalf("Blender is needed and missing: run ./test.sh (it installs Blender 3.4.1) or set %s", EnvBinary)
	}
	return b
}

// Root is the repository's root directory.
func Root(t testing.TB) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the repository")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Example is the path of the bundled example Blender scene.
func Example(t testing.TB) string {
	return filepath.Join(Root(t), "examples", "blender", "scene.blend")
}

// Pool starts a pool of size Blender processes working in a temporary directory, closed when
// the test ends.
func Pool(t testing.TB, size int) *blender.Pool {
	t.Helper()
	p := blender.NewPool(blender.Options{Binary: Binary(t), Dir: t.TempDir(), Size: size})
	t.Cleanup(func() { p.Close() })
	return p
}

// Run runs Blender with args (after -b --factory-startup) and fails the test on error.
func Run(t testing.TB, args ...string) []byte {
	t.Helper()
	return RunWith(t, Binary(t), args...)
}

// RunWith runs the Blender build binary with args as `blender -b --factory-startup ARGS` takes
// them, and fails the test on error. A Python with bpy has no such command line: it runs a
// script doing what those arguments do, in their order (Command).
func RunWith(t testing.TB, binary string, args ...string) []byte {
	t.Helper()
	cmd, err := Command(binary, t.TempDir(), args...)
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", filepath.Base(binary), args, err, out)
	}
	return out
}

// Command is `blender -b --factory-startup --python-exit-code 1 ARGS` on the build binary. For
// a Python with bpy (blender.IsPython) it writes, into dir, a script that does what Blender's
// command line does with these arguments, in their order as Blender takes them: a .blend path
// opens it (scripts off), -t N renders with N threads, --python and --python-expr run Python
// (seeing Blender's sys.argv, "--" and what follows included), -o sets the output path, -f N
// renders frame N and writes it where Blender would, -a renders the scene's frames; --disable-autoexec is the
// default there. Anything else is an error: the test would otherwise not run what it says.
func Command(binary, dir string, args ...string) (*exec.Cmd, error) {
	if !blender.IsPython(binary) {
		return exec.Command(binary, append([]string{"-b", "--factory-startup", "--python-exit-code", "1"}, args...)...), nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "import bpy, sys\nsys.argv = %s\n", pyList(append([]string{"blender"}, args...)))
	b.WriteString(`bpy.ops.wm.read_factory_settings(use_empty=False)
bpy.context.preferences.filepaths.use_scripts_auto_execute = False
threads = 0
def render(**kw):
    r = bpy.context.scene.render
    if threads:
        r.threads_mode, r.threads = "FIXED", threads
    bpy.ops.render.render(**kw)
def render_frame(n):  # -f N: Blender renders an animation of that one frame, the scene's end kept
    sc = bpy.context.scene
    first, last, step = sc.frame_start, sc.frame_end, sc.frame_step
    end = max(last, n)
    sc.frame_start, sc.frame_end = n, end
    sc.frame_step = end - n + 1
    render(animation=True)
    sc.frame_start, sc.frame_end, sc.frame_step = first, last, step
`)
	for i := 0; i < len(args); i++ {
		a := args[i]
		value := func() (string, error) {
			if i+1 >= len(args) {
				return "", fmt.Errorf("blender argument %s wants a value", a)
			}
			i++
			return args[i], nil
		}
		switch a {
		case "--":
			i = len(args)
			continue
		case "--disable-autoexec":
			continue
		case "-a":
			b.WriteString("render(animation=True)\n")
			continue
		}
		if !strings.HasPrefix(a, "-") {
			fmt.Fprintf(&b, "bpy.ops.wm.open_mainfile(filepath=%s, load_ui=False, use_scripts=False)\n", PyString(a))
			continue
		}
		v, err := value()
		if err != nil {
			return nil, err
		}
		switch a {
		case "-t":
			fmt.Fprintf(&b, "threads = int(%s)\n", PyString(v))
		case "--python":
			fmt.Fprintf(&b, "exec(compile(open(%s).read(), %s, 'exec'), {'__name__': '__main__'})\n", PyString(v), PyString(v))
		case "--python-expr":
			fmt.Fprintf(&b, "exec(%s, {'__name__': '__main__'})\n", PyString(v))
		case "-o":
			fmt.Fprintf(&b, "bpy.context.scene.render.filepath = %s\n", PyString(v))
		case "-f":
			fmt.Fprintf(&b, "render_frame(int(%s))\n", PyString(v))
		default:
			return nil, fmt.Errorf("blender argument %s: not known to blendertest.Command for a bpy build", a)
		}
	}
	script := filepath.Join(dir, "blender-args.py")
	if err := os.WriteFile(script, []byte(b.String()), 0o644); err != nil {
		return nil, err
	}
	return exec.Command(binary, script), nil
}

// PyString is s as a Python string literal (JSON's is one).
func PyString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func pyList(ss []string) string {
	b, _ := json.Marshal(ss)
	return string(b)
}

// OwnRenderSettings is a Python script that sets a scene up for Blender's own command-line
// render (-f N) with the settings a farm job renders with: the resolution, camera, samples
// and seed of st, nothing split, written as a 32-bit float EXR or (png) an 8-bit PNG. It is
// what an artist would set by hand to compare the farm's frame with Blender's.
func OwnRenderSettings(st render.Settings, png bool) string {
	format := "r.image_settings.file_format = 'OPEN_EXR'\nr.image_settings.color_depth = '32'\nr.image_settings.exr_codec = 'NONE'\n"
	if png {
		format = "r.image_settings.file_format = 'PNG'\nr.image_settings.color_mode = 'RGB'\nr.image_settings.color_depth = '8'\n"
	}
	return fmt.Sprintf(`import bpy
sc = bpy.context.scene
sc.camera = sc.objects[%q]
r, c = sc.render, sc.cycles
r.resolution_x, r.resolution_y, r.resolution_percentage = %d, %d, 100
c.samples, c.seed, c.sample_offset = %d, %d, 0
c.use_adaptive_sampling = False
c.use_denoising = False
c.use_animated_seed = False
r.use_compositing = False
r.use_sequencer = False
`, st.Camera, st.Width, st.Height, st.SPP, st.Seed) + format
}

// OwnRender renders frame of the .blend with Blender's own command line (-f N, one thread),
// with the settings of a farm job (OwnRenderSettings), as a float EXR or (png) an 8-bit PNG,
// and returns the file.
func OwnRender(t testing.TB, blend string, st render.Settings, frame int, png bool) string {
	t.Helper()
	return ownRender(t, Binary(t), blend, st, frame, png)
}

// OwnRender is OwnRender on the line's build.
func (l Line) OwnRender(t testing.TB, blend string, st render.Settings, frame int, png bool) string {
	t.Helper()
	return ownRender(t, l.Binary, blend, st, frame, png)
}

func ownRender(t testing.TB, binary, blend string, st render.Settings, frame int, png bool) string {
	t.Helper()
	dir := t.TempDir()
	script := filepath.Join(dir, "settings.py")
	if err := os.WriteFile(script, []byte(OwnRenderSettings(st, png)), 0o644); err != nil {
		t.Fatal(err)
	}
	RunWith(t, binary, blend, "--disable-autoexec", "-t", "1", "--python", script, "-o", filepath.Join(dir, "own_####"), "-f", strconv.Itoa(frame))
	ext := ".exr"
	if png {
		ext = ".png"
	}
	return filepath.Join(dir, fmt.Sprintf("own_%04d%s", frame, ext))
}

// Combined returns the RGB of the first view layer's Combined pass of a frame of a Blender
// scene's channels ("<layer>.Combined.R"...), interleaved as an RGB frame holds it: what
// Blender's own single-layer EXR of the frame holds.
func Combined(t testing.TB, f *raster.Frame) []float32 {
	t.Helper()
	return PassRGB(t, f, "Combined")
}

// PassRGB is Combined of another pass ("Noisy Image").
func PassRGB(t testing.TB, f *raster.Frame, pass string) []float32 {
	t.Helper()
	at := [3]int{-1, -1, -1}
	for i, n := range f.Names {
		for c, suffix := range []string{"." + pass + ".R", "." + pass + ".G", "." + pass + ".B"} {
			if strings.HasSuffix(n, suffix) && at[c] < 0 {
				at[c] = i
			}
		}
	}
	if at[0] < 0 || at[1] < 0 || at[2] < 0 {
		t.Fatalf("the frame's channels %q have no %s pass", f.Names, pass)
	}
	k := len(f.Names)
	out := make([]float32, 0, f.Width*f.Height*3)
	for px := 0; px+k <= len(f.Pix); px += k {
		out = append(out, f.Pix[px+at[0]], f.Pix[px+at[1]], f.Pix[px+at[2]])
	}
	return out
}

// ReadEXR decodes an EXR file.
func ReadEXR(t testing.TB, path string) *raster.Frame {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := raster.DecodeEXR(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return f
}

// ReadPNG decodes a PNG file.
func ReadPNG(t testing.TB, path string) image.Image {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return img
}

// MaxRelDiff is the largest |a-b| / max(|b|, 1e-3) over two float buffers of one size (the
// floor keeps near-black pixels from turning rounding into huge ratios).
func MaxRelDiff(a, b []float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	worst := 0.0
	for i := range a {
		d := math.Abs(float64(a[i])-float64(b[i])) / math.Max(math.Abs(float64(b[i])), 1e-3)
		worst = math.Max(worst, d)
	}
	return worst
}

// MaxLevelDiff is the largest difference of one 8-bit channel value between two images of one
// size (alpha ignored); a size mismatch is 256.
func MaxLevelDiff(a, b image.Image) int {
	if a.Bounds() != b.Bounds() {
		return 256
	}
	worst := 0
	r := a.Bounds()
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			ar, ag, ab, _ := a.At(x, y).RGBA()
			br, bg, bb, _ := b.At(x, y).RGBA()
			for _, d := range []int{int(ar>>8) - int(br>>8), int(ag>>8) - int(bg>>8), int(ab>>8) - int(bb>>8)} {
				worst = max(worst, abs(d))
			}
		}
	}
	return worst
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}
