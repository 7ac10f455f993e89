package blender_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tilefarm/tilefarm/blender"
	"github.com/tilefarm/tilefarm/blender/blendertest"
	"github.com/tilefarm/tilefarm/blender/blendscene"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/render"
)

func TestInspectExample(t *testing.T) {
	pool := blendertest.Pool(t, 1)
	in, err := blender.Inspect(context.Background(), pool, blendertest.Example(t))
	if err != nil {
		t.Fatal(err)
	}
	d := in.Desc
	if d.Blend != "scene.blend" || !slices.Equal(d.Files, []string{"scene.blend", "textures/checker.png"}) {
		t.Fatalf("blend %q files %q: want the .blend and its texture by their relative names", d.Blend, d.Files)
	}
	if !slices.Equal(d.Cameras, []string{"Camera"}) || d.Camera != "Camera" || d.Width != 160 || d.Height != 120 ||
		d.SPP != 32 || d.Seed != 7 || d.FrameStart != 1 || d.FrameEnd != 24 || d.ViewTransform != "Filmic" {
		t.Fatalf("description %+v does not say what the example scene has", d)
	}
	if len(d.Whole) != 0 || len(d.SplitOff) != 0 || len(d.Caveats) != 0 {
		t.Fatalf("the example splits with nothing switched off, got whole %q, split off %q, caveats %q", d.Whole, d.SplitOff, d.Caveats)
	}
	if !slices.Equal(d.Channels, []string{"ViewLayer.Combined.A", "ViewLayer.Combined.B", "ViewLayer.Combined.G", "ViewLayer.Combined.R"}) {
		t.Fatalf("channels %q: want the one view layer's Combined RGBA, as the tiles render it", d.Channels)
	}
	if o := d.Output; o.FileFormat != "PNG" || o.Extension != ".png" || !o.UseExtension {
		t.Fatalf("output %+v: want the example's PNG", o)
	}
	if !regexp.MustCompile(`^blender/\d+\.\d+\.\d+ \(`).MatchString(d.Build) || !strings.Contains(d.Build, "cycles-cpu/") ||
		!strings.Contains(d.Build, "denoise/") || !strings.Contains(d.Build, "driver/"+blender.DriverVersion) {
		t.Fatalf("build %q lacks the Blender version, kernel or driver", d.Build)
	}
	for name, p := range in.Paths {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("file %s at %s: %v", name, p, err)
		}
	}
	back, err := blender.ParseDescription(d.Encode())
	if err != nil || !slices.Equal(back.Files, d.Files) || back.Build != d.Build {
		t.Fatalf("description does not round-trip: %v", err)
	}
}

// Property: a scene that would render wrong on the farm (magenta textures, dropped objects,
// scripts not run) or not at all is rejected at inspection with a message naming the problem.
func TestInspectRejectsBadScenes(t *testing.T) {
	dir := t.TempDir()
	blendertest.Run(t, "--python", filepath.Join("testdata", "make_bad.py"), "--", blendertest.Example(t), dir)
	// A missing texture: the example's .blend without its textures directory.
	data, err := os.ReadFile(blendertest.Example(t))
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if err := os.MkdirAll(filepath.Join(dir, "bare"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "lib", "props.blend")); err != nil {
		t.Fatal(err)
	}
	pool := blendertest.Pool(t, 1)
	for _, c := range []struct {
		name, path string
		want       []string
	}{
		{"missing texture", write("bare/scene.blend", data), []string{"image 'checker.png' needs //textures/checker.png, which is missing"}},
		{"missing linked library", filepath.Join(dir, "linked.blend"), []string{"linked library 'props.blend' needs //lib/props.blend, which is missing"}},
		{"not a blend", write("notes.blend", []byte("just some text\n")), []string{"notes.blend is not a .blend file"}},
		{"no camera", filepath.Join(dir, "nocamera.blend"), []string{"has no camera"}},
		{"needs autoexec", filepath.Join(dir, "autoexec.blend"), []string{"needs Python scripts to run", "rig.py"}},
		{"absolute path", filepath.Join(dir, "absolute.blend"), []string{"uses the absolute path", "Make Paths Relative"}},
		{"missing file", filepath.Join(dir, "nothing-here.blend"), []string{"nothing-here.blend"}},
	} {
		_, err := blender.Inspect(context.Background(), pool, c.path)
		if !errors.Is(err, blender.ErrScene) {
			t.Errorf("%s: got %v, want an ErrScene", c.name, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not say %q", c.name, err, w)
			}
		}
	}

	in, err := blender.Inspect(context.Background(), pool, filepath.Join(dir, "unsplittable.blend"))
	if err != nil {
		t.Fatal(err)
	}
	// Adaptive sampling makes the frame render whole, and --split switches it off; denoising
	// does too on a build with a denoiser, and on one without it is a caveat in every mode; the
	// compositor runs at assembly.
	d := in.Desc
	whole := []string{"adaptive sampling"}
	if strings.Contains(d.Build, "denoise/oidn") {
		whole = append(whole, "denoising (OPENIMAGEDENOISE)")
		if len(d.Caveats) != 0 {
			t.Errorf("caveats %q: want none on a build with a denoiser", d.Caveats)
		}
	} else if len(d.Caveats) != 1 || !strings.Contains(d.Caveats[0], "no denoiser") {
		t.Errorf("caveats %q: want the missing denoiser", d.Caveats)
	}
	for _, l := range []struct {
		name string
		got  []string
	}{{"whole", d.Whole}, {"split off", d.SplitOff}} {
		if len(l.got) != len(whole) {
			t.Errorf("%s %q: want %q", l.name, l.got, whole)
			continue
		}
		for i, w := range whole {
			if !strings.Contains(l.got[i], w) {
				t.Errorf("%s %q: want %q", l.name, l.got, whole)
			}
		}
	}
	if !d.Output.Compositing {
		t.Errorf("output %+v: the scene's compositor is on", d.Output)
	}
	st, err := d.Resolve(render.Overrides{})
	if err != nil || !st.Whole || st.Passes != 1 {
		t.Errorf("default settings %+v, %v: want whole, one pass", st, err)
	}
	if notes := strings.Join(d.Notes(render.Overrides{}), "\n"); !strings.Contains(notes, "renders whole") || !strings.Contains(notes, "--split") {
		t.Errorf("notes %q do not say the frame renders whole and how to split it", notes)
	}
	st, err = d.Resolve(render.Overrides{Split: true})
	if err != nil || st.Whole || st.Passes != blender.DefaultPasses {
		t.Errorf("split settings %+v, %v: want split in %d passes", st, err, blender.DefaultPasses)
	}
	if notes := strings.Join(d.Notes(render.Overrides{Split: true}), "\n"); !strings.Contains(notes, "adaptive sampling (noise threshold") {
		t.Errorf("split notes %q do not say adaptive sampling is off", notes)
	}
}

