package finalize

import (
	"os"
	"path/filepath"
	"testing"
)

func TestExpandPattern(t *testing.T) {
	cases := []struct {
		pattern string
		frame   int
		want    string
	}{
		{"out/shot_####.png", 7, "out/shot_0007.png"},
		{"out/shot_####.png", 12345, "out/shot_12345.png"},
		{"f#.exr", 3, "f3.exr"},
		{"f#.exr", 0, "f0.exr"},
		{"a_##/b_######.png", 42, "a_42/b_000042.png"},
		{"still.png", 9, "still.png"},
		{"####", 1, "0001"},
	}
	for _, c := range cases {
		got, err := ExpandPattern(c.pattern, c.frame)
		if err != nil || got != c.want {
			t.Errorf("ExpandPattern(%q, %d) = %q, %v; want %q", c.pattern, c.frame, got, err, c.want)
		}
	}
	if _, err := ExpandPattern("", 1); err == nil {
		t.Error("empty pattern accepted")
	}
	if _, err := ExpandPattern("x_##.png", -1); err == nil {
		t.Error("negative frame accepted")
	}
}

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
