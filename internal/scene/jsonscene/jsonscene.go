// Package jsonscene is the tilefarm JSON scene as a kind of scene of the farm (scene.Kind): a
// scene file with the OBJ meshes it names, rendered by the built-in path tracer (package
// render) and tone-mapped with tilefarm's own curve (docs/design.md, "Renderers").
package jsonscene

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/failure"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/raster"
	"github.com/tilefarm/tilefarm/render"
)

// TileSize is the default tile edge of a JSON scene: a tile costs the path tracer little
// beyond its samples, so small tiles spread a frame over many slots.
const TileSize = 64

// Kind is the tilefarm JSON scene. It claims every file and document: registered last, it is
// what a file no other kind claims is read as, so a file that is no scene at all is refused in
// the JSON parser's words.
type Kind struct {
	// Threads is how many goroutines render each tile (scene.Env.Threads; 0: one). The bits
	// do not depend on it (render.Tile.SetThreads).
	Threads int
}

var _ scene.Kind = Kind{}

// Name names the kind.
func (Kind) Name() string { return "tilefarm JSON scene" }

// ClaimsFile claims any file.
func (Kind) ClaimsFile(string) bool { return true }

// ClaimsDocument claims any document.
func (Kind) ClaimsDocument([]byte) bool { return true }

// Read reads the scene file and the meshes it names from the file's directory (ReadFile).
func (Kind) Read(ctx context.Context, path string) (*bundle.Bundle, error) {
	return ReadFile(ctx, path)
}

// maxAsset bounds a mesh or texture of a JSON scene: the path tracer holds them in memory.
const maxAsset = 1 << 30

// ReadFile reads a JSON scene file and the meshes it names, from the file's directory, into a
// bundle. Its errors are the scene's: terminal.
func ReadFile(ctx context.Context, path string) (*bundle.Bundle, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, failure.Terminalf("reading scene %q: %w", path, err)
	}
	paths, err := render.AssetPaths(data)
	if err != nil {
		return nil, failure.Terminalf("scene %q: %w", path, err)
	}
	dir := filepath.Dir(path)
	b, err := bundle.FromFiles(ctx, filepath.Base(path), data, paths, func(rel string) string {
		return filepath.Join(dir, filepath.FromSlash(rel))
	})
	if err != nil {
		return nil, failure.Terminalf("scene %q: %w", path, err)
	}
	return b, nil
}

// Describe parses the scene file's settings, cameras and frames, meshes unread.
func (Kind) Describe(doc []byte) (scene.Description, error) {
	info, err := render.ParseSceneInfo(doc)
	if err != nil {
		return nil, err
	}
	return description{info}, nil
}

// description is a JSON scene's: the path tracer renders any split of it exactly, so it has
// nothing to note.
type description struct{ *render.SceneInfo }

func (description) Notes(render.Overrides) []string { return nil }

// FrameStep is 1: a JSON scene renders every frame of its range.
func (description) FrameStep() int { return 1 }

// Validate checks the scene and every mesh with the errors parsing gives, building nothing.
func (Kind) Validate(ctx context.Context, b *bundle.Bundle) error {
	return render.ValidateScene(b.Scene, b.Assets(ctx, maxAsset))
}

// Load parses the scene and its meshes; the BVH is built on the first tile.
func (k Kind) Load(ctx context.Context, b *bundle.Bundle, version, _ string) (scene.Renderer, error) {
	read := b.Assets(ctx, maxAsset)
	var fetchErr error // a file that could not be read here: retried unless the source says not
	s, err := render.ParseScene(b.Scene, func(rel string) ([]byte, error) {
		data, err := read(rel)
		if err != nil && fetchErr == nil {
			fetchErr = err
		}
		return data, err
	})
	if err != nil && fetchErr != nil && !failure.IsTerminal(fetchErr) {
		return nil, fmt.Errorf("loading scene %s: %w", version, fetchErr)
	}
	if err != nil {
		return nil, failure.Terminalf("parsing scene %s: %w", version, err)
	}
	return pathTracer{s, k.Threads}, nil
}

// TileSize is the default tile edge.
func (Kind) TileSize() int { return TileSize }

// Builds are the path tracer's one build (scene.Builder): this tilefarm binary's, as its manifests
// record it (identity.BuildFingerprint), under the renderer name "tilefarm". A job's tiles
// render on workers of one such build, so a frame never mixes two across a rolling upgrade.
func (Kind) Builds(context.Context) ([]string, error) { return []string{Build()}, nil }

// Build is the path tracer's build fingerprint.
func Build() string { return "tilefarm/" + identity.BuildFingerprint() }

// Formats are PNG (the default), 16-bit PNG and OpenEXR.
func (Kind) Formats() []string { return scene.RGBFormats }

// TilePreviews is true: a tile tone-maps on its own exactly as the frame's PNG does.
func (Kind) TilePreviews() bool { return true }

// EncodeTilePreview encodes a tile as the frame's 8-bit PNG holds it (raster.EncodePNG8 with
// the frame's exposure), so tiles drawn at their rectangles reproduce the frame's PNG.
func (Kind) EncodeTilePreview(r render.Rect, pix []float32, st render.Settings) ([]byte, error) {
	return raster.EncodePNG8(&raster.Frame{Width: r.Dx(), Height: r.Dy(), Pix: pix}, st.Exposure)
}

// pathTracer is a loaded JSON scene, rendering each tile on threads goroutines.
type pathTracer struct {
	s       *render.Scene
	threads int
}

func (p pathTracer) NewTile(_ context.Context, st render.Settings, frame int, r render.Rect) (scene.Tile, error) {
	t, err := render.NewTile(p.s, st, frame, r)
	if err != nil {
		return nil, failure.Terminalf("creating tile: %w", err)
	}
	t.SetThreads(p.threads)
	return t, nil
}

// Channels is nil: the path tracer's frames are linear RGB.
func (pathTracer) Channels(render.Settings) []string { return nil }

// Encode tone-maps PNGs with tilefarm's own curve (the scene's exposure).
func (pathTracer) Encode(_ context.Context, f *raster.Frame, _ int, st render.Settings, formats []string) ([]scene.Output, error) {
	return scene.EncodeRGB(f, st.Exposure, formats)
}
