package objstore

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "frame_0001.png")
	for _, content := range []string{"first version", "second, longer version of the file"} {
		if err := WriteFileAtomic(p, []byte(content)); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p)
		if err != nil || string(got) != content {
			t.Fatalf("read back %q, %v", got, err)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 || entries[0].Name() != "frame_0001.png" {
		t.Fatalf("directory holds %v, want only the output", entries)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v", fi.Mode())
	}
	// A failed write leaves nothing behind.
	if err := WriteFileAtomic(filepath.Join(dir, "missing", "x.png"), []byte("x")); err == nil {
		t.Fatal("write into a missing directory succeeded")
	}
	sub := filepath.Join(dir, "adir")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(sub, []byte("x")); err == nil {
		t.Fatal("rename over a directory succeeded")
	}
	entries, _ = os.ReadDir(dir)
	if len(entries) != 2 {
		t.Fatalf("failed writes left files: %v", entries)
	}
}
