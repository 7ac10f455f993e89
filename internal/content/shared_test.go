package content

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseSharedRoot(t *testing.T) {
	tests := []struct {
		in      string
		want    SharedRoot
		wantErr bool
	}{
		{"/mnt/p=/srv/p", SharedRoot{"/mnt/p", "/srv/p"}, false},
		{`S:\proj=/mnt/proj`, SharedRoot{`S:\proj`, "/mnt/proj"}, false},
		{`\\srv\share=/mnt/s`, SharedRoot{`\\srv\share`, "/mnt/s"}, false},
		{`S:\proj=D:\mnt\proj`, SharedRoot{`S:\proj`, `D:\mnt\proj`}, false},
		{"/mnt/p=/srv/a=b", SharedRoot{"/mnt/p", "/srv/a=b"}, false},
		{"/mnt/p", SharedRoot{}, true},
		{"=/srv/p", SharedRoot{}, true},
		{"/mnt/p=", SharedRoot{}, true},
		{"=", SharedRoot{}, true},
		{"", SharedRoot{}, true},
	}
	for _, tt := range tests {
		got, err := ParseSharedRoot(tt.in)
		if tt.wantErr {
			if err == nil {
				t.Errorf("ParseSharedRoot(%q) = %+v, want an error", tt.in, got)
			} else if !strings.Contains(err.Error(), `"`+tt.in+`"`) {
				t.Errorf("ParseSharedRoot(%q) error %q does not name the value", tt.in, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseSharedRoot(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
	}
}

func TestSharedRootResolve(t *testing.T) {
	local := t.TempDir()
	s := SharedRoot{Root: `S:\proj`, Local: local}
	good := []struct{ rel, want string }{
		{"tex/wood.exr", filepath.Join(local, "tex", "wood.exr")},
		{"scene.blend", filepath.Join(local, "scene.blend")},
		{"a..b/c", filepath.Join(local, "a..b", "c")},
	}
	for _, tt := range good {
		if got, err := s.Resolve(tt.rel); err != nil || got != tt.want {
			t.Errorf("Resolve(%q) = %q, %v; want %q", tt.rel, got, err, tt.want)
		}
	}
	for _, rel := range []string{"../x", "a/../../x", "a/..", "..", "/abs", "/etc/passwd", `C:\x`, `tex\wood.exr`, `..\x`, "", ".", "./a", "a//b", "a/", "a\x00b"} {
		if got, err := s.Resolve(rel); err == nil {
			t.Errorf("Resolve(%q) = %q, want an error", rel, got)
		}
	}
	if _, err := (SharedRoot{Root: "/mnt/p"}).Resolve("a"); err == nil {
		t.Error("Resolve with no Local = nil error")
	}
}

func TestVerifyShared(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	data := pattern(30000, 11)
	ref := refOf(data)

	t.Run("ok", func(t *testing.T) {
		p := writeFile(t, dir, "ok.exr", data)
		for range 2 {
			if err := VerifyShared(ctx, p, ref); err != nil {
				t.Fatal(err)
			}
		}
	})
	t.Run("changed size", func(t *testing.T) {
		p := writeFile(t, dir, "size.exr", data[:29000])
		err := VerifyShared(ctx, p, ref)
		if !errors.Is(err, ErrSharedChanged) {
			t.Fatalf("VerifyShared = %v, want ErrSharedChanged", err)
		}
		for _, want := range []string{p, "changed since submit", "size", "30000", "29000"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
		}
	})
	t.Run("same size changed bytes", func(t *testing.T) {
		p := writeFile(t, dir, "bytes.exr", data)
		if err := VerifyShared(ctx, p, ref); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, pattern(30000, 12), 0o644); err != nil {
			t.Fatal(err)
		}
		// Move the mtime forward so it surely differs from the one remembered.
		later := time.Now().Add(time.Hour)
		if err := os.Chtimes(p, later, later); err != nil {
			t.Fatal(err)
		}
		err := VerifyShared(ctx, p, ref)
		if !errors.Is(err, ErrSharedChanged) {
			t.Fatalf("VerifyShared = %v, want ErrSharedChanged", err)
		}
		for _, want := range []string{p, "changed since submit", "sha256", ref.SHA256, refOf(pattern(30000, 12)).SHA256} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
		}
	})
	t.Run("hashed once while unchanged", func(t *testing.T) {
		p := writeFile(t, dir, "memo.exr", data)
		if err := VerifyShared(ctx, p, ref); err != nil {
			t.Fatal(err)
		}
		// Other bytes of the same size under the same modification time: a hash would see
		// them, so only the memo can answer (it keys a verified file by path, size and mtime;
		// a chmod 0 would not stop root, which CI runs as).
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, pattern(len(data), 99), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, fi.ModTime(), fi.ModTime()); err != nil {
			t.Fatal(err)
		}
		if err := VerifyShared(ctx, p, ref); err != nil {
			t.Errorf("VerifyShared of an unchanged verified file = %v, want it remembered", err)
		}
		// Another ref for the same path is not answered by the memo.
		if err := VerifyShared(ctx, p, Ref{SHA256: refOf(pattern(30000, 13)).SHA256, Size: ref.Size}); err == nil {
			t.Error("VerifyShared with another hash = nil error")
		}
	})
	t.Run("missing", func(t *testing.T) {
		p := filepath.Join(dir, "missing.exr")
		err := VerifyShared(ctx, p, ref)
		if err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("VerifyShared(missing) = %v, want an error naming %s", err, p)
		}
	})
	t.Run("bad ref", func(t *testing.T) {
		p := writeFile(t, dir, "bad.exr", data)
		if err := VerifyShared(ctx, p, Ref{SHA256: "nope", Size: ref.Size}); err == nil {
			t.Error("VerifyShared with a bad ref = nil error")
		}
	})
}

// A mount serves the share a submitter named by the same root, Windows' roots compared as
// Windows compares them.
func TestSharedRootMounts(t *testing.T) {
	for _, c := range []struct {
		root, named string
		want        bool
	}{
		{"/mnt/proj", "/mnt/proj", true},
		{"/mnt/proj/", "/mnt/proj", true},
		{"/mnt/proj", "/mnt/project", false},
		{"/mnt/proj", "/MNT/proj", false},
		{`S:\proj`, `s:\Proj\`, true},
		{`S:\proj`, `S:/proj`, true},
		{`S:\proj`, `T:\proj`, false},
		{`\\srv\share`, `\\SRV\share`, true},
	} {
		if got := (SharedRoot{Root: c.root, Local: "/x"}).Mounts(c.named); got != c.want {
			t.Errorf("root %q mounts %q = %v, want %v", c.root, c.named, got, c.want)
		}
	}
}
