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

// Split cuts a width x height frame into the fewest tiles of at most size x size pixels
// (ceil(width/size) columns by ceil(height/size) rows), as equal as can be: column widths and
// row heights differ by at most one pixel. Equal tiles keep the workers of a frame busy for
// equal times; clipped edge tiles (a 480x270 frame in 256 px tiles was a 256x256 and a 224x256
// tile and two strips of 14 rows, each strip paying a tile's fixed cost for a sliver of work)
// left a worker idle while another rendered a big tile (docs/design.md, "Identities", Tiles).
// Tiles are in row-major order (left to right, then top to bottom) and every pixel belongs to
// exactly one.
// Rectangles are half-open: X0 <= x < X1, Y0 <= y < Y1. The tile size only decides how work
// is distributed and is not part of any frame identity.
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
	for j := range rows {
		y0, y1 := even(height, rows, j), even(height, rows, j+1)
		for i := range cols {
			rects = append(rects, render.Rect{X0: even(width, cols, i), Y0: y0, X1: even(width, cols, i+1), Y1: y1})
		}
	}
	return rects, nil
}

// even is the i-th of n+1 boundaries cutting length into n parts whose sizes differ by at most
// one: floor(i*length/n), computed without overflow for any length and n Split allows.
func even(length, n, i int) int { return int(int64(i) * int64(length) / int64(n)) }

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
