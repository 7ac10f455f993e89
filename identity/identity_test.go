package identity

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"math"
	"regexp"
	"testing"

	"github.com/tilefarm/tilefarm/render"
)

var hex64 = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Golden identities: if one of these changes, every frame key, tile key and
// object name in existing farms changes with it. Only update them together
// with a deliberate version bump of the domain tag.
const (
	goldenFrameKey = "8e5ffda7d82e9e7d13ba2dcffc04a7c6f7b7ec3955fd5570d7cdc56c1b63a3fd"
	goldenTileKey  = "84fdfef98154386a875d6df077f160f1b92a764fe8b10227ae67fc499b78f31a"
)

func TestGoldenIdentities(t *testing.T) {
	fk := FrameKey("scene-v", "main", 7, "settings-h")
	if fk != goldenFrameKey {
		t.Errorf("FrameKey golden changed: got %s, want %s", fk, goldenFrameKey)
	}
	tk := TileKey(goldenFrameKey, render.Rect{X0: 64, Y0: 0, X1: 128, Y1: 64})
	if tk != goldenTileKey {
		t.Errorf("TileKey golden changed: got %s, want %s", tk, goldenTileKey)
	}
}

// TestFrameKeyLayout re-derives a frame key from the documented layout (tag,
// NUL, then 8-byte big-endian length-prefixed strings and 8-byte integers),
// independently of the hashing helper.
func TestFrameKeyLayout(t *testing.T) {
	var b []byte
	b = append(b, "tilefarm/frame_key/v1\x00"...)
	for _, s := range []string{"scene-v", "main"} {
		b = binary.BigEndian.AppendUint64(b, uint64(len(s)))
		b = append(b, s...)
	}
	b = binary.BigEndian.AppendUint64(b, 7)
	b = binary.BigEndian.AppendUint64(b, uint64(len("settings-h")))
	b = append(b, "settings-h"...)
	sum := sha256.Sum256(b)
	if got, want := FrameKey("scene-v", "main", 7, "settings-h"), hex.EncodeToString(sum[:]); got != want {
		t.Fatalf("FrameKey = %s, independent derivation = %s", got, want)
	}

	b = append(b[:0], "tilefarm/tile_key/v1\x00"...)
	b = binary.BigEndian.AppendUint64(b, 64)
	b = append(b, goldenFrameKey...)
	for _, v := range []int64{64, 0, 128, 64} {
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	sum = sha256.Sum256(b)
	if got, want := TileKey(goldenFrameKey, render.Rect{X0: 64, Y0: 0, X1: 128, Y1: 64}), hex.EncodeToString(sum[:]); got != want {
		t.Fatalf("TileKey = %s, independent derivation = %s", got, want)
	}
}

// baseSettingsJSON is a valid settings value written with the JSON tags of
// render.Settings, so the tests do not depend on its Go field names.
const baseSettingsJSON = `{"camera":"main","width":160,"height":90,"spp":16,"max_depth":8,"seed":1,"exposure":0.5}`

func settingsFromJSON(t *testing.T, overlay string) render.Settings {
	t.Helper()
	var st render.Settings
	if err := json.Unmarshal([]byte(baseSettingsJSON), &st); err != nil {
		t.Fatalf("decoding base settings: %v", err)
	}
	if overlay != "" {
		if err := json.Unmarshal([]byte(overlay), &st); err != nil {
			t.Fatalf("decoding settings overlay %s: %v", overlay, err)
		}
	}
	return st
}

func TestSettingsJSONTagsExist(t *testing.T) {
	// The field tables below vary settings through their JSON tags; make sure
	// every tag really maps to a field, or those cases would test nothing.
	raw, err := json.Marshal(settingsFromJSON(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"camera", "width", "height", "spp", "max_depth", "seed", "exposure"} {
		if _, ok := m[k]; !ok {
			t.Errorf("render.Settings has no JSON field %q", k)
		}
	}
}

// settingsOverlays changes one settings field each.
var settingsOverlays = map[string]string{
	"camera":    `{"camera":"side"}`,
	"width":     `{"width":161}`,
	"height":    `{"height":91}`,
	"spp":       `{"spp":17}`,
	"max_depth": `{"max_depth":9}`,
	"seed":      `{"seed":2}`,
	"exposure":  `{"exposure":0.25}`,
}

func TestSettingsHash(t *testing.T) {
	base := SettingsHash(settingsFromJSON(t, ""))
	if !hex64.MatchString(base) {
		t.Fatalf("SettingsHash %q is not 64 lowercase hex", base)
	}
	if again := SettingsHash(settingsFromJSON(t, "")); again != base {
		t.Fatalf("SettingsHash not stable: %s then %s", base, again)
	}
	seen := map[string]string{base: "base"}
	for field, overlay := range settingsOverlays {
		h := SettingsHash(settingsFromJSON(t, overlay))
		if prev, dup := seen[h]; dup {
			t.Errorf("changing %s gives the same settings hash as %s", field, prev)
		}
		seen[h] = field
	}
}

func TestFrameKeyChangesWithEachInput(t *testing.T) {
	type in struct {
		sv, cam string
		frame   int
		sh      string
	}
	base := in{"sv", "main", 1, "sh"}
	cases := map[string]in{
		"base":          base,
		"scene version": {"sv2", "main", 1, "sh"},
		"camera":        {"sv", "side", 1, "sh"},
		"frame":         {"sv", "main", 2, "sh"},
		"negative":      {"sv", "main", -1, "sh"},
		"settings":      {"sv", "main", 1, "sh2"},
		// Moving bytes between adjacent fields must not collide.
		"shift sv/cam": {"svm", "ain", 1, "sh"},
		"shift cam/sv": {"s", "vmain", 1, "sh"},
		"empty":        {"", "", 0, ""},
	}
	seen := map[string]string{}
	for name, c := range cases {
		k := FrameKey(c.sv, c.cam, c.frame, c.sh)
		if !hex64.MatchString(k) {
			t.Fatalf("%s: FrameKey %q is not 64 lowercase hex", name, k)
		}
		if prev, dup := seen[k]; dup {
			t.Errorf("FrameKey of %q equals that of %q", name, prev)
		}
		seen[k] = name
	}
	if FrameKey(base.sv, base.cam, base.frame, base.sh) != FrameKey("sv", "main", 1, "sh") {
		t.Error("FrameKey not stable")
	}
}

func TestTileKeyChangesWithEachInput(t *testing.T) {
	fk := FrameKey("sv", "main", 1, "sh")
	r := render.Rect{X0: 0, Y0: 64, X1: 64, Y1: 128}
	cases := map[string]struct {
		fk string
		r  render.Rect
	}{
		"base":      {fk, r},
		"frame key": {FrameKey("sv", "main", 2, "sh"), r},
		"X0":        {fk, render.Rect{X0: 1, Y0: 64, X1: 64, Y1: 128}},
		"Y0":        {fk, render.Rect{X0: 0, Y0: 65, X1: 64, Y1: 128}},
		"X1":        {fk, render.Rect{X0: 0, Y0: 64, X1: 63, Y1: 128}},
		"Y1":        {fk, render.Rect{X0: 0, Y0: 64, X1: 64, Y1: 127}},
		"transpose": {fk, render.Rect{X0: 64, Y0: 0, X1: 128, Y1: 64}},
	}
	seen := map[string]string{}
	for name, c := range cases {
		k := TileKey(c.fk, c.r)
		if !hex64.MatchString(k) {
			t.Fatalf("%s: TileKey %q is not 64 lowercase hex", name, k)
		}
		if prev, dup := seen[k]; dup {
			t.Errorf("TileKey of %q equals that of %q", name, prev)
		}
		seen[k] = name
	}
	if TileKey(fk, r) == fk {
		t.Error("TileKey equals its frame key")
	}
}

func TestInputHashChangesWithEachInput(t *testing.T) {
	st := settingsFromJSON(t, "")
	r := render.Rect{X0: 0, Y0: 0, X1: 32, Y1: 32}
	base := InputHash("sv", st, 3, r)
	if !hex64.MatchString(base) {
		t.Fatalf("InputHash %q is not 64 lowercase hex", base)
	}
	if InputHash("sv", settingsFromJSON(t, ""), 3, r) != base {
		t.Fatal("InputHash not stable")
	}
	seen := map[string]string{base: "base"}
	add := func(name, h string) {
		t.Helper()
		if prev, dup := seen[h]; dup {
			t.Errorf("InputHash with changed %s equals that with %s", name, prev)
		}
		seen[h] = name
	}
	add("scene version", InputHash("sv2", st, 3, r))
	add("frame", InputHash("sv", st, 4, r))
	add("rect", InputHash("sv", st, 3, render.Rect{X0: 0, Y0: 0, X1: 32, Y1: 31}))
	for field, overlay := range settingsOverlays {
		add("settings "+field, InputHash("sv", settingsFromJSON(t, overlay), 3, r))
	}
}

func TestJobID(t *testing.T) {
	a1, a2, b := JobID("shot-010"), JobID("shot-010"), JobID("shot-011")
	if a1 != a2 {
		t.Errorf("JobID not stable: %s vs %s", a1, a2)
	}
	if a1 == b {
		t.Errorf("different idempotency keys give the same job id %s", a1)
	}
	if !regexp.MustCompile(`^job-[0-9a-f]{24}$`).MatchString(a1) {
		t.Errorf("JobID %q has the wrong form", a1)
	}
}

func TestDerivedIdempotencyKey(t *testing.T) {
	base := DerivedIdempotencyKey("proj", "sv", "main", 1, 24, 0, "sh", []string{"png"})
	if !hex64.MatchString(base) {
		t.Fatalf("DerivedIdempotencyKey %q is not 64 lowercase hex", base)
	}
	if DerivedIdempotencyKey("proj", "sv", "main", 1, 24, 0, "sh", []string{"png"}) != base {
		t.Fatal("DerivedIdempotencyKey not stable")
	}
	if DerivedIdempotencyKey("proj", "sv", "main", 1, 24, 1, "sh", []string{"png"}) != base {
		t.Fatal("a frame step of 1 (every frame) changed the key of a job of every frame")
	}
	variants := map[string]string{
		"project":       DerivedIdempotencyKey("proj2", "sv", "main", 1, 24, 0, "sh", []string{"png"}),
		"scene version": DerivedIdempotencyKey("proj", "sv2", "main", 1, 24, 0, "sh", []string{"png"}),
		"camera":        DerivedIdempotencyKey("proj", "sv", "side", 1, 24, 0, "sh", []string{"png"}),
		"first":         DerivedIdempotencyKey("proj", "sv", "main", 2, 24, 0, "sh", []string{"png"}),
		"last":          DerivedIdempotencyKey("proj", "sv", "main", 1, 25, 0, "sh", []string{"png"}),
		"swapped range": DerivedIdempotencyKey("proj", "sv", "main", 24, 1, 0, "sh", []string{"png"}),
		"frame step":    DerivedIdempotencyKey("proj", "sv", "main", 1, 24, 2, "sh", []string{"png"}),
		"settings":      DerivedIdempotencyKey("proj", "sv", "main", 1, 24, 0, "sh2", []string{"png"}),
		"formats":       DerivedIdempotencyKey("proj", "sv", "main", 1, 24, 0, "sh", []string{"exr", "png"}),
		"shift":         DerivedIdempotencyKey("pro", "jsv", "main", 1, 24, 0, "sh", []string{"png"}),
	}
	seen := map[string]string{base: "base"}
	for name, k := range variants {
		if prev, dup := seen[k]; dup {
			t.Errorf("changing %s gives the same key as %s", name, prev)
		}
		seen[k] = name
	}
}

func TestPayloadHash(t *testing.T) {
	a := PayloadHash([]byte(`{"frames":"1-24"}`))
	if !hex64.MatchString(a) {
		t.Fatalf("PayloadHash %q is not 64 lowercase hex", a)
	}
	if PayloadHash([]byte(`{"frames":"1-24"}`)) != a {
		t.Error("PayloadHash not stable")
	}
	if PayloadHash([]byte(`{"frames":"1-25"}`)) == a {
		t.Error("different payloads give the same hash")
	}
	// Domain separation: the same bytes as a payload and as an idempotency
	// key or scene give different values.
	if PayloadHash([]byte("x")) == SceneVersion([]byte("x"), "", nil) {
		t.Error("PayloadHash and SceneVersion share a domain")
	}
}

// byContent names each file of m by its content, as a scene's manifest does.
func byContent(m map[string][]byte) map[string]SceneFile {
	out := map[string]SceneFile{}
	for n, data := range m {
		sum := sha256.Sum256(data)
		out[n] = SceneFile{Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}
	}
	return out
}

func TestSceneVersion(t *testing.T) {
	sv := func(scene []byte, m map[string][]byte) string { return SceneVersion(scene, "", byContent(m)) }
	scene := []byte(`{"objects":[]}`)
	// Build the same asset map in two insertion orders.
	m1 := map[string][]byte{}
	m2 := map[string][]byte{}
	names := []string{"tex/a.png", "tex/b.png", "mesh/c.obj", "d"}
	for i, n := range names {
		m1[n] = []byte("content of " + n)
		m2[names[len(names)-1-i]] = []byte("content of " + names[len(names)-1-i])
	}
	base := sv(scene, m1)
	if !hex64.MatchString(base) {
		t.Fatalf("SceneVersion %q is not 64 lowercase hex", base)
	}
	for i := 0; i < 20; i++ { // map iteration order is randomized on each range
		if got := sv(scene, m2); got != base {
			t.Fatalf("SceneVersion depends on map order: %s vs %s", got, base)
		}
	}

	clone := func() map[string][]byte {
		m := map[string][]byte{}
		for k, v := range m1 {
			m[k] = append([]byte(nil), v...)
		}
		return m
	}
	seen := map[string]string{base: "base"}
	add := func(name, v string) {
		t.Helper()
		if prev, dup := seen[v]; dup {
			t.Errorf("SceneVersion with %s equals that with %s", name, prev)
		}
		seen[v] = name
	}
	changed := clone()
	changed["tex/a.png"][0] ^= 1
	add("one asset byte flipped", sv(scene, changed))
	renamed := clone()
	renamed["tex/z.png"] = renamed["tex/a.png"]
	delete(renamed, "tex/a.png")
	add("asset renamed", sv(scene, renamed))
	removed := clone()
	delete(removed, "d")
	add("asset removed", sv(scene, removed))
	add("scene changed", sv([]byte(`{"objects":[1]}`), m1))
	add("no assets", sv(scene, nil))
	shared := byContent(m1)
	f := shared["tex/a.png"]
	f.Shared = "proj/tex/a.png"
	shared["tex/a.png"] = f
	add("one file on the share", SceneVersion(scene, "/mnt/proj", shared))
	add("another share", SceneVersion(scene, "/mnt/other", shared))
	resized := byContent(m1)
	f = resized["d"]
	f.Size++
	resized["d"] = f
	add("one size changed", SceneVersion(scene, "", resized))
	// Name/content and scene/asset boundaries must not be ambiguous.
	add("boundary a", sv([]byte("s"), map[string][]byte{"ab": []byte("c")}))
	add("boundary b", sv([]byte("s"), map[string][]byte{"a": []byte("bc")}))
	add("boundary c", sv([]byte("sa"), map[string][]byte{"b": []byte("c")}))
	add("empty asset", sv(scene, map[string][]byte{"": nil}))
	if SceneVersion(scene, "", nil) != SceneVersion(scene, "", map[string]SceneFile{}) {
		t.Error("nil and empty asset maps differ")
	}
}

func TestNewAttemptID(t *testing.T) {
	re := regexp.MustCompile(`^[0-9a-f]{16}$`)
	seen := map[string]bool{}
	for i := 0; i < 1000; i++ {
		id := NewAttemptID()
		if !re.MatchString(id) {
			t.Fatalf("attempt id %q is not 16 lowercase hex", id)
		}
		if seen[id] {
			t.Fatalf("attempt id %s repeated", id)
		}
		seen[id] = true
	}
}

func TestSettingsHashEdgeValues(t *testing.T) {
	st := settingsFromJSON(t, "")
	// Large uint64 seeds must not be rounded through float64 while
	// canonicalizing.
	a, b := st, st
	a.Seed, b.Seed = 1<<63, 1<<63+1
	if SettingsHash(a) == SettingsHash(b) {
		t.Error("seeds 2^63 and 2^63+1 give the same settings hash")
	}
	// Unvalidated settings that JSON cannot encode still hash, stably, and
	// apart from valid ones.
	n := st
	n.Exposure = math.NaN()
	h := SettingsHash(n)
	if !hex64.MatchString(h) || h != SettingsHash(n) {
		t.Errorf("NaN exposure hash %q unstable or malformed", h)
	}
	inf := st
	inf.Exposure = math.Inf(1)
	if h == SettingsHash(st) || h == SettingsHash(inf) {
		t.Error("NaN exposure collides with another settings hash")
	}
}
