package render

import (
	"fmt"
	"math"
	"testing"
)

// These tests compare renders against closed-form answers, so a wrong BSDF
// weight, light pdf or MIS weight makes them fail.

// furnaceScene is a single sphere of the given material inside a uniform
// white environment, seen by a narrow camera.
func furnaceScene(mat string, depth int) string {
	return fmt.Sprintf(`{
	"settings": {"width": 8, "height": 8, "spp": 64, "max_depth": %d},
	"background": [1, 1, 1],
	"cameras": [{"name": "c", "position": [0, 0, 5], "look_at": [0, 0, 0], "fov": 5}],
	"materials": [%s],
	"objects": [{"type": "sphere", "center": [0, 0, 0], "radius": 1, "material": "m"}]
}`, depth, mat)
}

func renderScene(t *testing.T, js string) ([]float32, Settings) {
	t.Helper()
	s, err := ParseScene([]byte(js), nil)
	if err != nil {
		t.Fatal(err)
	}
	st := s.Defaults()
	return renderTiled(t, s, st, 1, 0), st
}

func TestFurnace(t *testing.T) {
	cases := []struct {
		name  string
		mat   string
		depth int
		want  [3]float64
		tol   float64
	}{
		// A convex diffuse sphere sees only the sky: every sample is exactly albedo.
		{"diffuse", `{"name": "m", "type": "diffuse", "color": [0.5, 0.25, 1]}`, 1, [3]float64{0.5, 0.25, 1}, 1e-12},
		{"diffuse-deep", `{"name": "m", "type": "diffuse", "color": [0.5, 0.25, 1]}`, 6, [3]float64{0.5, 0.25, 1}, 1e-12},
		{"mirror", `{"name": "m", "type": "metal", "color": [1, 1, 1]}`, 2, [3]float64{1, 1, 1}, 1e-12},
		// Smooth glass conserves energy: what enters leaves (on average,
		// with Russian roulette reweighting).
		{"glass", `{"name": "m", "type": "dielectric", "ior": 1.5}`, 64, [3]float64{1, 1, 1}, 0.03},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			px, st := renderScene(t, furnaceScene(c.mat, c.depth))
			for ch := range 3 {
				got := meanRegion(px, st.Width, Rect{2, 2, 6, 6}, ch)
				if math.Abs(got-c.want[ch]) > c.tol {
					t.Errorf("channel %d: mean %v, want %v ± %v", ch, got, c.want[ch], c.tol)
				}
			}
		})
	}
}

// TestSphereLightIrradiance: a diffuse plane under a spherical light of
// radiance Le, radius r, centre at height d reflects L = ρ·Le·r²/d² at the
// point straight below the light (irradiance π·Le·sin²θmax).
func TestSphereLightIrradiance(t *testing.T) {
	for _, c := range []struct{ r, d float64 }{{0.25, 2}, {1.5, 2.5}} {
		t.Run(fmt.Sprint(c.r), func(t *testing.T) {
			const rho, le = 0.5, 10.0
			js := fmt.Sprintf(`{
	"settings": {"width": 8, "height": 8, "spp": 128, "max_depth": 3},
	"cameras": [{"name": "c", "position": [0, 0.4, 3], "look_at": [0, 0, 0], "fov": 0.5}],
	"materials": [
		{"name": "floor", "type": "diffuse", "color": [%g, %g, %g]},
		{"name": "lamp", "type": "emissive", "emission": [1, 1, 1], "strength": %g}
	],
	"objects": [
		{"type": "plane", "point": [0, 0, 0], "normal": [0, 1, 0], "material": "floor"},
		{"type": "sphere", "center": [0, %g, 0], "radius": %g, "material": "lamp"}
	]
}`, rho, rho, rho, le, c.d, c.r)
			px, st := renderScene(t, js)
			want := rho * le * c.r * c.r / (c.d * c.d)
			got := meanRegion(px, st.Width, Rect{0, 0, 8, 8}, 1)
			if math.Abs(got-want) > 0.02*want {
				t.Errorf("radiance %v, want %v ± 2%%", got, want)
			}
		})
	}
}

// TestQuadLightIrradiance: a diffuse plane below a square light of side 2a at
// height c, centred above the shaded point, reflects ρ·Le·4·F, where F is the
// form factor from a point to an a×a rectangle above one of its corners.
func TestQuadLightIrradiance(t *testing.T) {
	const rho, le, a, h = 0.6, 4.0, 0.5, 1.0
	js := fmt.Sprintf(`{
	"settings": {"width": 8, "height": 8, "spp": 128, "max_depth": 2},
	"cameras": [{"name": "c", "position": [0, 0.5, 3], "look_at": [0, 0, 0], "fov": 0.5}],
	"materials": [
		{"name": "floor", "type": "diffuse", "color": [%g, %g, %g]},
		{"name": "lamp", "type": "emissive", "strength": %g}
	],
	"objects": [
		{"type": "plane", "point": [0, 0, 0], "normal": [0, 1, 0], "material": "floor"},
		{"type": "quad", "corner": [%g, %g, %g], "u": [%g, 0, 0], "v": [0, 0, %g], "material": "lamp"}
	]
}`, rho, rho, rho, le, -a, h, -a, 2*a, 2*a)
	px, st := renderScene(t, js)
	x := a / h
	f := 1 / (2 * math.Pi) * 2 * (x / math.Sqrt(1+x*x) * math.Atan(x/math.Sqrt(1+x*x)))
	want := rho * le * 4 * f
	got := meanRegion(px, st.Width, Rect{0, 0, 8, 8}, 0)
	if math.Abs(got-want) > 0.02*want {
		t.Errorf("radiance %v, want %v ± 2%%", got, want)
	}
}

// TestRoughMetalUnderLight renders a rough metal plane under a light both
// with NEE+MIS (normal path) and checks against a brute-force estimate that
// uses BSDF sampling only (the light as an emissive plane, which is never
// light-sampled). Both estimate the same integral; MIS must not bias it.
func TestRoughMetalUnderLight(t *testing.T) {
	scene := func(light string) string {
		return fmt.Sprintf(`{
	"settings": {"width": 6, "height": 6, "spp": 512, "max_depth": 1},
	"cameras": [{"name": "c", "position": [0, 1, 3], "look_at": [0, 0, 0], "fov": 0.5}],
	"materials": [
		{"name": "metal", "type": "metal", "color": [0.9, 0.9, 0.9], "roughness": 0.5},
		{"name": "lamp", "type": "emissive", "strength": 3}
	],
	"objects": [
		{"type": "plane", "point": [0, 0, 0], "normal": [0, 1, 0], "material": "metal"},
		%s
	]
}`, light)
	}
	// Quad light large enough that BSDF sampling alone converges; the
	// emissive plane version is the reference: a plane at y=2 that is
	// emissive everywhere equals an infinite quad.
	withQuad := scene(`{"type": "quad", "corner": [-200, 2, -200], "u": [400, 0, 0], "v": [0, 0, 400], "material": "lamp"}`)
	withPlane := scene(`{"type": "plane", "point": [0, 2, 0], "normal": [0, -1, 0], "material": "lamp"}`)
	a, st := renderScene(t, withQuad)
	b, _ := renderScene(t, withPlane)
	ga := meanRegion(a, st.Width, Rect{0, 0, 6, 6}, 0)
	gb := meanRegion(b, st.Width, Rect{0, 0, 6, 6}, 0)
	if gb < 0.5 || math.Abs(ga-gb) > 0.04*gb {
		t.Errorf("NEE+MIS estimate %v, BSDF-only estimate %v: differ by more than 4%%", ga, gb)
	}
}
