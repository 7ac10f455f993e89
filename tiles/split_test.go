package tiles

import (
	"errors"
	"fmt"
	"testing"

	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/render"
)

func TestSplitCoversEveryPixelOnce(t *testing.T) {
	frames := []struct{ w, h int }{{160, 90}, {1, 1}, {64, 64}, {65, 63}, {7, 300}}
	sizes := []int{1, 2, 3, 7, 16, 37, 63, 64, 65, 89, 90, 100, 160, 161, 4096}
	for _, f := range frames {
		for _, size := range sizes {
			t.Run(fmt.Sprintf("%dx%d/%d", f.w, f.h, size), func(t *testing.T) {
				rects, err := Split(f.w, f.h, size)
				if err != nil {
					t.Fatalf("Split: %v", err)
				}
				wantCols := (f.w + size - 1) / size
				wantRows := (f.h + size - 1) / size
				if len(rects) != wantCols*wantRows {
					t.Fatalf("got %d tiles, want %d x %d", len(rects), wantCols, wantRows)
				}
				seen := make([]int, f.w*f.h)
				for i, r := range rects {
					if r.X0 < 0 || r.Y0 < 0 || r.X1 > f.w || r.Y1 > f.h || r.X0 >= r.X1 || r.Y0 >= r.Y1 {
						t.Fatalf("tile %d %+v empty or outside %dx%d", i, r, f.w, f.h)
					}
					if r.X1-r.X0 > size || r.Y1-r.Y0 > size {
						t.Fatalf("tile %d %+v larger than %d", i, r, size)
					}
					// Tiles are as equal as can be: widths and heights within one pixel of each other.
					if dx, dy := r.X1-r.X0, r.Y1-r.Y0; dx < f.w/wantCols || dx > ceilDiv(f.w, wantCols) || dy < f.h/wantRows || dy > ceilDiv(f.h, wantRows) {
						t.Fatalf("tile %d %+v is not within a pixel of %d/%d x %d/%d", i, r, f.w, wantCols, f.h, wantRows)
					}
					if i > 0 {
						p := rects[i-1]
						if r.Y0 < p.Y0 || (r.Y0 == p.Y0 && r.X0 <= p.X0) {
							t.Fatalf("tiles not row-major: %+v after %+v", r, p)
						}
					}
					for y := r.Y0; y < r.Y1; y++ {
						for x := r.X0; x < r.X1; x++ {
							seen[y*f.w+x]++
						}
					}
				}
				for i, n := range seen {
					if n != 1 {
						t.Fatalf("pixel (%d,%d) covered %d times", i%f.w, i/f.w, n)
					}
				}
			})
		}
	}
}

func TestSplitRowMajorExample(t *testing.T) {
	// A hand-checked small case: 5x3 in 2px tiles, three columns of 1, 2 and 2 pixels and two
	// rows of 1 and 2: no column or row is more than a pixel narrower than another.
	got, err := Split(5, 3, 2)
	if err != nil {
		t.Fatal(err)
	}
	want := []render.Rect{
		{X0: 0, Y0: 0, X1: 1, Y1: 1}, {X0: 1, Y0: 0, X1: 3, Y1: 1}, {X0: 3, Y0: 0, X1: 5, Y1: 1},
		{X0: 0, Y0: 1, X1: 1, Y1: 3}, {X0: 1, Y0: 1, X1: 3, Y1: 3}, {X0: 3, Y0: 1, X1: 5, Y1: 3},
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("tile %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestSplitErrors(t *testing.T) {
	cases := []struct{ w, h, size int }{
		{0, 90, 16}, {160, 0, 16}, {-1, 90, 16}, {160, -90, 16},
		{160, 90, 0}, {160, 90, -64}, {160, 90, MaxTileSize + 1},
		{MaxTilesPerFrame + 1, 1, 1}, {1 << 16, 1 << 16, 16},
	}
	for _, c := range cases {
		rects, err := Split(c.w, c.h, c.size)
		if !errors.Is(err, ErrInvalidTiling) {
			t.Errorf("Split(%d, %d, %d) = %d tiles, err %v; want ErrInvalidTiling", c.w, c.h, c.size, len(rects), err)
		}
	}
	// The limits themselves are accepted.
	if _, err := Split(MaxTileSize, MaxTileSize, MaxTileSize); err != nil {
		t.Errorf("Split at MaxTileSize: %v", err)
	}
	if rects, err := Split(MaxTilesPerFrame, 1, 1); err != nil || len(rects) != MaxTilesPerFrame {
		t.Errorf("Split at MaxTilesPerFrame: %d tiles, %v", len(rects), err)
	}
}

func TestFrameTilesMatchSplitAndTileKey(t *testing.T) {
	got, err := FrameTiles("fk", 100, 50, 37)
	if err != nil {
		t.Fatal(err)
	}
	rects, _ := Split(100, 50, 37)
	if len(got) != len(rects) {
		t.Fatalf("%d tiles, want %d", len(got), len(rects))
	}
	for i, ft := range got {
		if ft.Rect != rects[i] || ft.Key != identity.TileKey("fk", rects[i]) {
			t.Fatalf("tile %d = %+v", i, ft)
		}
	}
	if _, err := FrameTiles("fk", 100, 50, 0); err == nil {
		t.Fatal("tile size 0 accepted")
	}
}

// TestTileSizeNotInIdentity checks that the same rectangle produced by two
// different tile sizes gets the same tile key and input hash: the tile size
// decides only how work is cut, never what a pixel is.
func TestTileSizeNotInIdentity(t *testing.T) {
	st := render.Settings{Camera: "main", Width: 160, Height: 90, SPP: 16, MaxDepth: 8, Seed: 1, Exposure: 0.5}
	fk := identity.FrameKey("sv", "main", 1, identity.SettingsHash(st))
	a, err := Split(90, 90, 90)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Split(90, 90, 128)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != 1 || len(b) != 1 || a[0] != b[0] {
		t.Fatalf("expected one identical full-frame tile, got %v and %v", a, b)
	}
	if identity.TileKey(fk, a[0]) != identity.TileKey(fk, b[0]) {
		t.Error("tile key depends on tile size")
	}
	if identity.InputHash("sv", st, 1, a[0]) != identity.InputHash("sv", st, 1, b[0]) {
		t.Error("input hash depends on tile size")
	}
}
