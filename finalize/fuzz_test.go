package finalize

import (
	"encoding/json"
	"github.com/tilefarm/tilefarm/objstore"
	"maps"
	"slices"
	"testing"
)

// FuzzParseManifest: the manifest parser ReadManifest uses never panics on what a store holds;
// a manifest it accepts names each object once, with a valid key, a size and a 64-character
// sha256, and re-marshals (as Promote writes it, and compactly) to JSON that parses again to
// the same manifest: same Key, Checksum, objects, build, attempt and meta.
func FuzzParseManifest(f *testing.F) {
	sum := hexSHA256([]byte("tile"))
	good, err := newManifest("tiles/fk/tk", "attempt1", "go1.26 amd64 v1",
		[]Output{{Name: "rgb.f32", Data: []byte("tile")}, {Name: "frame.png", Data: nil}}, map[string]string{"w": "4"})
	if err != nil {
		f.Fatal(err)
	}
	body, err := json.MarshalIndent(good, "", "  ")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(append(body, '\n'))
	compact, _ := json.Marshal(good)
	f.Add(compact)
	f.Add([]byte(`{"key":"k","objects":[{"name":"a","key":"attempts/k/a1/a","size":0,"sha256":"` + sum + `"}],"build":"","attempt":"a1"}`))
	f.Add([]byte(`{"key":"k","objects":[{"name":"a","key":"x/../y","size":1,"sha256":"` + sum + `"}]}`))
	f.Add([]byte(`{"key":"k","objects":[{"name":"a","key":"a","size":-1,"sha256":"` + sum + `"}]}`))
	f.Add([]byte(`{"key":"k","objects":[{"name":"a","key":"a","size":1e400,"sha256":"` + sum + `"}]}`))
	f.Add([]byte(`{"key":"k","objects":[{"name":"a","key":"a","size":1,"sha256":"00"}]}`))
	f.Add([]byte(`{"key":"k","objects":[],"meta":{}}`))
	f.Add([]byte(`{"KEY":"k","Objects":[{"name":"\u0000","key":"a\u00e9/b","size":9223372036854775807,"sha256":"` + sum + `"}],"meta":{"":""},"key":"k2"}`))
	f.Add([]byte(`{"key":"\xff","objects":[{"name":"\xfe","key":"a","size":1,"sha256":"` + sum + `"}]}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"key":"k","objects":null}`))
	f.Add([]byte(`{"key":"k","objects":[{}]}`))
	// The same name twice, with other checksums: ambiguous, so refused (found by this fuzzer).
	f.Add([]byte(`{"key":"k","objects":[{"name":"a","key":"a","size":1,"sha256":"` + sum + `"},{"name":"a","key":"b","size":1,"sha256":"` + hexSHA256(nil) + `"}]}`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := parseManifest(data)
		if err != nil {
			return
		}
		if len(m.Objects) == 0 {
			t.Fatal("accepted a manifest naming no objects")
		}
		names := map[string]bool{}
		for _, o := range m.Objects {
			if names[o.Name] {
				t.Fatalf("accepted a manifest naming object %q twice", o.Name)
			}
			names[o.Name] = true
			if err := objstore.ValidateKey(o.Key); err != nil {
				t.Fatalf("accepted object %q with key %q: %v", o.Name, o.Key, err)
			}
			if len(o.SHA256) != 64 || o.Size < 0 {
				t.Fatalf("accepted object %q with size %d, sha256 %q", o.Name, o.Size, o.SHA256)
			}
		}
		indented, err := json.MarshalIndent(m, "", "  ")
		if err != nil {
			t.Fatalf("re-marshalling an accepted manifest: %v", err)
		}
		compact, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("re-marshalling an accepted manifest: %v", err)
		}
		for _, enc := range [][]byte{append(indented, '\n'), compact} {
			back, err := parseManifest(enc)
			if err != nil {
				t.Fatalf("re-marshalled manifest does not parse: %v\n%s", err, enc)
			}
			if back.Key != m.Key || back.Checksum() != m.Checksum() {
				t.Fatalf("round trip changed key %q -> %q or checksum %s -> %s", m.Key, back.Key, m.Checksum(), back.Checksum())
			}
			if !slices.Equal(back.Objects, m.Objects) || back.Build != m.Build || back.Attempt != m.Attempt ||
				!maps.Equal(back.Meta, m.Meta) {
				t.Fatalf("round trip changed the manifest:\n got %+v\nwant %+v", back, m)
			}
			if !sameContent(back, m) {
				t.Fatal("round trip changed the manifest's content (sameContent)")
			}
		}
	})
}
