package blender

import (
	"context"
	"fmt"
	"os"

	"github.com/tilefarm/tilefarm/raster"
)

// EncodePNG encodes a linear float frame of the scene as Blender itself writes the scene's
// renders: through its colour management (view transform, look, exposure, gamma, display) at
// depth 8 or 16 bits, so an artist's PNG looks as it would from Blender.
func EncodePNG(ctx context.Context, pool *Pool, sc *Scene, f *raster.Frame, depth int) ([]byte, error) {
	if depth != 8 && depth != 16 {
		return nil, fmt.Errorf("blender: PNG depth %d, want 8 or 16", depth)
	}
	exr, err := raster.EncodeEXR(f, raster.EXRNone)
	if err != nil {
		return nil, err
	}
	in, err := pool.scratch(".exr")
	if err != nil {
		return nil, err
	}
	defer os.Remove(in)
	out, err := pool.scratch(".png")
	if err != nil {
		return nil, err
	}
	defer os.Remove(out)
	if err := os.WriteFile(in, exr, 0o644); err != nil {
		return nil, fmt.Errorf("writing the frame for Blender: %w", err)
	}
	blend := sc.Blend()
	req := map[string]any{"op": "encode", "file": blend, "in": in, "out": out, "depth": fmt.Sprint(depth)}
	if _, err := pool.call(ctx, blend, req); err != nil {
		return nil, fmt.Errorf("encoding PNG: %w", err)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		return nil, fmt.Errorf("%w: reading the encoded PNG: %v", ErrProcess, err)
	}
	return data, nil
}
