package layout

import (
	"context"
	"errors"
	"fmt"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/internal/failure"
	"github.com/tilefarm/tilefarm/objstore"
	"github.com/tilefarm/tilefarm/raster"
	"github.com/tilefarm/tilefarm/render"
	"github.com/tilefarm/tilefarm/tiles"
)

// ReadTile reads a promoted tile's float buffer through its manifest: the manifest must
// exist and name the build st renders with, and its object must decode to the tile's size.
// A missing manifest, another build or a buffer of the wrong size is terminal (and a missing
// manifest wraps objstore.ErrNotFound); a store error is not.
func ReadTile(ctx context.Context, objects objstore.Store, frameKey string, t tiles.FrameTile, st render.Settings) ([]float32, error) {
	m, err := finalize.ReadManifest(ctx, objects, TileManifestKey(frameKey, t.Key))
	if err != nil {
		if errors.Is(err, objstore.ErrNotFound) {
			return nil, failure.Terminalf("tile %s has no manifest: %w", t.Key, err)
		}
		return nil, fmt.Errorf("reading tile manifest %s: %w", t.Key, err)
	}
	if build := identity.BuildFor(st); m.Build != build {
		return nil, failure.Terminalf("build mismatch: tile %s was rendered by %q, this reader is %q", t.Key, m.Build, build)
	}
	data, err := finalize.ReadObject(ctx, objects, m, TileOutputName)
	if err != nil {
		return nil, fmt.Errorf("reading tile %s: %w", t.Key, err)
	}
	pix, err := raster.DecodeTile(data, t.Rect.Dx()*t.Rect.Dy()*st.Values())
	if err != nil {
		return nil, failure.Terminalf("decoding tile %s: %w", t.Key, err)
	}
	return pix, nil
}
