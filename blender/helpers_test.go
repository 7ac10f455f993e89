package blender_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/tilefarm/tilefarm/blender"
	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/blendertest"
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
	sc, err := blender.Unpack(t.TempDir(), "v", in.Desc, func(name string) ([]byte, error) { return os.ReadFile(in.Paths[name]) })
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

// blenderFrame renders a frame with Blender's own command line (-f N), as an artist would,
// with the settings the farm renders with, and returns its float pixels.
func blenderFrame(t *testing.T, sc *blender.Scene, st render.Settings, frame int) *finalize.Frame {
	t.Helper()
	dir := t.TempDir()
	script := filepath.Join(dir, "settings.py")
	if err := os.WriteFile(script, []byte(blendertest.OwnRenderSettings(st, false)), 0o644); err != nil {
		t.Fatal(err)
	}
	blendertest.Run(t, sc.Blend(), "--disable-autoexec", "-t", "1", "--python", script,
		"-o", filepath.Join(dir, "frame_####"), "-f", strconv.Itoa(frame))
	data, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("frame_%04d.exr", frame)))
	if err != nil {
		t.Fatal(err)
	}
	f, err := finalize.DecodeEXR(data)
	if err != nil {
		t.Fatal(err)
	}
	return f
}
