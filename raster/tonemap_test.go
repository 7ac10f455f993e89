package raster

import (
	"math"
	"testing"
)

// Golden values computed independently (Python, float64) from the documented
// formula: ACES Narkowicz fit, sRGB OETF, round to nearest.
func TestToneMapGolden(t *testing.T) {
	cases := []struct {
		linear float64
		v      float64
		c8     uint8
		c16    uint16
	}{
		{0.001, 0.0029875662580126105, 1, 196},
		{0.01, 0.04813548571460533, 12, 3155},
		{0.18, 0.553457571985739, 141, 36271},
		{0.5, 0.807318899732381, 206, 52908},
		{1.0, 0.9082304956696972, 232, 59521},
		{2.0, 0.961598001176574, 245, 63018},
		{4.0, 0.9882227102346403, 252, 64763},
		{7.0, 0.9995008751981406, 255, 65502},
	}
	for _, c := range cases {
		if got := ToneMap(c.linear, 0); math.Abs(got-c.v) > 1e-12 {
			t.Errorf("ToneMap(%v) = %.17g, want %.17g", c.linear, got, c.v)
		}
		if got := ToneMap8(c.linear, 0); got != c.c8 {
			t.Errorf("ToneMap8(%v) = %d, want %d", c.linear, got, c.c8)
		}
		if got := ToneMap16(c.linear, 0); got != c.c16 {
			t.Errorf("ToneMap16(%v) = %d, want %d", c.linear, got, c.c16)
		}
	}
}

func TestToneMapEdges(t *testing.T) {
	for _, x := range []float64{0, -1, -math.MaxFloat64, math.Inf(-1), math.NaN()} {
		if ToneMap(x, 0) != 0 || ToneMap8(x, 3) != 0 || ToneMap16(x, -3) != 0 {
			t.Errorf("ToneMap(%v) = %v, want 0", x, ToneMap(x, 0))
		}
	}
	for _, x := range []float64{8, 1e6, 1e30, math.MaxFloat32, math.MaxFloat64, math.Inf(1)} {
		if ToneMap(x, 0) != 1 || ToneMap8(x, 0) != 255 || ToneMap16(x, 0) != 65535 {
			t.Errorf("ToneMap(%v) = %v, want 1", x, ToneMap(x, 0))
		}
	}
	// Exposure is a power-of-two scale: +1 stop on x equals 2x.
	for _, x := range []float64{0.01, 0.18, 0.7, 3} {
		if a, b := ToneMap(x, 1), ToneMap(2*x, 0); a != b {
			t.Errorf("ToneMap(%v, +1) = %v, ToneMap(%v, 0) = %v", x, a, 2*x, b)
		}
		if a, b := ToneMap(x, -2), ToneMap(x/4, 0); a != b {
			t.Errorf("ToneMap(%v, -2) = %v, ToneMap(%v, 0) = %v", x, a, x/4, b)
		}
	}
}

func TestToneMapMonotonic(t *testing.T) {
	prev, prev8 := -1.0, -1
	for i := 0; i <= 200000; i++ {
		x := math.Pow(10, -6+float64(i)*10/200000) // 1e-6 .. 1e4
		v := ToneMap(x, 0)
		if v < prev || v < 0 || v > 1 {
			t.Fatalf("ToneMap(%v) = %v after %v", x, v, prev)
		}
		if c := int(ToneMap8(x, 0)); c < prev8 {
			t.Fatalf("ToneMap8(%v) = %d after %d", x, c, prev8)
		} else {
			prev8 = c
		}
		prev = v
	}
	if prev8 != 255 {
		t.Fatalf("sweep ended at code %d, want 255", prev8)
	}
}
