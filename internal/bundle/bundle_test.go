package bundle_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tilefarm/tilefarm/internal/bundle"
)

// A manifest names each file by content: one byte of one file changed gives a new version,
// the same files read from disk and from memory give the same one, and the encoding round
// trips byte for byte.
func TestManifestByContent(t *testing.T) {
	dir := t.TempDir()
	files := map[string][]byte{"tex/wood.png": []byte("wood"), "meshes/a.obj": []byte("v 0 0 0\n"), "b": nil}
	var names []string
	for n, data := range files {
		p := filepath.Join(dir, filepath.FromSlash(n))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		names = append(names, n)
	}
	path := func(n string) string { return filepath.Join(dir, filepath.FromSlash(n)) }
	disk, err := bundle.FromFiles(t.Context(), "s.json", []byte("{}"), names, path)
	if err != nil {
		t.Fatal(err)
	}
	mem := bundle.FromMemory("s.json", []byte("{}"), files)
	if disk.Version() != mem.Version() || !bytes.Equal(disk.Encode(), mem.Encode()) {
		t.Fatalf("the same files from disk and from memory: %s and %s", disk.Encode(), mem.Encode())
	}
	back, err := bundle.Decode(disk.Encode(), bundle.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if back.Version() != disk.Version() {
		t.Fatal("the decoded manifest has another version")
	}
	if _, err := back.Open(t.Context(), "b"); !errors.Is(err, bundle.ErrMissing) {
		t.Fatalf("a decoded manifest has no content: %v, want ErrMissing", err)
	}
	r, err := disk.Open(t.Context(), "tex/wood.png")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(r)
	r.Close()
	if string(got) != "wood" {
		t.Fatalf("read %q back from disk", got)
	}
	if err := os.WriteFile(path("tex/wood.png"), []byte("Wood"), 0o644); err != nil {
		t.Fatal(err)
	}
	changed, err := bundle.FromFiles(t.Context(), "s.json", []byte("{}"), names, path)
	if err != nil {
		t.Fatal(err)
	}
	if changed.Version() == disk.Version() {
		t.Fatal("one byte of one file changed and the version did not")
	}
	if _, err := bundle.FromFiles(t.Context(), "s.json", []byte("{}"), []string{"nope"}, path); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("a missing file: %v, want an error naming it", err)
	}
}

// Share marks the files under the share's root as travelling by it, by their path under it,
// which changes the version (a worker reads them elsewhere); the rest stay uploaded.
func TestShare(t *testing.T) {
	root, other := t.TempDir(), t.TempDir()
	onShare := filepath.Join(root, "proj", "tex.png")
	if err := os.MkdirAll(filepath.Dir(onShare), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{onShare, filepath.Join(other, "local.png")} {
		if err := os.WriteFile(p, []byte(p), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	paths := map[string]string{"tex.png": onShare, "local.png": filepath.Join(other, "local.png")}
	b, err := bundle.FromFiles(context.Background(), "s", nil, []string{"tex.png", "local.png"}, func(n string) string { return paths[n] })
	if err != nil {
		t.Fatal(err)
	}
	before := b.Version()
	n, err := b.Share(root)
	if err != nil || n != 1 {
		t.Fatalf("Share: %d files, %v; want 1", n, err)
	}
	if b.SharedRoot != root {
		t.Fatalf("the manifest's share root %q, want %q", b.SharedRoot, root)
	}
	if back, err := bundle.Decode(b.Encode(), bundle.DefaultLimits); err != nil || back.Version() != b.Version() {
		t.Fatalf("a manifest with a share does not round trip: %v", err)
	}
	if got := b.Files["tex.png"].Shared; got != "proj/tex.png" {
		t.Fatalf("the shared file's path under the root: %q", got)
	}
	if b.Files["local.png"].Shared != "" {
		t.Fatal("a file off the share was marked shared")
	}
	if b.Version() == before {
		t.Fatal("marking a file shared kept the version")
	}
	if _, total := b.Bytes(); total != int64(len(onShare)) {
		t.Fatalf("shared bytes %d", total)
	}
	if _, err := bundle.FromMemory("s", nil, nil).Share(root); err == nil {
		t.Fatal("a bundle from memory named files on a share")
	}
	if _, err := b.Share(filepath.Join(root, "nope")); err == nil {
		t.Fatal("a share root that is no directory was accepted")
	}
}

// Decode refuses what a manifest must never be, each with a clear error.
func TestDecodeRefuses(t *testing.T) {
	h := strings.Repeat("a", 64)
	ok := bundle.FromMemory("s", []byte("{}"), map[string][]byte{"a": {1}}).Encode()
	for name, c := range map[string]struct {
		data   string
		limits bundle.Limits
		want   string
	}{
		"not json":        {"garbage", bundle.DefaultLimits, "bad scene manifest"},
		"old format":      {`{"format":"tilefarm-scene/1","name":"","scene":null,"files":{}}`, bundle.DefaultLimits, "format"},
		"unclean name":    {`{"format":"tilefarm-scene/2","name":"","scene":null,"files":{"../a":{"size":1,"sha256":"` + h + `"}}}`, bundle.DefaultLimits, "clean relative path"},
		"bad hash":        {`{"format":"tilefarm-scene/2","name":"","scene":null,"files":{"a":{"size":1,"sha256":"xyz"}}}`, bundle.DefaultLimits, "64 lowercase hex"},
		"negative size":   {`{"format":"tilefarm-scene/2","name":"","scene":null,"files":{"a":{"size":-1,"sha256":"` + h + `"}}}`, bundle.DefaultLimits, "size -1"},
		"too many files":  {string(ok), bundle.Limits{Files: 0}, "--max-scene-files"},
		"too many bytes":  {string(ok), bundle.Limits{Files: 10, Bytes: 0}, ""},
		"not canonical":   {strings.Replace(string(ok), `"format"`, ` "format"`, 1), bundle.DefaultLimits, "canonical"},
		"shared, no root": {`{"format":"tilefarm-scene/2","name":"","scene":null,"files":{"a":{"size":1,"sha256":"` + h + `","shared":"a"}}}`, bundle.DefaultLimits, "the share's root"},
		"root, no shared": {`{"format":"tilefarm-scene/2","name":"","scene":null,"files":{},"shared_root":"/mnt"}`, bundle.DefaultLimits, "the share's root"},
	} {
		_, err := bundle.Decode([]byte(c.data), c.limits)
		if c.want == "" {
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
			continue
		}
		if err == nil || !errors.Is(err, bundle.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrInvalid saying %q", name, err, c.want)
		}
	}
	big := bundle.FromMemory("s", nil, map[string][]byte{"a": make([]byte, 10)}).Encode()
	if _, err := bundle.Decode(big, bundle.Limits{Files: 10, Bytes: 5}); err == nil || !strings.Contains(err.Error(), "--max-scene-bytes") {
		t.Errorf("over the byte limit: %v", err)
	}
}
