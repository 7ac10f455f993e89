package raster

import (
	"math"
	"slices"
	"testing"
)

func TestFramePlace(t *testing.T) {
	f := NewFrame(5, 4)
	if len(f.Pix) != 5*4*3 {
		t.Fatalf("NewFrame buffer has %d values", len(f.Pix))
	}
	// Two tiles: [0,3)x[0,2) and [3,5)x[1,4), each value encoding its position.
	tile := func(x0, y0, x1, y1 int) []float32 {
		var pix []float32
		for y := y0; y < y1; y++ {
			for x := x0; x < x1; x++ {
				pix = append(pix, float32(x), float32(y), float32(100+x*10+y))
			}
		}
		return pix
	}
	if err := f.Place(0, 0, 3, 2, tile(0, 0, 3, 2)); err != nil {
		t.Fatal(err)
	}
	if err := f.Place(3, 1, 5, 4, tile(3, 1, 5, 4)); err != nil {
		t.Fatal(err)
	}
	for y := 0; y < 4; y++ {
		for x := 0; x < 5; x++ {
			i := (y*5 + x) * 3
			covered := (x < 3 && y < 2) || (x >= 3 && y >= 1)
			want := [3]float32{}
			if covered {
				want = [3]float32{float32(x), float32(y), float32(100 + x*10 + y)}
			}
			if got := [3]float32(f.Pix[i : i+3]); got != want {
				t.Errorf("pixel (%d,%d) = %v, want %v", x, y, got, want)
			}
		}
	}

	before := slices.Clone(f.Pix)
	bad := []struct{ x0, y0, x1, y1, n int }{
		{-1, 0, 2, 2, 2 * 2 * 3}, // negative origin
		{0, 0, 6, 1, 6 * 1 * 3},  // past the right edge
		{0, 3, 2, 5, 2 * 2 * 3},  // past the bottom edge
		{2, 2, 2, 3, 0},          // empty
		{3, 3, 1, 1, 12},         // reversed
		{0, 0, 2, 2, 2*2*3 - 1},  // short buffer
		{0, 0, 2, 2, 2*2*3 + 3},  // long buffer
	}
	for _, b := range bad {
		if err := f.Place(b.x0, b.y0, b.x1, b.y1, make([]float32, b.n)); err == nil {
			t.Errorf("Place(%d,%d,%d,%d) with %d values succeeded", b.x0, b.y0, b.x1, b.y1, b.n)
		}
	}
	if !slices.Equal(before, f.Pix) {
		t.Fatal("a rejected Place changed the frame")
	}
	if err := (&Frame{Width: 2, Height: 2, Pix: make([]float32, 5)}).Place(0, 0, 1, 1, make([]float32, 3)); err == nil {
		t.Fatal("Place into an inconsistent frame succeeded")
	}
}

func TestValidateSize(t *testing.T) {
	for _, c := range [][2]int{{0, 1}, {1, 0}, {-5, 5}, {1 << 15, 1 << 15}} {
		if ValidateSize(c[0], c[1]) == nil {
			t.Errorf("ValidateSize(%d, %d) accepted", c[0], c[1])
		}
	}
	if err := ValidateSize(1920, 1080); err != nil {
		t.Fatal(err)
	}
}

func TestTileRoundTrip(t *testing.T) {
	pix := []float32{0, 1, -1, 0.1, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)),
		math.Float32frombits(0x7fc00001), math.SmallestNonzeroFloat32, math.MaxFloat32}
	b := EncodeTile(pix)
	if len(b) != 4*len(pix) {
		t.Fatalf("encoded %d bytes", len(b))
	}
	// Little-endian IEEE 754: 1.0 is 00 00 80 3f.
	if [4]byte(b[4:8]) != [4]byte{0, 0, 0x80, 0x3f} {
		t.Fatalf("1.0 encoded as % x", b[4:8])
	}
	got, err := DecodeTile(b, len(pix))
	if err != nil {
		t.Fatal(err)
	}
	for i := range pix {
		if math.Float32bits(got[i]) != math.Float32bits(pix[i]) {
			t.Errorf("value %d: bits %08x, want %08x", i, math.Float32bits(got[i]), math.Float32bits(pix[i]))
		}
	}
	for _, n := range []int{len(pix) - 1, len(pix) + 1, -1, math.MaxInt/4 + 1} {
		if _, err := DecodeTile(b, n); err == nil {
			t.Errorf("DecodeTile with n=%d accepted %d bytes", n, len(b))
		}
	}
	if _, err := DecodeTile(b[:len(b)-1], len(pix)); err == nil {
		t.Error("DecodeTile accepted a truncated buffer")
	}
}

// TestWithoutDropsChannels: Without keeps the other channels' values in their order, pixel by
// pixel, and returns the frame itself when it has none of the channels.
func TestWithoutDropsChannels(t *testing.T) {
	f := NewFrameOf(2, 1, []string{"L.Combined.R", "L.GlossCol.R", "L.GlossDir.R"})
	copy(f.Pix, []float32{1, 2, 3, 4, 5, 6})
	g := f.Without([]string{"L.GlossCol.R"})
	if !slices.Equal(g.Names, []string{"L.Combined.R", "L.GlossDir.R"}) || !slices.Equal(g.Pix, []float32{1, 3, 4, 6}) {
		t.Fatalf("Without: %q %v", g.Names, g.Pix)
	}
	if f.Without([]string{"L.Other.R"}) != f || f.Without(nil) != f {
		t.Fatal("Without of no channel of the frame made a copy")
	}
	if len(f.Names) != 3 || f.Pix[1] != 2 {
		t.Fatal("Without changed the frame")
	}
}
