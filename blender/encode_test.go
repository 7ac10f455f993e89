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
	a, err := blender.Assemble(context.Background(), pool, sc, frame, 3, st, "png")
	if err != nil {
		t.Fatal(err)
	}
	ours, err := png.Decode(bytes.NewReader(a.Main))
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

// Property: the formats of a frame with Cryptomatte are assembled with one probe render: the
// next format gets the manifests the first found, and writes byte for byte the file an assembly
// that probes for itself writes (a scene loaded afresh, which knows no manifests).
func TestAssemblyProbesCryptomatteOncePerFrame(t *testing.T) {
	ctx := context.Background()
	pool := blendertest.Pool(t, 1)
	sc := load(t, pool, blendertest.Plate(t))
	st := settings(t, sc, 48, 27, 2, 1)
	frame := raster.NewFrameOf(st.Width, st.Height, sc.Desc.TileChannels(st.Whole))
	if err := frame.Place(0, 0, st.Width, st.Height, renderTile(t, pool, sc, st, 1, render.Rect{X1: st.Width, Y1: st.Height})); err != nil {
		t.Fatal(err)
	}
	if blender.CryptomatteKnown(sc, 1, st) {
		t.Fatal("the scene knows the frame's manifests before any assembly")
	}
	if _, err := blender.Assemble(ctx, pool, sc, frame, 1, st, "png"); err != nil {
		t.Fatal(err)
	}
	if !blender.CryptomatteKnown(sc, 1, st) {
		t.Fatal("the first assembly of a frame with Cryptomatte kept no manifests for its next format")
	}
	// The plate's own output, a multilayer EXR, carries the manifests in its header.
	reused, err := blender.Assemble(ctx, pool, sc, frame, 1, st, blender.FormatBlend)
	if err != nil {
		t.Fatal(err)
	}
	afresh := load(t, pool, blendertest.Plate(t))
	probed, err := blender.Assemble(ctx, pool, afresh, frame, 1, st, blender.FormatBlend)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(probed.Main, []byte("cryptomatte/")) {
		t.Fatal("the plate's EXR names no Cryptomatte manifest: the test shows nothing")
	}
	if !bytes.Equal(reused.Main, probed.Main) {
		t.Fatal("the EXR assembled with the first format's manifests differs from one assembled with its own probe")
	}
}
