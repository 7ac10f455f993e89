package bundle_test

import (
	"bytes"
	"encoding/binary"
	"maps"
	"slices"
	"testing"
	"unsafe"

	"github.com/tilefarm/tilefarm/internal/bundle"
	farmkinds "github.com/tilefarm/tilefarm/internal/kinds"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/internal/scene/jsonscene"
)

// fuzzBundleScenes are the example scenes whose encoded bundles seed FuzzDecodeBundle.
// kinds check decoded bundles as a coordinator does; checking starts no renderer process.
var kinds = farmkinds.Builtin(farmkinds.Options{}, scene.Env{})

var fuzzBundleScenes = []string{"../../examples/shot/scene.json", "../../examples/cornell/scene.json"}

// smallShotBundle is a bundle shaped like the shot's (a scene referencing one mesh) but a few
// hundred bytes long, so the mutator works on the header rather than on 100 KiB of OBJ text.
func smallShotBundle() *bundle.Bundle {
	scene := `{"settings": {"camera": "c", "width": 8, "height": 6}, "cameras": [{"name": "c", "position": [0,0,3], "look_at": [0,0,0]}],` +
		` "materials": [{"name": "m", "type": "diffuse"}], "objects": [{"type": "mesh", "file": "meshes/tri.obj", "material": "m"}]}`
	return &bundle.Bundle{Name: "scene.json", Scene: []byte(scene),
		Assets: map[string][]byte{"meshes/tri.obj": []byte("v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 3\n")}}
}

// FuzzDecodeBundle: DecodeBundle never panics on an uploaded body; a bundle it accepts is made
// of full-capacity slices of data that lie inside it and do not overlap (so an append to one can
// never write into another, or past data), it re-encodes to exactly the bytes it was decoded
// from (the encoding is canonical: minimal varints, assets sorted by name and unique, no byte
// before or after the content, so no two inputs decode to the same bundle), and the
// coordinator's check of a bundle (scene.Kinds.Check: its kind, its assets, its scene) and
// Version run on it without panicking.
func FuzzDecodeBundle(f *testing.F) {
	var seeds [][]byte
	for _, p := range fuzzBundleScenes {
		b, err := jsonscene.ReadFile(p)
		if err != nil {
			f.Fatalf("jsonscene.ReadFile(%s): %v", p, err)
		}
		seeds = append(seeds, b.Encode())
	}
	small := smallShotBundle()
	if _, _, err := kinds.Check(small); err != nil {
		f.Fatal(err)
	}
	seeds = append(seeds, small.Encode(),
		(&bundle.Bundle{Scene: []byte(`{}`)}).Encode(),
		(&bundle.Bundle{Name: "x", Assets: map[string][]byte{"a": nil, "b/c": {1}}}).Encode())
	for _, s := range seeds {
		f.Add(s)
		// Truncated in the header and in the content, one byte too long, and with a flipped
		// bit in the version, the first header varint and the content. The shot's bundle is
		// 118 KiB of mesh: its full-length variants would only slow the fuzzer down (every
		// interesting input found in one is minimised byte by byte), so it gets the short ones.
		f.Add(s[:len(bundle.Magic)+4])
		f.Add(s[:min(len(s)-1, 512)])
		if len(s) > 4096 {
			continue
		}
		f.Add(s[:len(s)-1])
		f.Add(append(slices.Clone(s), 0))
		for _, at := range []int{len(bundle.Magic), len(bundle.Magic) + 1, len(s) - 1} {
			flipped := slices.Clone(s)
			flipped[at] ^= 0x01
			f.Add(flipped)
		}
	}
	// Hand-made headers: nothing but the magic, an unknown version, a non-minimal varint, a
	// size over the limit, too many assets, an unsorted and an unclean asset name.
	hdr := func(parts ...[]byte) []byte {
		return bytes.Join(append([][]byte{[]byte(bundle.Magic), {bundle.FormatV1}}, parts...), nil)
	}
	uv := func(v uint64) []byte { return binary.AppendUvarint(nil, v) }
	f.Add([]byte(bundle.Magic))
	f.Add(append([]byte(bundle.Magic), 2))
	f.Add(hdr([]byte{0x80, 0x00}, uv(2), uv(0), []byte("{}")))
	f.Add(hdr(uv(0), uv(bundle.MaxBytes+1), uv(0)))
	f.Add(hdr(uv(0), uv(0), uv(bundle.MaxAssets+1)))
	f.Add(hdr(uv(0), uv(0), uv(1<<63)))
	f.Add(hdr(uv(0), uv(0), uv(2), uv(1), []byte("b"), uv(0), uv(1), []byte("a"), uv(0)))
	f.Add(hdr(uv(0), uv(0), uv(1), uv(4), []byte("../a"), uv(0)))
	f.Add(hdr(uv(1<<62), uv(0), uv(0)))
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := bundle.Decode(data)
		if err != nil {
			if b != nil {
				t.Fatal("DecodeBundle returned a bundle with an error")
			}
			return
		}
		checkInside(t, data, b)
		if enc := b.Encode(); !bytes.Equal(enc, data) {
			at := 0
			for at < min(len(enc), len(data)) && enc[at] == data[at] {
				at++
			}
			t.Fatalf("re-encoding changed the bytes: %d bytes decoded, %d encoded, first difference at byte %d "+
				"(name %q, scene of %d bytes, assets %v)", len(data), len(enc), at, b.Name, len(b.Scene), slices.Sorted(maps.Keys(b.Assets)))
		}
		for n := range b.Assets {
			if err := bundle.CheckAssetName(n); err != nil {
				t.Fatalf("accepted asset name: %v", err)
			}
		}
		_ = b.Version()
		_, _, _ = kinds.Check(b)
	})
}

