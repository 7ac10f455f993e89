package finalize

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ExpandPattern replaces every run of '#' in pattern with the frame number,
// zero-padded to the run's width ("shot_####.png", 7 -> "shot_0007.png"); a
// number wider than the run is written in full. A pattern without '#' is
// returned unchanged: refusing it for multi-frame renders is the caller's job.
func ExpandPattern(pattern string, frame int) (string, error) {
	if pattern == "" {
		return "", errors.New("expanding output pattern: empty pattern")
	}
	if frame < 0 {
		return "", fmt.Errorf("expanding output pattern %q: negative frame %d", pattern, frame)
	}
	var b strings.Builder
	for i := 0; i < len(pattern); {
		if pattern[i] != '#' {
			b.WriteByte(pattern[i])
			i++
			continue
		}
		j := i
		for j < len(pattern) && pattern[j] == '#' {
			j++
		}
		fmt.Fprintf(&b, "%0*d", j-i, frame)
		i = j
	}
	return b.String(), nil
}

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
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("writing %q: %w", path, err)
	}
	return nil
}
