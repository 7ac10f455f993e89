package objstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/tilefarm/tilefarm/internal/platform"
)

// FSStore is a Store on a local directory: the single-machine default. Objects
// are files under the root named by their keys; writes go through a temporary
// file in the same directory so a reader never sees a half-written object.
type FSStore struct {
	root string
}

var _ Store = (*FSStore)(nil)

// NewFSStore opens (creating if needed) a filesystem store rooted at dir.
func NewFSStore(dir string) (*FSStore, error) {
	if dir == "" {
		return nil, errors.New("filesystem store: empty directory")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("filesystem store %q: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("creating filesystem store %q: %w", abs, err)
	}
	return &FSStore{root: abs}, nil
}

// Root returns the store's root directory.
func (s *FSStore) Root() string { return s.root }

func (s *FSStore) path(key string) string {
	return filepath.Join(s.root, filepath.FromSlash(key))
}

// copyBufSize is the buffer PutStream copies through: a few syscalls per MiB, and the only
// memory an upload of any size holds.
const copyBufSize = 1 << 20

// Put writes data to a temporary file, syncs it and renames it over key.
func (s *FSStore) Put(ctx context.Context, key string, data []byte) error {
	return s.replace(ctx, key, writeBytes(data))
}

// PutStream copies r to a temporary file through a buffer of copyBufSize, checking ctx and
// the byte count as it goes (sizedReader), then syncs it and renames it over key as Put does:
// a failed, short, long or cancelled stream removes the temporary file and leaves key as it was.
func (s *FSStore) PutStream(ctx context.Context, key string, r io.Reader, size int64) error {
	if size < 0 {
		return fmt.Errorf("putting %q: negative size %d", key, size)
	}
	return s.replace(ctx, key, func(w io.Writer) error {
		// The file's ReadFrom is hidden so that io.CopyBuffer copies through this buffer and
		// not one of ReadFrom's own.
		buf := make([]byte, copyBufSize)
		_, err := io.CopyBuffer(struct{ io.Writer }{w}, newSizedReader(ctx, r, size), buf)
		return err
	})
}

// replace is Put and PutStream: write fills a synced temporary file beside key's, which is
// then renamed over it, so the object changes whole or not at all.
func (s *FSStore) replace(ctx context.Context, key string, write func(io.Writer) error) error {
	if err := ValidateKey(key); err != nil {
		return fmt.Errorf("putting %q: %w", key, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("putting %q: %w", key, err)
	}
	final := s.path(key)
	tmp, err := s.writeTemp(final, write)
	if err != nil {
		return fmt.Errorf("putting %q: %w", key, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("putting %q: %w", key, err)
	}
	if err := platform.SyncDir(filepath.Dir(final)); err != nil {
		return fmt.Errorf("putting %q: %w", key, err)
	}
	return nil
}

// PutIfAbsent writes data to a temporary file and hard-links it to key: the
// link either creates the complete object atomically or fails with EEXIST.
func (s *FSStore) PutIfAbsent(ctx context.Context, key string, data []byte) error {
	if err := ValidateKey(key); err != nil {
		return fmt.Errorf("creating %q: %w", key, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("creating %q: %w", key, err)
	}
	final := s.path(key)
	tmp, err := s.writeTemp(final, writeBytes(data))
	if err != nil {
		return fmt.Errorf("creating %q: %w", key, err)
	}
	linkErr := os.Link(tmp, final)
	os.Remove(tmp)
	if linkErr != nil {
		if errors.Is(linkErr, fs.ErrExist) {
			return fmt.Errorf("creating %q: %w", key, ErrExists)
		}
		return fmt.Errorf("creating %q: %w", key, linkErr)
	}
	if err := platform.SyncDir(filepath.Dir(final)); err != nil {
		return fmt.Errorf("creating %q: %w", key, err)
	}
	return nil
}

// writeBytes is the write of writeTemp that writes data.
func writeBytes(data []byte) func(io.Writer) error {
	return func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	}
}

// writeTemp creates a temporary file beside final, has write fill it, syncs it and returns
// its path; if write fails, the file is removed. It retries when a concurrent Delete pruned
// the parent directory between creating it and creating the file.
func (s *FSStore) writeTemp(final string, write func(io.Writer) error) (string, error) {
	dir := filepath.Dir(final)
	var f *os.File
	var err error
	for range 5 {
		if err = os.MkdirAll(dir, 0o755); err != nil {
			return "", err
		}
		f, err = os.CreateTemp(dir, tempPrefix+"*")
		if err == nil || !errors.Is(err, fs.ErrNotExist) {
			break
		}
	}
	if err != nil {
		return "", err
	}
	name := f.Name()
	if err := write(f); err != nil {
		f.Close()
		os.Remove(name)
		return "", err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(name)
		return "", err
	}
	if err := f.Close(); err != nil {
		os.Remove(name)
		return "", err
	}
	if err := os.Chmod(name, 0o644); err != nil {
		os.Remove(name)
		return "", err
	}
	return name, nil
}

// Get reads the object stored under key.
func (s *FSStore) Get(ctx context.Context, key string) ([]byte, error) {
	if err := ValidateKey(key); err != nil {
		return nil, fmt.Errorf("getting %q: %w", key, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("getting %q: %w", key, err)
	}
	data, err := os.ReadFile(s.path(key))
	if err != nil {
		if isMissing(err) {
			return nil, fmt.Errorf("getting %q: %w", key, ErrNotFound)
		}
		return nil, fmt.Errorf("getting %q: %w", key, err)
	}
	return data, nil
}

// Open opens the file of key. Reads fail once ctx is done, and see the object as it was when
// opened: a Put or PutStream renames a new file over the key and leaves this one whole.
func (s *FSStore) Open(ctx context.Context, key string) (io.ReadCloser, ObjectInfo, error) {
	if err := ValidateKey(key); err != nil {
		return nil, ObjectInfo{}, fmt.Errorf("opening %q: %w", key, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, ObjectInfo{}, fmt.Errorf("opening %q: %w", key, err)
	}
	f, err := os.Open(s.path(key))
	if err != nil {
		if isMissing(err) {
			return nil, ObjectInfo{}, fmt.Errorf("opening %q: %w", key, ErrNotFound)
		}
		return nil, ObjectInfo{}, fmt.Errorf("opening %q: %w", key, err)
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = errIsDir
	}
	if err != nil {
		f.Close()
		if isMissing(err) {
			return nil, ObjectInfo{}, fmt.Errorf("opening %q: %w", key, ErrNotFound)
		}
		return nil, ObjectInfo{}, fmt.Errorf("opening %q: %w", key, err)
	}
	return &ctxReader{ctx: ctx, ReadCloser: f}, ObjectInfo{Key: key, Size: fi.Size(), ModTime: fi.ModTime()}, nil
}

// isMissing reports whether a filesystem error means "no such object":
// absent, a directory (a key prefix), or a path through a regular file.
func isMissing(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, errIsDir) ||
		errors.Is(err, syscall.EISDIR) || errors.Is(err, syscall.ENOTDIR)
}

var errIsDir = errors.New("is a directory")

// Stat returns the size and modification time of key.
func (s *FSStore) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	if err := ValidateKey(key); err != nil {
		return ObjectInfo{}, fmt.Errorf("stat %q: %w", key, err)
	}
	if err := ctx.Err(); err != nil {
		return ObjectInfo{}, fmt.Errorf("stat %q: %w", key, err)
	}
	fi, err := os.Stat(s.path(key))
	if err == nil && !fi.Mode().IsRegular() {
		err = errIsDir
	}
	if err != nil {
		if isMissing(err) {
			return ObjectInfo{}, fmt.Errorf("stat %q: %w", key, ErrNotFound)
		}
		return ObjectInfo{}, fmt.Errorf("stat %q: %w", key, err)
	}
	return ObjectInfo{Key: key, Size: fi.Size(), ModTime: fi.ModTime()}, nil
}

// List walks the directory holding prefix and returns the matching objects,
// skipping temporary files and tolerating objects deleted during the walk.
func (s *FSStore) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	if err := validatePrefix(prefix); err != nil {
		return nil, fmt.Errorf("listing %q: %w", prefix, err)
	}
	start := s.root
	if i := strings.LastIndex(prefix, "/"); i >= 0 {
		start = s.path(prefix[:i])
	}
	var out []ObjectInfo
	err := filepath.WalkDir(start, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
				return nil
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		if strings.HasPrefix(d.Name(), tempPrefix) || !d.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(s.root, p)
		if err != nil {
			return err
		}
		key := filepath.ToSlash(rel)
		if !strings.HasPrefix(key, prefix) {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		out = append(out, ObjectInfo{Key: key, Size: fi.Size(), ModTime: fi.ModTime()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing %q: %w", prefix, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// Delete removes key and then prunes parent directories left empty, so that
// garbage collection does not leave a tree of empty attempt directories.
func (s *FSStore) Delete(ctx context.Context, key string) error {
	if err := ValidateKey(key); err != nil {
		return fmt.Errorf("deleting %q: %w", key, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("deleting %q: %w", key, err)
	}
	p := s.path(key)
	if fi, err := os.Lstat(p); err == nil && fi.IsDir() {
		return nil // a key prefix, not an object
	}
	if err := os.Remove(p); err != nil && !isMissing(err) {
		return fmt.Errorf("deleting %q: %w", key, err)
	}
	for dir := filepath.Dir(p); dir != s.root && strings.HasPrefix(dir, s.root+string(filepath.Separator)); dir = filepath.Dir(dir) {
		if os.Remove(dir) != nil {
			break // not empty, or already gone
		}
	}
	return nil
}
