package render

import (
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// baseScene is a valid scene; the bad-input cases edit it textually.
const baseScene = `{
	"settings": {"width": 32, "height": 24, "spp": 2, "max_depth": 3, "camera": "main"},
	"cameras": [{"name": "main", "position": [0, 1, 5], "look_at": [0, 0, 0]}],
	"materials": [
		{"name": "white", "type": "diffuse", "color": [0.7, 0.7, 0.7]},
		{"name": "lamp", "type": "emissive", "strength": 5}
	],
	"objects": [
		{"type": "sphere", "center": [0, 0, 0], "radius": 1, "material": "white"},
		{"type": "mesh", "file": "m.obj", "material": "white"}
	]
}`

const triOBJ = "v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 3\n"

func TestParseSceneValid(t *testing.T) {
	s, err := ParseScene([]byte(baseScene), mapReader(map[string]string{"m.obj": triOBJ}))
	if err != nil {
		t.Fatal(err)
	}
	want := Settings{Camera: "main", Width: 32, Height: 24, SPP: 2, MaxDepth: 3}
	if got := s.Defaults(); got != want {
		t.Fatalf("Defaults = %+v, want %+v", got, want)
	}
	if f, l := s.Frames(); f != 1 || l != 1 {
		t.Fatalf("Frames = %d, %d, want 1, 1", f, l)
	}
	if got := s.Cameras(); !reflect.DeepEqual(got, []string{"main"}) {
		t.Fatalf("Cameras = %v", got)
	}
}

func TestSettingsDefaults(t *testing.T) {
	js := `{"cameras": [{"name": "a", "position": [0,0,1], "look_at": [0,0,0]}, {"name": "b", "position": [0,0,2], "look_at": [0,0,0]}],
		"materials": [{"name": "m", "type": "diffuse"}]}`
	s, err := ParseScene([]byte(js), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := Settings{Camera: "a", Width: defaultWidth, Height: defaultHeight, SPP: defaultSPP, MaxDepth: defaultMaxDepth}
	if got := s.Defaults(); got != want {
		t.Fatalf("Defaults = %+v, want %+v", got, want)
	}
}

// TestBadInput feeds broken scenes and assets and checks that each error is
// a *SceneError (unless noted) whose message names the field and problem.
func TestBadInput(t *testing.T) {
	good := map[string]string{"m.obj": triOBJ}
	errPerm := errors.New("permission denied")
	cases := []struct {
		name     string
		scene    string
		old, new string // textual edit of scene (default baseScene)
		assets   map[string]string
		read     AssetReader
		want     []string
		notScene bool  // the error must not be a *SceneError (retryable I/O)
		wantIs   error // errors.Is target, if any
	}{
		{name: "malformed", scene: `{"settings": {"width": 3,}`, want: []string{"malformed JSON", "line 1"}},
		{name: "truncated", scene: `{"settings": {"width": 3`, want: []string{"malformed JSON"}},
		{name: "empty", scene: ``, want: []string{"empty input"}},
		{name: "trailing", scene: baseScene + ` {}`, want: []string{"unexpected data after the value"}},
		{name: "not object", scene: `[1, 2]`, want: []string{"want an object"}},
		{name: "unknown material type", old: `"type": "diffuse"`, new: `"type": "plastik"`,
			want: []string{`materials[0].type: unknown material "plastik"`}},
		{name: "undefined material", old: `"radius": 1, "material": "white"`, new: `"radius": 1, "material": "chrome"`,
			want: []string{`objects[0].material: unknown material "chrome"`}},
		{name: "unknown camera", old: `"camera": "main"`, new: `"camera": "side"`,
			want: []string{`settings.camera: unknown camera "side"`}},
		{name: "missing obj", old: `"m.obj"`, new: `"gone.obj"`,
			want: []string{`objects[1].file`, `"gone.obj" not found`}, wantIs: fs.ErrNotExist},
		{name: "unreadable obj", scene: baseScene, read: func(string) ([]byte, error) { return nil, errPerm },
			want: []string{`objects[1].file`, `reading "m.obj"`, "permission denied"}, notScene: true, wantIs: errPerm},
		{name: "obj syntax", scene: baseScene, assets: map[string]string{"m.obj": "v 0 0 0\nv 1 0 0\nv 0 1 zero\nf 1 2 3\n"},
			want: []string{`objects[1].file`, "m.obj: line 3", `"zero"`}},
		{name: "obj bad index", scene: baseScene, assets: map[string]string{"m.obj": "v 0 0 0\nv 1 0 0\nv 0 1 0\n\nf 1 2 4\n"},
			want: []string{"line 5", "vertex index 4 out of range"}},
		{name: "absolute path", old: `"m.obj"`, new: `"/etc/passwd"`, want: []string{"objects[1].file", "absolute"}},
		{name: "dotdot path", old: `"m.obj"`, new: `"../secret/m.obj"`, want: []string{"objects[1].file", `".."`}},
		{name: "backslash path", old: `"m.obj"`, new: `"meshes\\m.obj"`, want: []string{"objects[1].file", "backslash"}},
		{name: "drive path", old: `"m.obj"`, new: `"C:m.obj"`, want: []string{"objects[1].file", "drive letter"}},
		{name: "unclean path", old: `"m.obj"`, new: `"./m.obj"`, want: []string{"objects[1].file", "not clean"}},
		{name: "overflow radius", old: `"radius": 1`, new: `"radius": 1e999`,
			want: []string{"objects[0].radius", "1e999", "out of range"}},
		{name: "overflow exposure", old: `"camera": "main"`, new: `"camera": "main", "exposure": -1e400`,
			want: []string{"settings.exposure", "1e400"}},
		{name: "overflow vector", old: `"look_at": [0, 0, 0]`, new: `"look_at": [0, 1e999, 0]`,
			want: []string{"cameras[0].look_at", "1e999"}},
		{name: "width zero", old: `"width": 32`, new: `"width": 0`, want: []string{"settings.width", "got 0"}},
		{name: "width negative", old: `"width": 32`, new: `"width": -5`, want: []string{"settings.width", "got -5"}},
		{name: "width absurd", old: `"width": 32`, new: `"width": 100000`, want: []string{"settings.width", "got 100000"}},
		{name: "width float", old: `"width": 32`, new: `"width": 32.5`, want: []string{"settings.width", "integer"}},
		{name: "height zero", old: `"height": 24`, new: `"height": 0`, want: []string{"settings.height", "got 0"}},
		{name: "height absurd", old: `"height": 24`, new: `"height": 99999999999999999999`, want: []string{"settings.height"}},
		{name: "too many pixels", old: `"width": 32, "height": 24`, new: `"width": 16384, "height": 16384`,
			want: []string{"settings.width", "exceeds the limit"}},
		{name: "spp zero", old: `"spp": 2`, new: `"spp": 0`, want: []string{"settings.spp", "got 0"}},
		{name: "spp negative", old: `"spp": 2`, new: `"spp": -1`, want: []string{"settings.spp", "got -1"}},
		{name: "spp absurd", old: `"spp": 2`, new: `"spp": 2000000`, want: []string{"settings.spp", "got 2000000"}},
		{name: "depth zero", old: `"max_depth": 3`, new: `"max_depth": 0`, want: []string{"settings.max_depth", "got 0"}},
		{name: "depth absurd", old: `"max_depth": 3`, new: `"max_depth": 5000`, want: []string{"settings.max_depth", "got 5000"}},
		{name: "seed negative", old: `"spp": 2`, new: `"spp": 2, "seed": -3`, want: []string{"settings.seed", "non-negative integer"}},
		{name: "unknown top field", old: `"settings"`, new: `"extra": 1, "settings"`, want: []string{"extra: unknown field"}},
		{name: "unknown settings field", old: `"spp": 2`, new: `"spp": 2, "samples": 4`, want: []string{"settings.samples: unknown field"}},
		{name: "unknown object field", old: `"radius": 1`, new: `"radius": 1, "radus": 2`, want: []string{"objects[0].radus: unknown field"}},
		{name: "unknown transform field", old: `"radius": 1`, new: `"radius": 1, "transform": {"rotat": [0, 0, 0]}`,
			want: []string{"objects[0].transform.rotat: unknown field"}},
		{name: "unknown keyframe field", old: `"material": "white"}
	]`, new: `"material": "white", "keyframes": [{"frame": 3, "rotation": [0, 1, 0]}]}
	]`, want: []string{"objects[1].keyframes[0].rotation: unknown field"}},
		{name: "field of other type", old: `"radius": 1`, new: `"radius": 1, "file": "x.obj"`, want: []string{"objects[0].file: not used by a sphere"}},
		{name: "material field of other type", old: `"color": [0.7, 0.7, 0.7]`, new: `"ior": 1.3`,
			want: []string{"materials[0].ior: not used by a diffuse material"}},
		{name: "colour out of range", old: `"color": [0.7, 0.7, 0.7]`, new: `"color": [0.7, 1.7, 0.7]`,
			want: []string{"materials[0].color[1]", "between 0 and 1"}},
		{name: "short vector", old: `"center": [0, 0, 0]`, new: `"center": [0, 0]`, want: []string{"objects[0].center", "want 3 numbers, got 2"}},
		{name: "negative radius", old: `"radius": 1`, new: `"radius": -1`, want: []string{"objects[0].radius"}},
		{name: "sphere non-uniform scale", old: `"radius": 1`, new: `"radius": 1, "transform": {"scale": [1, 2, 1]}`,
			want: []string{"objects[0].transform.scale", "uniform"}},
		{name: "zero scale", old: `"material": "white"}
	]`, new: `"material": "white", "keyframes": [{"frame": 3, "scale": 0}]}
	]`, want: []string{"objects[1].keyframes[0].scale", "positive"}},
		{name: "duplicate keyframe", old: `"look_at": [0, 0, 0]`, new: `"look_at": [0, 0, 0], "keyframes": [{"frame": 2, "fov": 30}, {"frame": 2, "fov": 40}]`,
			want: []string{"cameras[0].keyframes", "two keyframes for frame 2"}},
		{name: "camera up parallel", old: `"look_at": [0, 0, 0]`, new: `"look_at": [0, 0, 0], "up": [0, 0.2, 1]`,
			want: []string{"cameras[0]", "parallel"}},
		{name: "fov absurd", old: `"look_at": [0, 0, 0]`, new: `"look_at": [0, 0, 0], "fov": 180`, want: []string{"cameras[0].fov"}},
		{name: "duplicate material", old: `"name": "lamp"`, new: `"name": "white"`, want: []string{"materials[1].name", "duplicate"}},
		{name: "frames reversed", old: `"settings"`, new: `"frames": {"first": 10, "last": 2}, "settings"`,
			want: []string{"frames.last", "before frames.first"}},
		{name: "no cameras", old: `"cameras": [{"name": "main", "position": [0, 1, 5], "look_at": [0, 0, 0]}],`, new: ``,
			want: []string{"cameras", "at least one camera"}},
		{name: "unknown object type", old: `"type": "sphere"`, new: `"type": "cube"`, want: []string{`objects[0].type: unknown object type "cube"`}},
		{name: "bad easing", old: `"radius": 1`, new: `"radius": 1, "easing": "bouncy"`, want: []string{"objects[0].easing", "bouncy"}},
		{name: "sky and background", old: `"settings"`, new: `"background": [1, 1, 1], "sky": {"top": [1, 1, 1], "bottom": [0, 0, 0]}, "settings"`,
			want: []string{"sky", "either"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			js := c.scene
			if c.old != "" {
				if !strings.Contains(baseScene, c.old) {
					t.Fatalf("test bug: %q not in baseScene", c.old)
				}
				js = strings.Replace(baseScene, c.old, c.new, 1)
			}
			read := c.read
			if read == nil {
				a := c.assets
				if a == nil {
					a = good
				}
				read = mapReader(a)
			}
			_, err := ParseScene([]byte(js), read)
			if err == nil {
				t.Fatal("no error")
			}
			// Validating without building meshes reports exactly the same error.
			if verr := ValidateScene([]byte(js), read); verr == nil || verr.Error() != err.Error() {
				t.Fatalf("ValidateScene = %v, ParseScene = %v; want the same error", verr, err)
			}
			var se *SceneError
			if isScene := errors.As(err, &se); isScene == c.notScene {
				t.Fatalf("errors.As(*SceneError) = %v, want %v (err: %v)", isScene, !c.notScene, err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if c.wantIs != nil && !errors.Is(err, c.wantIs) {
				t.Errorf("errors.Is(%v, %v) = false", err, c.wantIs)
			}
		})
	}
}

func TestValidateSettings(t *testing.T) {
	s, err := ParseScene([]byte(baseScene), mapReader(map[string]string{"m.obj": triOBJ}))
	if err != nil {
		t.Fatal(err)
	}
	ok := s.Defaults()
	if err := s.Validate(ok); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	edit := func(f func(*Settings)) Settings { st := ok; f(&st); return st }
	cases := []struct {
		st   Settings
		want string
	}{
		{edit(func(s *Settings) { s.Camera = "nope" }), "settings.camera"},
		{edit(func(s *Settings) { s.Camera = "" }), "settings.camera"},
		{edit(func(s *Settings) { s.Width = 0 }), "settings.width"},
		{edit(func(s *Settings) { s.Width = MaxWidth + 1 }), "settings.width"},
		{edit(func(s *Settings) { s.Height = -1 }), "settings.height"},
		{edit(func(s *Settings) { s.Width, s.Height = 10000, 10000 }), "settings.width"},
		{edit(func(s *Settings) { s.SPP = 0 }), "settings.spp"},
		{edit(func(s *Settings) { s.SPP = MaxSPP + 1 }), "settings.spp"},
		{edit(func(s *Settings) { s.MaxDepth = 0 }), "settings.max_depth"},
		{edit(func(s *Settings) { s.MaxDepth = MaxMaxDepth + 1 }), "settings.max_depth"},
		{edit(func(s *Settings) { s.Exposure = math.NaN() }), "settings.exposure"},
		{edit(func(s *Settings) { s.Exposure = math.Inf(1) }), "settings.exposure"},
		{edit(func(s *Settings) { s.Exposure = math.Inf(-1) }), "settings.exposure"},
	}
	for _, c := range cases {
		err := s.Validate(c.st)
		var se *SceneError
		if !errors.As(err, &se) || se.Field != c.want {
			t.Errorf("Validate(%+v) = %v, want *SceneError on %s", c.st, err, c.want)
		}
		if _, err := NewTile(s, c.st, 1, Rect{0, 0, 1, 1}); err == nil {
			t.Errorf("NewTile accepted %+v", c.st)
		}
	}
	// Limits themselves are accepted.
	for _, st := range []Settings{
		edit(func(s *Settings) { s.Width, s.Height = MaxWidth, 4096 }),
		edit(func(s *Settings) { s.SPP, s.MaxDepth = MaxSPP, MaxMaxDepth }),
	} {
		if err := s.Validate(st); err != nil {
			t.Errorf("Validate(%+v) = %v, want nil", st, err)
		}
	}
}

func TestNewTileRect(t *testing.T) {
	s, err := ParseScene([]byte(baseScene), mapReader(map[string]string{"m.obj": triOBJ}))
	if err != nil {
		t.Fatal(err)
	}
	st := s.Defaults()
	for _, r := range []Rect{{-1, 0, 4, 4}, {0, 0, 33, 4}, {0, 0, 4, 25}, {3, 3, 3, 4}, {5, 0, 4, 4}} {
		_, err := NewTile(s, st, 1, r)
		var se *SceneError
		if !errors.As(err, &se) || se.Field != "rect" {
			t.Errorf("NewTile(%v) = %v, want *SceneError on rect", r, err)
		}
	}
}

func TestAssetPaths(t *testing.T) {
	js := strings.Replace(baseScene, `{"type": "mesh", "file": "m.obj", "material": "white"}`,
		`{"type": "mesh", "file": "meshes/b.obj", "material": "white"},
		{"type": "mesh", "file": "a.obj", "material": "white"},
		{"type": "mesh", "file": "meshes/b.obj", "material": "white", "smooth": true}`, 1)
	got, err := AssetPaths([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a.obj", "meshes/b.obj"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("AssetPaths = %v, want %v", got, want)
	}
	for _, bad := range []string{"/abs.obj", "../up.obj", `a\b.obj`, "C:/x.obj", "a/../b.obj", "", "a//b.obj"} {
		js := strings.Replace(baseScene, `"m.obj"`, `"`+strings.ReplaceAll(bad, `\`, `\\`)+`"`, 1)
		_, err := AssetPaths([]byte(js))
		var se *SceneError
		if !errors.As(err, &se) || se.Field != "objects[1].file" {
			t.Errorf("AssetPaths with %q: %v, want *SceneError on objects[1].file", bad, err)
		}
	}
}

func TestExamplesLoad(t *testing.T) {
	c := loadExample(t, "cornell")
	if st := c.Defaults(); st.Width != 160 || st.Height != 160 || st.SPP != 32 || st.MaxDepth != 8 || st.Camera != "front" {
		t.Errorf("cornell defaults %+v", st)
	}
	if f, l := c.Frames(); f != 1 || l != 1 {
		t.Errorf("cornell frames %d-%d", f, l)
	}
	s := loadExample(t, "shot")
	if f, l := s.Frames(); f != 1 || l != 24 {
		t.Errorf("shot frames %d-%d, want 1-24", f, l)
	}
	if got := s.Cameras(); !reflect.DeepEqual(got, []string{"orbit", "top"}) {
		t.Errorf("shot cameras %v", got)
	}
	for name, want := range map[string][]string{"cornell": nil, "shot": {"torus.obj"}} {
		data, err := os.ReadFile(examplePath(name))
		if err != nil {
			t.Fatal(err)
		}
		got, err := AssetPaths(data)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s AssetPaths = %v, want %v", name, got, want)
		}
	}
}

func TestLoadSceneFileErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// Missing scene file.
	if _, err := LoadSceneFile(filepath.Join(dir, "none.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing scene: %v", err)
	}
	// Missing asset.
	p := write("a/scene.json", baseScene)
	_, err := LoadSceneFile(p)
	var se *SceneError
	if !errors.As(err, &se) || !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "m.obj") {
		t.Errorf("missing asset: %v", err)
	}
	// Asset is a directory: unreadable.
	if err := os.Mkdir(filepath.Join(dir, "a", "m.obj"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err = LoadSceneFile(p)
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("directory asset: %v", err)
	}
	// Works once the asset exists, from a subdirectory.
	js := strings.Replace(baseScene, `"m.obj"`, `"meshes/m.obj"`, 1)
	p = write("b/scene.json", js)
	write("b/meshes/m.obj", triOBJ)
	if _, err := LoadSceneFile(p); err != nil {
		t.Errorf("valid scene with mesh in subdirectory: %v", err)
	}
}

func TestSceneSizeLimit(t *testing.T) {
	big := make([]byte, MaxSceneBytes+1)
	_, err := ParseScene(big, nil)
	var se *SceneError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("oversized scene: %v", err)
	}
	_, err = ParseScene([]byte(baseScene), func(string) ([]byte, error) { return make([]byte, MaxOBJBytes+1), nil })
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("oversized OBJ: %v", err)
	}
}
