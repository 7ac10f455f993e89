package render

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// spheresScene is a fogleman/pt-style benchmark: a grid of spheres of mixed
// materials on a plane under a sky, with one spherical light.
func spheresScene() string {
	var objs []string
	mats := []string{"red", "chrome", "glass", "white"}
	for i := -4; i <= 4; i++ {
		for j := -4; j <= 4; j++ {
			objs = append(objs, fmt.Sprintf(`{"type": "sphere", "center": [%g, 0.4, %g], "radius": 0.4, "material": %q}`,
				float64(i), float64(j), mats[(i+j+8)%len(mats)]))
		}
	}
	objs = append(objs, `{"type": "plane", "normal": [0, 1, 0], "material": "white"}`,
		`{"type": "sphere", "center": [3, 8, 2], "radius": 1, "material": "lamp"}`)
	return `{
	"settings": {"width": 256, "height": 256, "spp": 1048576, "max_depth": 6},
	"sky": {"top": [0.4, 0.6, 1], "bottom": [1, 1, 1]},
	"cameras": [{"name": "c", "position": [0, 4, 9], "look_at": [0, 0, 0], "fov": 45}],
	"materials": [
		{"name": "red", "type": "diffuse", "color": [0.8, 0.2, 0.2]},
		{"name": "white", "type": "diffuse", "color": [0.75, 0.75, 0.75]},
		{"name": "chrome", "type": "metal", "color": [0.9, 0.9, 0.9], "roughness": 0.05},
		{"name": "glass", "type": "dielectric", "ior": 1.5},
		{"name": "lamp", "type": "emissive", "strength": 20}
	],
	"objects": [` + strings.Join(objs, ",\n") + `]}`
}

// benchTile renders one sample pass of a 64×64 tile per iteration and
// reports samples/s and rays/s (camera, bounce and shadow rays).
func benchTile(b *testing.B, s *Scene, st Settings) {
	b.Helper()
	st.SPP = MaxSPP
	r := Rect{st.Width/2 - 32, st.Height/2 - 32, st.Width/2 + 32, st.Height/2 + 32}
	tl, err := NewTile(s, st, 1, r)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		n := tl.Next()
		if err := tl.Render(ctx, n, n+1); err != nil {
			b.Fatal(err)
		}
	}
	sec := b.Elapsed().Seconds()
	samples := float64(tl.Next()) * float64(r.Dx()*r.Dy())
	b.ReportMetric(samples/sec, "samples/s")
	b.ReportMetric(float64(tl.rays)/sec, "rays/s")
}

func BenchmarkSpheres(b *testing.B) {
	s, err := ParseScene([]byte(spheresScene()), nil)
	if err != nil {
		b.Fatal(err)
	}
	benchTile(b, s, s.Defaults())
}

func BenchmarkCornell(b *testing.B) {
	s := loadExample(b, "cornell")
	st := s.Defaults()
	st.Width, st.Height = 256, 256
	benchTile(b, s, st)
}

func BenchmarkShot(b *testing.B) {
	s := loadExample(b, "shot")
	st := s.Defaults()
	st.Width, st.Height = 384, 216
	benchTile(b, s, st)
}

func BenchmarkBuildWorldShot(b *testing.B) {
	s := loadExample(b, "shot")
	for b.Loop() {
		if _, err := buildWorld(s, 5); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkShotThreads renders sample passes of the 64×64 centre tile of the shot on one
// goroutine and on every core (Tile.SetThreads), alternating, and reports the speedup of the
// second over the first as a ratio measured in the same run.
func BenchmarkShotThreads(b *testing.B) {
	s := loadExample(b, "shot")
	st := s.Defaults()
	st.Width, st.Height, st.SPP = 384, 216, MaxSPP
	r := Rect{st.Width/2 - 32, st.Height/2 - 32, st.Width/2 + 32, st.Height/2 + 32}
	n := runtime.NumCPU()
	one, err := NewTile(s, st, 1, r)
	if err != nil {
		b.Fatal(err)
	}
	all, err := NewTile(s, st, 1, r)
	if err != nil {
		b.Fatal(err)
	}
	all.SetThreads(n)
	ctx := context.Background()
	var tOne, tAll time.Duration
	for b.Loop() {
		for _, c := range []struct {
			tl *Tile
			d  *time.Duration
		}{{one, &tOne}, {all, &tAll}} {
			start := time.Now()
			k := c.tl.Next()
			if err := c.tl.Render(ctx, k, k+1); err != nil {
				b.Fatal(err)
			}
			*c.d += time.Since(start)
		}
	}
	b.ReportMetric(float64(n), "threads")
	b.ReportMetric(tOne.Seconds()/tAll.Seconds(), "speedup")
}
