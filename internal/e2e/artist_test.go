//go:build linux

package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tilefarm/tilefarm/blender/blendertest"
)

// The rest of the artist's file (docs/design.md, "Output settings checked"): settings of a
// .blend's output beyond its passes, each written as Blender writes it or refused at submit
// naming the setting, never a different file with exit 0.

// quickStill is a Python line making the example a quick still: 240x136 at 8 samples, PNG into
// //render/, one frame, adaptive sampling and denoising off so it splits into tiles.
const quickStill = "sc = bpy.context.scene; r = sc.render; cy = sc.cycles; r.resolution_x, r.resolution_y, r.resolution_percentage = 240, 136, 100; " +
	"cy.samples = 8; cy.use_adaptive_sampling = False; cy.use_denoising = False; r.image_settings.file_format = 'PNG'; r.filepath = '//render/still_'; sc.frame_end = 1"

// Property: the metadata stamp burnt into the image (Output Properties > Metadata > Burn Into
// Image) is burnt once, into the assembled frame, as Blender burns it into its own render (the
// frame number padded as Blender pads it): never into every tile. The fields that name the
// moment or the machine (date, render time, memory, host, file) stay off, as in the file's
// metadata; the rest equal Blender's own PNG within one level, on every line, in 4 tiles.
func TestBlenderStampIsBurntOnceIntoTheFrame(t *testing.T) {
	t.Parallel()
	stamp := quickStill + "; r.use_stamp = True; r.use_stamp_frame = r.use_stamp_camera = r.use_stamp_scene = r.use_stamp_time = r.use_stamp_lens = True; " +
		"r.use_stamp_date = r.use_stamp_render_time = r.use_stamp_filename = r.use_stamp_memory = r.use_stamp_hostname = False; sc.frame_end = 120"
	eachLine(t, blenderExample(t), func(blendertest.Line) string { return stamp }, func(t *testing.T, line blendertest.Line, blend string) {
		// Frame 1 of 120, as `blender -b FILE -f 1`: the stamp pads the frame to the end's digits.
		own := copyBlend(t, blend)
		blendertest.RunWith(t, line.Binary, filepath.Join(own, filepath.Base(blend)), "--disable-autoexec", "-t", "1", "-f", "1")
		farm := copyBlend(t, blend)
		r := run(t, "coordinator", "render", filepath.Join(farm, filepath.Base(blend)), "--frames", "1", "--tile", "120", "--data", filepath.Join(farm, "data"),
			"--workers", "2", "--threads", "1", "--json", "--blender", line.Binary)
		if r.code != 0 {
			t.Fatalf("render: %s", r)
		}
		name := filepath.Join("render", "still_0001.png")
		want := decodePNG(t, filepath.Join(own, name))
		got := decodePNG(t, filepath.Join(farm, name))
		if d := levelDiff(t, want, got); d > 1 {
			t.Fatalf("the farm's stamped frame differs from Blender's by %d levels", d)
		}
		// The stamp is there: without it the frame is another picture.
		plain := copyBlend(t, line.SavedWith(t, blenderExample(t), quickStill))
		if r := run(t, "coordinator", "render", filepath.Join(plain, "scene.blend"), "--frames", "1", "--data", filepath.Join(plain, "data"),
			"--workers", "2", "--json", "--blender", line.Binary); r.code != 0 {
			t.Fatalf("render without a stamp: %s", r)
		}
		if d := levelDiff(t, want, decodePNG(t, filepath.Join(plain, name))); d <= 1 {
			t.Fatalf("the frame without a stamp is within %d level of the stamped one: the test cannot see a stamp", d)
		}
		t.Logf("Blender %s: the stamp burnt once, within one level of Blender's own", line.Name)
	})
}

