package objstore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFSStoreTempFiles checks that temporary files are never listed as
// objects and that writes leave none behind.
func TestFSStoreTempFiles(t *testing.T) {
	ctx := context.Background()
	s, err := NewFSStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "a/b", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := s.PutIfAbsent(ctx, "a/c", []byte("y")); err != nil {
		t.Fatal(err)
	}
	if err := s.PutIfAbsent(ctx, "a/c", []byte("z")); !errors.Is(err, ErrExists) {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(filepath.Join(s.Root(), "a"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if strings.Join(names, ",") != "b,c" {
		t.Fatalf("directory holds %v, want only b and c", names)
	}
	// A temp file left by a crash mid-write is invisible.
	if err := os.WriteFile(filepath.Join(s.Root(), "a", tempPrefix+"123"), []byte("half"), 0o644); err != nil {
		t.Fatal(err)
	}
	objs, err := s.List(ctx, "a/")
	if err != nil || len(objs) != 2 {
		t.Fatalf("List = %v, %v; want the two objects only", objs, err)
	}
	if _, err := s.Get(ctx, "a/"+tempPrefix+"123"); !errors.Is(err, ErrBadKey) {
		t.Fatalf("Get of a temp file = %v, want ErrBadKey", err)
	}
}

// TestFSStoreDeletePrunesDirs checks that deleting the last object of a
// directory removes the empty directories up to, not including, the root.
func TestFSStoreDeletePrunesDirs(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s, err := NewFSStore(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"attempts/t/a1/rgb", "attempts/u/a1/rgb"} {
		if err := s.Put(ctx, k, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Delete(ctx, "attempts/t/a1/rgb"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "attempts", "t")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("empty directory attempts/t left behind: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "attempts", "u", "a1", "rgb")); err != nil {
		t.Fatalf("sibling object lost: %v", err)
	}
	if err := s.Delete(ctx, "attempts/u/a1/rgb"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(root); err != nil {
		t.Fatalf("store root removed: %v", err)
	}
	if err := s.Put(ctx, "attempts/t/a2/rgb", []byte("again")); err != nil {
		t.Fatalf("Put after pruning: %v", err)
	}
}
