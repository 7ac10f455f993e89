package bundle_test

import (
	"bytes"
	"context"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/tilefarm/tilefarm/internal/bundle"
	farmkinds "github.com/tilefarm/tilefarm/internal/kinds"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/internal/scene/jsonscene"
)

// kinds check decoded manifests as a coordinator does; checking starts no renderer process.
var kinds = farmkinds.Builtin(farmkinds.Options{}, scene.Env{})

// fuzzBundleScenes are the example scenes whose manifests seed FuzzDecodeBundle.
var fuzzBundleScenes = []string{"../../examples/shot/scene.json", "../../examples/cornell/scene.json"}

// smallShotBundle is a bundle shaped like the shot's (a scene referencing one mesh), small.
func smallShotBundle() *bundle.Bundle {
	scene := `{"settings": {"camera": "c", "width": 8, "height": 6}, "cameras": [{"name": "c", "position": [0,0,3], "look_at": [0,0,0]}],` +
		` "materials": [{"name": "m", "type": "diffuse"}], "objects": [{"type": "mesh", "file": "meshes/tri.obj", "material": "m"}]}`
	return bundle.FromMemory("scene.json", []byte(scene), map[string][]byte{"meshes/tri.obj": []byte("v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 3\n")})
}

// FuzzDecodeBundle: Decode never panics on an uploaded manifest; one it accepts re-encodes to
// exactly the bytes it was decoded from (the encoding is canonical, so no two inputs decode to
// the same manifest), names only clean relative paths and well-formed hashes within the
// limits, and the coordinator's check of it (scene.Kinds.Check, its content read from memory
// where there is some) and Version run on it without panicking.
func FuzzDecodeBundle(f *testing.F) {
	small := smallShotBundle()
	if _, _, err := kinds.Check(context.Background(), small); err != nil {
		f.Fatal(err)
	}
	seeds := [][]byte{small.Encode(), bundle.FromMemory("", []byte(`{}`), nil).Encode(),
		bundle.FromMemory("x", nil, map[string][]byte{"a": nil, "b/c": {1}}).Encode()}
	for _, p := range fuzzBundleScenes {
		b, err := jsonscene.ReadFile(context.Background(), p)
		if err != nil {
			f.Fatalf("jsonscene.ReadFile(%s): %v", p, err)
		}
		seeds = append(seeds, b.Encode())
	}
	for _, s := range seeds {
		f.Add(s)
		f.Add(s[:len(s)-1])
		f.Add(append(slices.Clone(s), ' '))
	}
	h := strings.Repeat("a", 64)
	for _, s := range []string{
		`{"format":"tilefarm-scene/1","name":"","scene":null,"files":{}}`,
		`{"format":"tilefarm-scene/2","name":"","scene":null,"files":{"../a":{"size":1,"sha256":"` + h + `"}}}`,
		`{"format":"tilefarm-scene/2","name":"","scene":null,"files":{"a":{"size":-1,"sha256":"` + h + `"}}}`,
		`{"format":"tilefarm-scene/2","name":"","scene":null,"files":{"a":{"size":1,"sha256":"` + strings.ToUpper(h) + `"}}}`,
		`{"format":"tilefarm-scene/2","name":"","scene":null,"files":{"a":{"size":1,"sha256":"` + h + `","shared":"/abs"}}}`,
		`{"format":"tilefarm-scene/2","name":"","scene":null,"files":{"a":{"size":1,"sha256":"` + h + `"}},"extra":1}`,
		`{"files":{},"format":"tilefarm-scene/2","name":"","scene":null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := bundle.Decode(data, bundle.Limits{Files: 64, Bytes: 1 << 40})
		if err != nil {
			if b != nil {
				t.Fatal("Decode returned a bundle with an error")
			}
			return
		}
		if enc := b.Encode(); !bytes.Equal(enc, data) {
			t.Fatalf("re-encoding changed the bytes: %q decoded, %q encoded", data, enc)
		}
		if len(b.Files) > 64 {
			t.Fatalf("%d files accepted over a limit of 64", len(b.Files))
		}
		for _, n := range slices.Sorted(maps.Keys(b.Files)) {
			if err := bundle.CheckName(n); err != nil {
				t.Fatalf("accepted file name: %v", err)
			}
			if f := b.Files[n]; f.Size < 0 || len(f.SHA256) != 64 || strings.ToLower(f.SHA256) != f.SHA256 {
				t.Fatalf("accepted file %q: %+v", n, f)
			}
		}
		_ = b.Version()
		_, _, _ = kinds.Check(context.Background(), b.WithSource(small.Source()))
	})
}