// Property: the output settings the farm does not render as Blender does are refused at submit
// (exit 1) naming the setting, and nothing is written: a render region (cropped or not),
// stereoscopy (views as individual files, stereo 3D, multiview EXR) and an EXR's JPEG preview.
// Blender's own render of each is checked to be what the farm would not write.
func TestBlenderOutputSettingsTheFarmCannotWriteAreRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, expr, says string
		blender          []string // what Blender itself writes under render/
	}{
		{"render region cropped", "r.use_border = True; r.use_crop_to_border = True; r.border_min_x, r.border_max_x = 0.25, 0.75", "render region (Output Properties > Format > Render Region, cropped)", []string{"still_0001.png"}},
		{"render region", "r.use_border = True; r.use_crop_to_border = False; r.border_min_y, r.border_max_y = 0.25, 0.75", "render region (Output Properties > Format > Render Region)", []string{"still_0001.png"}},
		{"stereo views", "r.use_multiview = True; r.views_format = 'STEREO_3D'; r.image_settings.views_format = 'INDIVIDUAL'", "stereoscopy", []string{"still_0001_L.png", "still_0001_R.png"}},
		{"stereo 3D", "r.use_multiview = True; r.views_format = 'STEREO_3D'; r.image_settings.views_format = 'STEREO_3D'", "stereoscopy", []string{"still_0001.png"}},
		{"multiview EXR", "r.use_multiview = True; r.views_format = 'STEREO_3D'; r.image_settings.file_format = 'OPEN_EXR_MULTILAYER'; r.image_settings.views_format = 'MULTIVIEW'", "stereoscopy", []string{"still_0001.exr"}},
		{"EXR preview", "r.image_settings.file_format = 'OPEN_EXR'; r.image_settings.use_preview = True", "JPEG preview of the EXR (Output Properties > Output > Preview)", []string{"still_0001.exr", "still_0001.jpg"}},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			t.Parallel()
			line := blendertest.LineOf(t, "3.4")
			blend := line.SavedWith(t, blenderExample(t), quickStill+"; "+tc.expr)
			own := ownRender(t, line, blend, "")
			var wrote []string
			for _, f := range outputsUnder(t, own) {
				wrote = append(wrote, strings.TrimPrefix(f, "render/"))
			}
			if strings.Join(wrote, " ") != strings.Join(tc.blender, " ") {
				t.Fatalf("Blender wrote %q, the test expects %q", wrote, tc.blender)
			}
			farm := copyBlend(t, blend)
			r := run(t, "coordinator", "render", filepath.Join(farm, "scene.blend"), "--frames", "1", "--data", filepath.Join(farm, "data"), "--workers", "1")
			if r.code != 1 || !strings.Contains(r.stderr, "the scene asks for") || !strings.Contains(r.stderr, tc.says) {
				t.Fatalf("render: want exit 1 naming %q, got %s", tc.says, r)
			}
			if got := outputsUnder(t, farm); len(got) != 0 {
				t.Fatalf("a refused render wrote %q", got)
			}
			if _, err := os.Stat(filepath.Join(farm, "render")); !os.IsNotExist(err) {
				t.Fatalf("a refused render made its output directory: %v", err)
			}
		})
	}
}

// Property: a half-float multilayer EXR holds what Blender's own holds. Rendered in one pass a
// tile, its every channel equals Blender's bit for bit (Blender rounds the farm's floats to half
// as it rounds its own render). In 4 passes a tile the farm's floats are within a few float
// ULP of Blender's (combining passes rounds), which crosses a half's rounding edge for a few
// values in ten thousand: those differ by one half step (2^-11 relative), the rest are
// equal. On every line.
func TestBlenderHalfFloatEXRIsBlendersOwn(t *testing.T) {
	t.Parallel()
	half := quickStill + "; s = r.image_settings; hasattr(s, 'media_type') and setattr(s, 'media_type', 'MULTI_LAYER_IMAGE'); " +
		"s.file_format = 'OPEN_EXR_MULTILAYER'; s.color_depth = '16'; s.exr_codec = 'ZIP'; " +
		"vl = sc.view_layers[0]; vl.use_pass_normal = vl.use_pass_diffuse_color = True"
	eachLine(t, blenderExample(t), func(blendertest.Line) string { return half }, func(t *testing.T, line blendertest.Line, blend string) {
		own := ownRender(t, line, blend, "")
		name := filepath.Join("render", "still_0001.exr")
		for _, tc := range []struct {
			passes string
			rel    float64
		}{{"1", 0}, {"4", 1.0 / 2048}} {
			farm := copyBlend(t, blend)
			r := run(t, "coordinator", "render", filepath.Join(farm, filepath.Base(blend)), "--tile", "120", "--passes", tc.passes, "--data", filepath.Join(farm, "data"),
				"--workers", "2", "--threads", "1", "--json", "--blender", line.Binary)
			if r.code != 0 {
				t.Fatalf("render in %s passes: %s", tc.passes, r)
			}
			c := blendertest.CompareImages(t, filepath.Join(own, name), filepath.Join(farm, name))
			c.Within(t, tc.rel)
			t.Logf("Blender %s, %s passes a tile: %d channels (%s) within %g of Blender's own", line.Name, tc.passes, c.Channels, c.Format[1], tc.rel)
		}
	})
}
