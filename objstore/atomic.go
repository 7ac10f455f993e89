package objstore

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/tilefarm/tilefarm/internal/platform"
)

// WriteFileAtomic writes data to path through a temporary file in the same
// directory that is synced and then renamed over path, so a reader (or a
// crash) never leaves a half-written output behind.
func WriteFileAtomic(path string, data []byte) error { return WriteFileMode(path, data, 0o644) }

// WriteFileMode is WriteFileAtomic with the file's permissions: 0600 for a
// secret, which is never readable by others, not even for a moment.
func WriteFileMode(path string, data []byte, perm os.FileMode) error {
	dir, base := filepath.Split(path)
	if base == "" {
		return fmt.Errorf("writing %q: not a file name", path)
	}
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("writing %q: %w", path, err)
	}
	tmp := f.Name()
	fail := func(err error) error {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("writing %q: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := f.Chmod(perm); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %q: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %q: %w", path, err)
	}
	if err := platform.SyncDir(dir); err != nil {
		return fmt.Errorf("writing %q: %w", path, err)
	}
	return nil
}
