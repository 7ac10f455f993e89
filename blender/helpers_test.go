package blender_test

import (
	"context"
	"testing"

	"github.com/tilefarm/tilefarm/blender"
	"github.com/tilefarm/tilefarm/blender/blendertest"
	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/render"
)

// loadExample inspects the example scene and unpacks its files as a worker would.
func loadExample(t *testing.T, pool *blender.Pool) *blender.Scene {
	t.Helper()
	return load(t, pool, blendertest.Example(t))
}

func load(t *testing.T, pool *blender.Pool, path string) *blender.Scene {
	t.Helper()
	in, err := blender.Inspect(context.Background(), pool, path)
	if err != nil {
		t.Fatal(err)
	}
	b, err := bundle.FromFiles(t.Context(), "scene.blend", in.Desc.Encode(), in.Desc.Files, func(name string) string { return in.Paths[name] })
	if err != nil {
		t.Fatal(err)
	}
	sc, err := blender.Unpack(t.Context(), t.TempDir(), "v", in.Desc, b)
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// settings resolves the example's settings at a small size, for speed.
func settings(t *testing.T, sc *blender.Scene, w, h, spp, passes int) render.Settings {
	t.Helper()
	st, err := sc.Desc.Resolve(render.Overrides{Width: w, Height: h, SPP: spp, Passes: passes})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// renderTile renders a whole tile pass by pass and returns its pixels.
func renderTile(t *testing.T, pool *blender.Pool, sc *blender.Scene, st render.Settings, frame int, r render.Rect) []float32 {
	t.Helper()
	tile, err := blender.NewTile(context.Background(), pool, sc, st, frame, r)
	if err != nil {
		t.Fatal(err)
	}
	for _, end := range st.PassEnds(0) {
		if err := tile.Render(context.Background(), tile.Next(), end); err != nil {
			t.Fatal(err)
		}
	}
	return tile.Pixels()
}
