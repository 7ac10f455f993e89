package render

import (
	"context"
	"os"
	"testing"
)

// fuzzAssets are the OBJ files a fuzzed scene may reference.
var fuzzAssets = map[string]string{
	"m.obj":     triOBJ,
	"torus.obj": "v 0 0 0\nv 1 0 0\nv 1 1 0\nv 0 1 0\nvn 0 0 1\nf 1//1 2//1 3//1 4//1\n",
	"bad.obj":   "v 0 0\n",
}

// FuzzParseScene: parsing never panics or hangs; a scene that parses also
// lists its assets and renders one sample of one pixel.
func FuzzParseScene(f *testing.F) {
	f.Add([]byte(baseScene))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"cameras": [{"name": "c", "position": [0,0,1], "look_at": [0,0,0], "keyframes": [{"frame": 2, "up": [0,0,1]}]}], "materials": [{"name": "m", "type": "metal", "roughness": 0.5}], "objects": [{"type": "quad", "corner": [0,0,0], "u": [1,0,0], "v": [0,1,0], "material": "m", "keyframes": [{"frame": 3, "scale": [1,2,3]}]}]}`))
	f.Add([]byte(`{"frames": {"first": 1, "last": 3}, "sky": {"top": [1,1,1], "bottom": [0,0,0]}, "cameras": [{"name": "c", "position": [0,0,1], "look_at": [0,0,0], "aperture": 0.1}], "materials": [{"name": "g", "type": "dielectric"}, {"name": "e", "type": "emissive"}], "objects": [{"type": "mesh", "file": "torus.obj", "smooth": true, "material": "e"}, {"type": "plane", "normal": [0,1,0], "material": "g"}]}`))
	for _, ex := range []string{"cornell", "shot"} {
		if data, err := os.ReadFile(examplePath(ex)); err == nil {
			f.Add(data)
		}
	}
	read := mapReader(fuzzAssets)
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := ParseScene(data, read)
		if verr := ValidateScene(data, read); (verr == nil) != (err == nil) || (err != nil && verr.Error() != err.Error()) {
			t.Fatalf("ValidateScene = %v, ParseScene = %v; want the same outcome", verr, err)
		}
		if err != nil {
			return
		}
		if _, err := AssetPaths(data); err != nil {
			t.Fatalf("scene parses but AssetPaths fails: %v", err)
		}
		st := s.Defaults()
		if err := s.Validate(st); err != nil {
			t.Fatalf("Defaults do not validate: %v", err)
		}
		first, last := s.Frames()
		if first > last {
			t.Fatalf("frames %d > %d", first, last)
		}
		st.Width, st.Height, st.SPP, st.MaxDepth = 4, 3, 1, 3
		tl, err := NewTile(s, st, first, Rect{1, 1, 2, 2})
		if err != nil {
			return // e.g. a camera that degenerates between keyframes
		}
		if err := tl.Render(context.Background(), 0, 1); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzParseOBJ: the OBJ parser never panics, and every index it returns is
// in range.
func FuzzParseOBJ(f *testing.F) {
	f.Add([]byte(triOBJ))
	f.Add([]byte("v 0 0 0\nv 1 0 0\nv 0 1 0\nvt 0 0\nvn 0 0 1\nf 1/1/1 2/1/1 3/1/1\nf -1 -2 -3\n"))
	f.Add([]byte("v 1 2 3\nf 1 1 1 1 1 1\n"))
	f.Add([]byte("f 1//1 2//2\n# c\n\r\n"))
	if data, err := os.ReadFile("../examples/shot/torus.obj"); err == nil {
		f.Add(data[:min(len(data), 4096)])
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := parseOBJ(data, 10000)
		if err != nil {
			return
		}
		if len(m.tris) == 0 || len(m.tris) > 10000 {
			t.Fatalf("%d triangles", len(m.tris))
		}
		for _, tr := range m.tris {
			for k := range 3 {
				if tr.v[k] < 0 || int(tr.v[k]) >= len(m.positions) {
					t.Fatalf("vertex index %d out of range", tr.v[k])
				}
				if tr.n[k] < -1 || int(tr.n[k]) >= len(m.normals) {
					t.Fatalf("normal index %d out of range", tr.n[k])
				}
			}
		}
		m.computeVertexNormals()
	})
}