// Property: which layers and passes a .blend renders is part of its frames' identity: the same
// plate with one pass switched off is another scene version with other channels, so no frame or
// tile of the first is reused for it.
func TestPassesAreInTheIdentity(t *testing.T) {
	dir := t.TempDir()
	variant := filepath.Join(dir, "plate.blend")
	blendertest.Run(t, blendertest.Plate(t), "--python-expr",
		"import bpy; bpy.context.scene.view_layers['Beauty'].use_pass_mist = False; bpy.ops.wm.save_as_mainfile(filepath="+strconv.Quote(variant)+")")
	k := blendscene.New(blendscene.Options{Binaries: []string{blendertest.Binary(t)}}, scene.Env{Dir: t.TempDir()})
	defer k.Close()
	var versions []string
	var channels [][]string
	for _, p := range []string{blendertest.Plate(t), variant} {
		b, err := k.Read(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		d, err := blender.ParseDescription(b.Scene)
		if err != nil {
			t.Fatal(err)
		}
		versions, channels = append(versions, b.Version()), append(channels, d.Channels)
	}
	if versions[0] == versions[1] {
		t.Fatal("switching a pass off left the scene version as it was")
	}
	if len(channels[1]) != len(channels[0])-1 || slices.Contains(channels[1], "Beauty.Mist.Z") || !slices.Contains(channels[0], "Beauty.Mist.Z") {
		t.Fatalf("channels %d then %d: want Beauty.Mist.Z alone gone", len(channels[0]), len(channels[1]))
	}
}

// Property: a pass of a tile is part of the whole render's samples on every line, or the tile
// renders in one pass, said at submit: 4.2's Automatic sampling pattern depends on the sample
// count and 4.2 has no sample subsets, so its tiles render in one pass; 4.5 renders passes as
// subsets of the render's samples, whatever its pattern (docs/design.md, "Blender scenes").
func TestCountDependentPatternRendersOnePassOn42(t *testing.T) {
	for _, tc := range []struct {
		line    string
		onePass bool
	}{{"4.2", true}, {"4.5", false}} {
		line := blendertest.LineOf(t, tc.line)
		blend := line.SavedWith(t, blendertest.Example(t), "bpy.ops.file.pack_all(); bpy.context.scene.cycles.sampling_pattern = 'AUTOMATIC'")
		pool := blender.NewPool(blender.Options{Binary: line.Binary, Dir: t.TempDir()})
		in, err := blender.Inspect(t.Context(), pool, blend)
		pool.Close()
		if err != nil {
			t.Fatal(err)
		}
		d := in.Desc
		if got := len(d.OnePass) > 0; got != tc.onePass {
			t.Fatalf("%s: one pass %q, want one pass: %v", tc.line, d.OnePass, tc.onePass)
		}
		st, err := d.Resolve(render.Overrides{})
		if err != nil {
			t.Fatal(err)
		}
		notes := strings.Join(d.Notes(render.Overrides{}), "\n")
		if tc.onePass {
			if st.Passes != 1 || !strings.Contains(notes, "each tile renders in one pass") || !strings.Contains(notes, "Automatic sampling pattern depends on the sample count") {
				t.Fatalf("%s: %d passes, notes %q: want one pass, said", tc.line, st.Passes, notes)
			}
			if _, err := d.Resolve(render.Overrides{Passes: 4}); !errors.Is(err, blender.ErrScene) {
				t.Fatalf("%s: --passes 4 on a one-pass scene: %v, want refused", tc.line, err)
			}
		} else if st.Passes != blender.DefaultPasses {
			t.Fatalf("%s: %d passes, want %d", tc.line, st.Passes, blender.DefaultPasses)
		}
	}
}
