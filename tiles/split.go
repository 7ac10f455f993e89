package tiles

import (
	"errors"
	"fmt"

	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/render"
)

// MaxTileSize is the largest tile edge Split accepts. Bigger tiles make
// checkpoints and retries too coarse to be useful.
const MaxTileSize = 4096

// MaxTilesPerFrame bounds how many tiles one frame may be split into, so an
// absurd resolution with a tiny tile size fails fast instead of allocating
// millions of rectangles.
const MaxTilesPerFrame = 1 << 20

// ErrInvalidTiling is wrapped by every Split error. It is terminal: retrying
// the same request cannot succeed.
var ErrInvalidTiling = errors.New("invalid tiling")

// Split cuts a width x height frame into size x size tiles in row-major order
// (left to right, then top to bottom). Edge tiles are clipped to the frame, so
// every pixel belongs to exactly one tile. Rectangles are half-open:
// X0 <= x < X1, Y0 <= y < Y1. The tile size only decides how work is
// distributed and is not part of any frame identity.
func Split(width, height, size int) ([]render.Rect, error) {
	switch {
	case width <= 0 || height <= 0:
		return nil, fmt.Errorf("splitting %dx%d frame: %w: width and height must be positive", width, height, ErrInvalidTiling)
	case size <= 0:
		return nil, fmt.Errorf("splitting %dx%d frame: %w: tile size %d must be positive", width, height, ErrInvalidTiling, size)
	case size > MaxTileSize:
		return nil, fmt.Errorf("splitting %dx%d frame: %w: tile size %d exceeds %d", width, height, ErrInvalidTiling, size, MaxTileSize)
	}
	cols := ceilDiv(width, size)
	rows := ceilDiv(height, size)
	if cols > MaxTilesPerFrame || rows > MaxTilesPerFrame/cols {
		return nil, fmt.Errorf("splitting %dx%d frame into %d px tiles: %w: more than %d tiles", width, height, size, ErrInvalidTiling, MaxTilesPerFrame)
	}
	rects := make([]render.Rect, 0, cols*rows)
	for y0 := 0; y0 < height; y0 += size {
		y1 := min(y0+size, height)
		for x0 := 0; x0 < width; x0 += size {
			x1 := min(x0+size, width)
			rects = append(rects, render.Rect{X0: x0, Y0: y0, X1: x1, Y1: y1})
		}
	}
	return rects, nil
}

// ceilDiv returns ceil(a/b) for positive a and b without overflowing.
func ceilDiv(a, b int) int { return (a-1)/b + 1 }

// FrameTile is one tile of a frame: its tile_key and pixel rectangle.
type FrameTile struct {
	Key  string
	Rect render.Rect
}

// FrameTiles lists a frame's tiles in Split order. Tiles are derived from the frame, never
// stored with it, so a frame record and an assemble message stay small however many tiles the
// frame has.
func FrameTiles(frameKey string, width, height, size int) ([]FrameTile, error) {
	rects, err := Split(width, height, size)
	if err != nil {
		return nil, err
	}
	out := make([]FrameTile, len(rects))
	for i, r := range rects {
		out[i] = FrameTile{Key: identity.TileKey(frameKey, r), Rect: r}
	}
	return out, nil
}
