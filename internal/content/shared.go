package content

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// SharedRoot maps a studio share as the submitter saw it (Root, e.g. "/mnt/proj" or `S:\proj`
// or `\\server\share\proj`) to this machine's mount of it (Local), so a job may name files on
// the share by a path relative to its root and each node reads them where it mounts it,
// instead of fetching them.
type SharedRoot struct{ Root, Local string }

// ParseSharedRoot parses a tileworker --shared flag value "ROOT=PATH". It splits at the first
// '=', so Windows drive letters (`S:\proj=/mnt/proj`) and UNC roots (`\\srv\share=/mnt/s`)
// parse, and PATH may hold an '='. An empty ROOT or PATH is an error naming the flag value.
func ParseSharedRoot(s string) (SharedRoot, error) {
	root, local, ok := strings.Cut(s, "=")
	if !ok {
		return SharedRoot{}, fmt.Errorf("--shared %q: want ROOT=PATH (the share as submitters see it = its mount here)", s)
	}
	if root == "" {
		return SharedRoot{}, fmt.Errorf("--shared %q: empty ROOT before '='", s)
	}
	if local == "" {
		return SharedRoot{}, fmt.Errorf("--shared %q: empty PATH after '='", s)
	}
	return SharedRoot{Root: root, Local: local}, nil
}

// Mounts reports whether this mount is of the share a submitter named root: the same path,
// with Windows' separators and letter case taken as Windows takes them for a drive or UNC root.
func (s SharedRoot) Mounts(root string) bool {
	norm := func(p string) string {
		if len(p) >= 2 && (p[1] == ':' || strings.HasPrefix(p, `\`)) { // S:\proj, \srv\share
			return strings.ToLower(strings.TrimRight(strings.ReplaceAll(p, `/`, `\`), `\`))
		}
		return path.Clean(filepath.ToSlash(p))
	}
	return norm(s.Root) == norm(root)
}

// Resolve returns the local path of rel under Local. rel comes from a job, so it must stay
// inside the share: slash-separated, relative to Root, with no "..", "." or empty element, no
// backslash and nothing this system reads as absolute or a device; anything else is an error.
func (s SharedRoot) Resolve(rel string) (string, error) {
	if s.Local == "" {
		return "", fmt.Errorf("shared root %q: no local path", s.Root)
	}
	if rel == "" || strings.ContainsAny(rel, `\`+"\x00") || path.IsAbs(rel) || !fs.ValidPath(rel) || rel == "." {
		return "", fmt.Errorf("shared path %q: not a safe path relative to the share", rel)
	}
	local := filepath.FromSlash(rel)
	if !filepath.IsLocal(local) {
		return "", fmt.Errorf("shared path %q: not a safe path relative to the share", rel)
	}
	return filepath.Join(s.Local, local), nil
}

// sharedMemoMax bounds the memo of verified shared files; past it the memo starts again,
// which costs only hashing again.
const sharedMemoMax = 1 << 16

// sharedStamp is a shared file as it was when verified.
type sharedStamp struct {
	sha   string
	size  int64
	mtime time.Time
}

// sharedMemo remembers the shared files verified by this process, by path.
var sharedMemo struct {
	mu sync.Mutex
	m  map[string]sharedStamp
}

// VerifyShared checks that the file at path has ref's size and hash, the size first since it
// costs a stat. It remembers each verified (path, size, mtime), so a file every job of a
// sequence uses is hashed once per process while it does not change. A changed file is an
// error wrapping ErrSharedChanged whose text names the path and what changed (size or hash,
// expected and found); a file missing or unreadable is that error, naming the path.
func VerifyShared(ctx context.Context, path string, ref Ref) error {
	if err := checkRef(ref); err != nil {
		return fmt.Errorf("verify shared %s: %w", path, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("verify shared %s: %w", path, unpath(err))
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("verify shared %s: not a regular file", path)
	}
	if fi.Size() != ref.Size {
		return fmt.Errorf("%s: %w: size expected %d, found %d", path, ErrSharedChanged, ref.Size, fi.Size())
	}
	stamp := sharedStamp{sha: ref.SHA256, size: fi.Size(), mtime: fi.ModTime()}
	sharedMemo.mu.Lock()
	old, ok := sharedMemo.m[path]
	known := ok && old.sha == stamp.sha && old.size == stamp.size && old.mtime.Equal(stamp.mtime)
	sharedMemo.mu.Unlock()
	if known {
		return nil
	}
	got, err := HashFile(ctx, path)
	if err != nil {
		return fmt.Errorf("verify shared: %w", err)
	}
	if got.Size != ref.Size {
		return fmt.Errorf("%s: %w: size expected %d, found %d", path, ErrSharedChanged, ref.Size, got.Size)
	}
	if got.SHA256 != ref.SHA256 {
		return fmt.Errorf("%s: %w: sha256 expected %s, found %s", path, ErrSharedChanged, ref.SHA256, got.SHA256)
	}
	sharedMemo.mu.Lock()
	defer sharedMemo.mu.Unlock()
	if sharedMemo.m == nil || len(sharedMemo.m) >= sharedMemoMax {
		sharedMemo.m = make(map[string]sharedStamp)
	}
	sharedMemo.m[path] = stamp
	return nil
}
