package blender_test

import (
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/tilefarm/tilefarm/blender"
	"github.com/tilefarm/tilefarm/blender/blendertest"
)

// Property: the version that saved a .blend is read from its header in either layout (12
// bytes before 5.0, 17 from 5.0), plain or inside a gzip or zstd stream; anything else is an
// ErrScene naming the file.
func TestFileVersionReadsEveryHeader(t *testing.T) {
	dir := t.TempDir()
	gz := func(b []byte) []byte {
		var buf bytes.Buffer
		w := gzip.NewWriter(&buf)
		w.Write(b)
		w.Close()
		return buf.Bytes()
	}
	zs := func(b []byte) []byte {
		w, _ := zstd.NewWriter(nil)
		return w.EncodeAll(b, nil)
	}
	body := bytes.Repeat([]byte("REND\x00\x00\x00\x00"), 64)
	h := func(s string) []byte { return append([]byte(s), body...) }
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"3.4 plain", h("BLENDER-v304"), "3.4"},
		{"2.93 32-bit big-endian", h("BLENDER_V293"), "2.93"},
		{"4.2 gzip", gz(h("BLENDER-v402")), "4.2"},
		{"4.5 zstd", zs(h("BLENDER-v405")), "4.5"},
		{"5.0 plain", h("BLENDER17-01v0500"), "5.0"},
		{"5.0 zstd", zs(h("BLENDER17-01v0500")), "5.0"},
		{"5.1 zstd", zs(h("BLENDER17-01v0501")), "5.1"},
		{"not a blend", []byte("PNG\x89 not a blend at all"), ""},
		{"empty", nil, ""},
		{"truncated header", []byte("BLENDER-v3"), ""},
		{"unknown layout", h("BLENDER99-01v0500"), ""},
		{"zstd of garbage", zs([]byte("hello")), ""},
		{"broken zstd", []byte{0x28, 0xb5, 0x2f, 0xfd, 1, 2, 3}, ""},
	} {
		p := filepath.Join(dir, "f.blend")
		if err := os.WriteFile(p, tc.data, 0o644); err != nil {
			t.Fatal(err)
		}
		v, err := blender.FileVersion(p)
		if tc.want == "" {
			if !errors.Is(err, blender.ErrScene) {
				t.Errorf("%s: %v, %v; want an ErrScene", tc.name, v, err)
			}
			continue
		}
		if err != nil || v.String() != tc.want {
			t.Errorf("%s: %v, %v; want %s", tc.name, v, err, tc.want)
		}
	}
	// The bundled examples, saved (zstd-compressed) by Blender 3.4.
	for _, p := range []string{blendertest.Example(t), blendertest.Plate(t)} {
		if v, err := blender.FileVersion(p); err != nil || v.String() != "3.4" {
			t.Errorf("%s: %v, %v; want 3.4", filepath.Base(p), v, err)
		}
	}
}

// FuzzFileVersion: no header, however broken, makes FileVersion panic; what it accepts is a
// version of two numbers.
func FuzzFileVersion(f *testing.F) {
	f.Add([]byte("BLENDER-v304REND"))
	f.Add([]byte("BLENDER17-01v0500REND"))
	f.Add([]byte{0x28, 0xb5, 0x2f, 0xfd, 0, 0})
	f.Add([]byte{0x1f, 0x8b, 8, 0})
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(dir, "f.blend")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		v, err := blender.FileVersion(p)
		if err != nil && !errors.Is(err, blender.ErrScene) {
			t.Fatalf("error %v is not an ErrScene", err)
		}
		if err == nil && v.IsZero() {
			t.Fatal("accepted a header of version 0.0")
		}
	})
}
