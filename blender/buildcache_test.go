package blender_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tilefarm/tilefarm/blender"
	"github.com/tilefarm/tilefarm/blender/blendertest"
)

// Property: a pool whose machine asked its Blender before knows the build without starting
// one (no process runs after Build), and it is the build a Blender reports; another kernel cap
// is another key, which asks Blender again.
func TestBuildIsRememberedAcrossPools(t *testing.T) {
	cache := t.TempDir()
	bin := blendertest.Binary(t)
	pool := func(kernel string) *blender.Pool {
		p := blender.NewPool(blender.Options{Binary: bin, Dir: t.TempDir(), Kernel: kernel, BuildCache: cache})
		t.Cleanup(func() { p.Close() })
		return p
	}
	first := pool("")
	want, err := first.Build(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if n := len(first.IdlePIDs()); n != 1 {
		t.Fatalf("the first pool ran %d Blender processes to learn its build, want 1", n)
	}
	again := pool("")
	got, err := again.Build(t.Context())
	if err != nil || got != want {
		t.Fatalf("the second pool's build: %q (%v), want %q", got, err, want)
	}
	if n := len(again.IdlePIDs()); n != 0 {
		t.Fatalf("the second pool started %d Blender processes to learn a build remembered, want 0", n)
	}
	capped := pool("sse2")
	other, err := capped.Build(t.Context())
	if err != nil || other == want || !strings.Contains(other, "sse2") {
		t.Fatalf("the build capped at sse2: %q (%v), want another than %q", other, err, want)
	}
	if n := len(capped.IdlePIDs()); n != 1 {
		t.Fatalf("a pool of another kernel cap ran %d Blender processes, want 1", n)
	}
}

// Property: a remembered build that is not what the machine's Blender reports (a cache gone
// wrong) fails the first request to Blender with ErrProcess, retryable, and is forgotten, so the next start
// asks Blender again.
func TestWrongRememberedBuildIsForgotten(t *testing.T) {
	cache := t.TempDir()
	bin := blendertest.Binary(t)
	opts := blender.Options{Binary: bin, Dir: t.TempDir(), BuildCache: cache}
	learn := blender.NewPool(opts)
	if _, err := learn.Build(t.Context()); err != nil {
		t.Fatal(err)
	}
	learn.Close()
	files, err := filepath.Glob(filepath.Join(cache, "*.json"))
	if err != nil || len(files) != 1 {
		t.Fatalf("cache files: %v (%v), want one", files, err)
	}
	if err := os.WriteFile(files[0], []byte(`{"build":"blender/99.0.0 (none) cycles-cpu/none"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	pool := blender.NewPool(blender.Options{Binary: bin, Dir: t.TempDir(), BuildCache: cache})
	t.Cleanup(func() { pool.Close() })
	if b, err := pool.Build(t.Context()); err != nil || !strings.HasPrefix(b, "blender/99.0.0") {
		t.Fatalf("build %q (%v), want the one remembered", b, err)
	}
	if _, err := blender.Inspect(t.Context(), pool, blendertest.Example(t)); !errors.Is(err, blender.ErrProcess) {
		t.Fatalf("inspecting under a wrong remembered build: %v, want ErrProcess", err)
	}
	if _, err := os.Stat(files[0]); !os.IsNotExist(err) {
		t.Fatalf("the wrong build is still remembered (%v)", err)
	}
}

// Property: the Pythons of two virtual environments, one executable under two names, each
// with its own bpy, are two builds to the cache: each pool remembers its own line's.
func TestBuildOfEachBpyEnvironmentIsItsOwn(t *testing.T) {
	cache := t.TempDir()
	for range 2 { // the second round answers from the cache
		for _, line := range []blendertest.Line{blendertest.LineOf(t, "4.2"), blendertest.LineOf(t, "4.5")} {
			p := blender.NewPool(blender.Options{Binary: line.Binary, Dir: t.TempDir(), BuildCache: cache})
			b, err := p.Build(t.Context())
			p.Close()
			if err != nil || !strings.HasPrefix(b, "blender/"+line.Name+".") {
				t.Fatalf("the build of %s: %q (%v), want Blender %s's", line.Binary, b, err, line.Name)
			}
		}
	}
}
