package blender_test

import (
	"bytes"
	"context"
	"image"
	"image/png"
	"testing"

	"github.com/tilefarm/tilefarm/blender"
	"github.com/tilefarm/tilefarm/blender/blendertest"
	"github.com/tilefarm/tilefarm/raster"
	"github.com/tilefarm/tilefarm/render"
)

// Property: a frame assembled from tiles and passes equals Blender's own full-frame render to
// within float rounding, and its PNG, written by Blender's own pipeline from the assembled
// frame (Assemble), is Blender's own PNG of the frame to within one 8-bit level.
func TestFrameAndPNGMatchBlendersOwn(t *testing.T) {
	pool := blendertest.Pool(t, 1)
	sc := loadExample(t, pool)
	st := settings(t, sc, 96, 72, 8, 4)
	frame := raster.NewFrameOf(st.Width, st.Height, sc.Desc.Channels)
	for _, r := range []render.Rect{{X1: 50, Y1: 40}, {X0: 50, X1: 96, Y1: 40}, {Y0: 40, X1: 96, Y1: 72}} {
		if err := frame.Place(r.X0, r.Y0, r.X1, r.Y1, renderTile(t, pool, sc, st, 3, r)); err != nil {
			t.Fatal(err)
		}
	}
	own := blendertest.ReadEXR(t, blendertest.OwnRender(t, sc.Blend(), st, 3, false))
	rgb := blendertest.Combined(t, frame)
	if worst := blendertest.MaxRelDiff(rgb, own.Pix); worst > 1e-5 {
		t.Fatalf("tiled frame differs from Blender's own render by %g relative, want rounding only (< 1e-5)", worst)
	}
	as, err := blender.Assemble(context.Background(), pool, sc, frame, 3, st, []string{"png"})
	if err != nil {
		t.Fatal(err)
	}
	ours, err := png.Decode(bytes.NewReader(as[0].Main))
	if err != nil {
		t.Fatal(err)
	}
	theirs := blendertest.ReadPNG(t, blendertest.OwnRender(t, sc.Blend(), st, 3, true))
	d := blendertest.MaxLevelDiff(ours, theirs)
	if d > 1 {
		t.Fatalf("our PNG differs from Blender's by %d levels, want at most 1", d)
	}
	t.Logf("PNG within %d level of Blender's own", d)
	if d := blendertest.MaxLevelDiff(ours, toneMapped(t, &raster.Frame{Width: frame.Width, Height: frame.Height, Pix: rgb})); d <= 1 {
		t.Fatalf("our PNG is within %d level of tilefarm's own tone mapper: the scene's Filmic view was not applied", d)
	}
}

func toneMapped(t *testing.T, f *raster.Frame) image.Image {
	data, err := raster.EncodePNG8(f, 0)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// Property: one assembly writes every format of a frame, the compositor run once, and each
// format's files are byte for byte the files an assembly of that format alone writes: the
// Render Result saved again is what Blender's pipeline writes for the format, on every line.
// Scenes: the plate (two view layers, Cryptomatte, a File Output node, a multilayer EXR of its
// own) and the example with its metadata stamp burnt into the image (the pipeline burns it into
// what it writes; the formats saved again must carry it too).
func TestAssemblyWritesEveryFormatInOneCall(t *testing.T) {
	ctx := context.Background()
	formats := []string{"png", blender.FormatBlend, "exr", "png16"} // the scene's own not first
	for _, line := range blendertest.Lines(t) {
		for _, tc := range []struct{ name, blend, expr string }{
			{"plate", blendertest.Plate(t), ""},
			{"stamped", blendertest.Example(t), "bpy.ops.file.pack_all(); r = bpy.context.scene.render; r.use_stamp = True; r.use_stamp_note = True; r.stamp_note_text = 'tilefarm'"},
		} {
			t.Run(line.Name+"/"+tc.name, func(t *testing.T) {
				pool := blender.NewPool(blender.Options{Binary: line.Binary, Dir: t.TempDir()})
				defer pool.Close()
				blend := line.Saved(t, tc.blend)
				if tc.expr != "" {
					blend = line.SavedWith(t, tc.blend, tc.expr)
				}
				sc := load(t, pool, blend)
				st := settings(t, sc, 96, 54, 2, 1)
				frame := raster.NewFrameOf(st.Width, st.Height, sc.Desc.TileChannels(st.Whole))
				if err := frame.Place(0, 0, st.Width, st.Height, renderTile(t, pool, sc, st, 1, render.Rect{X1: st.Width, Y1: st.Height})); err != nil {
					t.Fatal(err)
				}
				all, err := blender.Assemble(ctx, pool, sc, frame, 1, st, formats)
				if err != nil {
					t.Fatal(err)
				}
				if len(all) != len(formats) {
					t.Fatalf("%d outputs for %d formats", len(all), len(formats))
				}
				for i, format := range formats {
					alone, err := blender.Assemble(ctx, pool, sc, frame, 1, st, []string{format})
					if err != nil {
						t.Fatal(err)
					}
					a, b := all[i], alone[0]
					if !bytes.Equal(a.Main, b.Main) || a.Name != b.Name || len(a.Files) != len(b.Files) {
						t.Fatalf("%s: the file of one call for every format (%d bytes, %q, %d more files) is not the one of its own call (%d bytes, %q, %d)",
							format, len(a.Main), a.Name, len(a.Files), len(b.Main), b.Name, len(b.Files))
					}
					for name, data := range b.Files {
						if !bytes.Equal(a.Files[name], data) {
							t.Fatalf("%s: File Output %s differs between one call for every format and its own", format, name)
						}
					}
				}
				if bytes.Equal(all[0].Main, all[3].Main) {
					t.Fatal("the 8- and 16-bit PNGs are the same file: the second format was not written as itself")
				}
				switch tc.name {
				case "plate":
					if own := all[1]; !bytes.Contains(own.Main, []byte("cryptomatte/")) || len(own.Files) == 0 {
						t.Fatalf("the plate's own EXR names no Cryptomatte manifest or has no File Output files (%d): the test shows nothing", len(own.Files))
					}
				case "stamped":
					plain, err := blender.Assemble(ctx, pool, load(t, pool, line.SavedWith(t, tc.blend, "bpy.ops.file.pack_all()")), frame, 1, st, []string{"png"})
					if err != nil {
						t.Fatal(err)
					}
					if bytes.Equal(plain[0].Main, all[0].Main) {
						t.Fatal("the stamped scene's PNG is the unstamped one's: the test shows nothing")
					}
				}
			})
		}
	}
}
