package platform

import (
	"fmt"
	"os"
	"testing"
)

// FreeBytes answers for a real directory and fails, naming it, for one that is not there.
func TestFreeBytes(t *testing.T) {
	if free, err := FreeBytes(t.TempDir()); err != nil || free == 0 {
		t.Fatalf("FreeBytes of a temporary directory = %d, %v", free, err)
	}
	if _, err := FreeBytes("/no/such/dir/here"); err == nil {
		t.Fatal("FreeBytes of a missing directory succeeded")
	}
}

// DiskFull knows a full disk's error when it is wrapped, and nothing else.
func TestDiskFull(t *testing.T) {
	if DiskFull(fmt.Errorf("writing: %w", os.ErrNotExist)) || DiskFull(nil) {
		t.Fatal("DiskFull said yes to what is no full disk")
	}
	if !DiskFull(fmt.Errorf("writing: %w", &os.PathError{Op: "write", Path: "x", Err: diskFullErr})) {
		t.Fatal("DiskFull missed a wrapped full-disk error")
	}
}
