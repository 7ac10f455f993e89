package layout

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

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
	return decodeTile(data, t, st)
}

func decodeTile(data []byte, t tiles.FrameTile, st render.Settings) ([]float32, error) {
	pix, err := raster.DecodeTile(data, t.Rect.Dx()*t.Rect.Dy()*st.Values())
	if err != nil {
		return nil, failure.Terminalf("decoding tile %s: %w", t.Key, err)
	}
	return pix, nil
}

// ReadReportedTile reads a promoted tile's float buffer straight from its object, as the
// worker that promoted it reported it ("attempt:sha256", wire.AssembleJob.TileObjects): one
// request instead of two. The object must exist and match the sha256 reported; otherwise the
// error wraps ErrNotReported and the caller reads the tile through its manifest (ReadTile),
// which stays the truth.
func ReadReportedTile(ctx context.Context, objects objstore.Store, frameKey string, t tiles.FrameTile, st render.Settings, reported string) ([]float32, error) {
	attempt, sum, ok := strings.Cut(reported, ":")
	if !ok {
		return nil, fmt.Errorf("tile %s: object %q: %w", t.Key, reported, ErrNotReported)
	}
	key := finalize.AttemptKey(TileManifestKey(frameKey, t.Key), attempt, TileOutputName)
	if err := objstore.ValidateKey(key); err != nil {
		return nil, fmt.Errorf("tile %s: %w: %w", t.Key, ErrNotReported, err)
	}
	data, err := objects.Get(ctx, key)
	if errors.Is(err, objstore.ErrNotFound) {
		return nil, fmt.Errorf("tile %s: %w: %w", t.Key, ErrNotReported, err)
	}
	if err != nil {
		return nil, fmt.Errorf("reading tile %s: %w", t.Key, err)
	}
	if got := sha256.Sum256(data); hex.EncodeToString(got[:]) != sum {
		return nil, fmt.Errorf("tile %s: %w: its object does not have the sha256 reported", t.Key, ErrNotReported)
	}
	return decodeTile(data, t, st)
}

// ErrNotReported is a tile whose reported object cannot be read as reported.
var ErrNotReported = errors.New("the tile's object is not as reported")
