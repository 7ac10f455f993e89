package render

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"io/fs"
	"math"
	"path/filepath"
	"runtime"
	"testing"
)

// examplePath returns the scene file of an example.
func examplePath(name string) string {
	return filepath.Join("..", "examples", name, "scene.json")
}

// loadExample loads an example scene or fails the test.
func loadExample(t testing.TB, name string) *Scene {
	t.Helper()
	s, err := LoadSceneFile(examplePath(name))
	if err != nil {
		t.Fatalf("loading example %s: %v", name, err)
	}
	return s
}

// small returns the scene's default settings at a reduced size and spp.
func small(s *Scene, w, h, spp int) Settings {
	st := s.Defaults()
	st.Width, st.Height, st.SPP = w, h, spp
	return st
}

// renderTiled renders a whole frame split into size×size tiles (size <= 0:
// one tile) and assembles the tiles' Pixels into one frame buffer.
func renderTiled(t testing.TB, s *Scene, st Settings, frame, size int) []float32 {
	t.Helper()
	return renderWith(t, s, st, frame, size, nil)
}

// renderWith is renderTiled with the sampler's numbers replaced by legacy
// (nil: the production sampler).
func renderWith(t testing.TB, s *Scene, st Settings, frame, size int, legacy func(uint64, uint32, uint64) float64) []float32 {
	t.Helper()
	if size <= 0 {
		size = max(st.Width, st.Height)
	}
	out := make([]float32, 3*st.Width*st.Height)
	for y0 := 0; y0 < st.Height; y0 += size {
		for x0 := 0; x0 < st.Width; x0 += size {
			r := Rect{x0, y0, min(x0+size, st.Width), min(y0+size, st.Height)}
			tl, err := NewTile(s, st, frame, r)
			if err != nil {
				t.Fatalf("NewTile %v: %v", r, err)
			}
			tl.legacy = legacy
			if err := tl.Render(context.Background(), 0, st.SPP); err != nil {
				t.Fatalf("Render %v: %v", r, err)
			}
			px := tl.Pixels()
			if len(px) != 3*r.Dx()*r.Dy() {
				t.Fatalf("Pixels len %d, want %d", len(px), 3*r.Dx()*r.Dy())
			}
			for y := r.Y0; y < r.Y1; y++ {
				row := px[3*(y-r.Y0)*r.Dx() : 3*(y-r.Y0+1)*r.Dx()]
				copy(out[3*(y*st.Width+r.X0):], row)
			}
		}
	}
	return out
}

// goldenArch reports whether golden pixel hashes are pinned for this target.
func goldenArch() bool { return runtime.GOARCH == "amd64" }

// sameBits reports the first index where a and b differ bitwise, or -1.
func sameBits(a, b []float32) int {
	if len(a) != len(b) {
		return 0
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

// hashPixels is the sha256 of the float32 bits, little endian.
func hashPixels(px []float32) string {
	h := sha256.New()
	var b [4]byte
	for _, v := range px {
		binary.LittleEndian.PutUint32(b[:], math.Float32bits(v))
		h.Write(b[:])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// mapReader serves assets from a map; missing names are fs.ErrNotExist.
func mapReader(files map[string]string) AssetReader {
	return func(rel string) ([]byte, error) {
		d, ok := files[rel]
		if !ok {
			return nil, &fs.PathError{Op: "open", Path: rel, Err: fs.ErrNotExist}
		}
		return []byte(d), nil
	}
}

// meanRegion averages channel c of a w-wide RGB buffer over a rectangle.
func meanRegion(px []float32, w int, r Rect, c int) float64 {
	sum, n := 0.0, 0
	for y := r.Y0; y < r.Y1; y++ {
		for x := r.X0; x < r.X1; x++ {
			sum += float64(px[3*(y*w+x)+c])
			n++
		}
	}
	return sum / float64(n)
}