// checkInside asserts that the scene and every asset of b are full-capacity slices of data that
// do not overlap, and that they and the header account for every byte of data.
func checkInside(t *testing.T, data []byte, b *bundle.Bundle) {
	t.Helper()
	type span struct {
		what       string
		start, end int
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(data)))
	var spans []span
	content := 0
	add := func(what string, s []byte) {
		if cap(s) != len(s) {
			t.Fatalf("%s: capacity %d beyond its length %d: an append would overwrite what follows it", what, cap(s), len(s))
		}
		content += len(s)
		if len(s) == 0 {
			return // a zero-capacity slice points nowhere in particular
		}
		p := uintptr(unsafe.Pointer(unsafe.SliceData(s)))
		if p < base || p-base > uintptr(len(data)) || uintptr(len(s)) > uintptr(len(data))-(p-base) {
			t.Fatalf("%s (%d bytes) reaches outside the %d bytes decoded", what, len(s), len(data))
		}
		spans = append(spans, span{what, int(p - base), int(p-base) + len(s)})
	}
	add("scene", b.Scene)
	for _, n := range slices.Sorted(maps.Keys(b.Assets)) {
		add("asset "+n, b.Assets[n])
	}
	slices.SortFunc(spans, func(x, y span) int { return x.start - y.start })
	for i := 1; i < len(spans); i++ {
		if spans[i].start < spans[i-1].end {
			t.Fatalf("%s [%d,%d) overlaps %s [%d,%d)", spans[i].what, spans[i].start, spans[i].end,
				spans[i-1].what, spans[i-1].start, spans[i-1].end)
		}
	}
	if len(spans) > 0 && spans[len(spans)-1].end != len(data) {
		t.Fatalf("content ends at %d, data at %d: trailing bytes were accepted", spans[len(spans)-1].end, len(data))
	}
	if header := len(bundle.Magic) + 1; content > len(data)-header {
		t.Fatalf("%d content bytes in %d bytes of data", content, len(data))
	}
}
