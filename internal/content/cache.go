package content

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tilefarm/tilefarm/internal/platform"
)

// tmpPrefix starts the name of a file being fetched, in the cache's top directory: OpenCache
// removes what a crash left with it.
const tmpPrefix = ".tmp-"

// Fetcher streams one file's content into w; the cache calls it when the file is missing. It
// should stop when ctx is done; a write to w fails at once if the content grows past ref.Size.
type Fetcher func(ctx context.Context, ref Ref, w io.Writer) error

// Cache is a node's files by content under dir, at dir/<sha[0:2]>/<sha>, shared by every job
// and render slot of the process, so a file many jobs use is fetched once. A process opens one
// Cache per dir, and no two processes share a dir: what is in flight and pinned is known only
// in memory.
//
// Cached files are read-only (mode 0444). Callers hard-link them into a scene directory rather
// than copy them; evicting a file only removes the cache's own name for it, so a scene
// directory linked to it keeps its content intact and evicting is always safe for them. A
// caller must never write to a linked file: it is the cache's copy too (a damaged copy is
// caught by the re-verification on its first serve by a new Cache, not by one that has already
// verified it). Pin the refs before calling Path, so a file is not evicted between Path
// returning its path and the caller linking it.
//
// Files are evicted least recently used first once the total passes the limit; the order is
// kept in memory and in the files' mtimes, which OpenCache reads back.
type Cache struct {
	dir   string
	limit int64
	log   *slog.Logger

	mu      sync.Mutex
	entries map[string]*entry  // by sha; what is on disk under dir
	lru     *list.List         // of *entry, most recently used first
	size    int64              // the sum of entries' sizes
	flights map[string]*flight // by sha; a file being verified or fetched
	pins    map[string]int     // by sha; how many times pinned
}

// entry is a cached file.
type entry struct {
	sha  string
	size int64
	elem *list.Element // in Cache.lru
	// verified says this Cache has hashed the file and found it is its sha, while it had
	// vsize and vmtime; a file with another size or mtime is hashed again.
	verified bool
	vsize    int64
	vmtime   time.Time
}

// flight is the one verification or fetch of a sha in progress, shared by every caller of
// Path for it. It runs in its own goroutine, with a context cancelled once no caller waits.
type flight struct {
	ref    Ref
	done   chan struct{} // closed, under Cache.mu, once path and err are set
	path   string
	err    error
	cancel context.CancelFunc
	// waiters counts the callers waiting; when the last leaves, abandoned is set and the
	// flight is cancelled. Both are guarded by Cache.mu.
	waiters   int
	abandoned bool
}

// OpenCache opens the cache at dir, creating it, with a size limit in bytes (limit <= 0: no
// limit). It scans what is there so the total is known at once: files whose name is not a
// valid hash under its own prefix directory, and temp files left by a crash, are removed;
// the rest are ordered for eviction by their mtimes. A cache over its limit (a limit lowered
// since) is trimmed. log may be nil (slog.Default()).
func OpenCache(dir string, limit int64, log *slog.Logger) (*Cache, error) {
	if dir == "" {
		return nil, errors.New("open content cache: empty directory")
	}
	if log == nil {
		log = slog.Default()
	}
	if limit < 0 {
		limit = 0
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("open content cache: %w", err)
	}
	c := &Cache{
		dir:     dir,
		limit:   limit,
		log:     log.With("cache", dir),
		entries: make(map[string]*entry),
		lru:     list.New(),
		flights: make(map[string]*flight),
		pins:    make(map[string]int),
	}
	found, err := c.scan()
	if err != nil {
		return nil, fmt.Errorf("open content cache %s: %w", dir, err)
	}
	// Oldest first, each pushed to the front: the most recently used ends at the front.
	slices.SortFunc(found, func(a, b scanned) int { return a.mtime.Compare(b.mtime) })
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range found {
		c.addLocked(f.sha, f.size)
	}
	c.log.Info("content cache opened", "files", len(c.entries), "bytes", c.size, "limit", c.limit)
	c.evictLocked()
	return c, nil
}

// scanned is a cached file found by scan.
type scanned struct {
	sha   string
	size  int64
	mtime time.Time
}

// scan lists the cached files under c.dir, removing temp files and strays. Directories it does
// not know it leaves alone.
func (c *Cache) scan() ([]scanned, error) {
	top, err := os.ReadDir(c.dir)
	if err != nil {
		return nil, err
	}
	var found []scanned
	for _, d := range top {
		name := d.Name()
		p := filepath.Join(c.dir, name)
		switch {
		case strings.HasPrefix(name, tmpPrefix) && !d.IsDir():
			c.removeStray(p, "temp file left by an interrupted fetch")
		case d.IsDir() && len(name) == 2 && isLowerHex(name):
			sub, err := os.ReadDir(p)
			if err != nil {
				return nil, err
			}
			for _, s := range sub {
				sp := filepath.Join(p, s.Name())
				if s.IsDir() {
					c.log.Warn("content cache: leaving an unknown directory alone", "path", sp)
					continue
				}
				if !s.Type().IsRegular() || !ValidSHA256(s.Name()) || s.Name()[:2] != name {
					c.removeStray(sp, "not a cached file")
					continue
				}
				fi, err := s.Info()
				if errors.Is(err, fs.ErrNotExist) {
					continue
				}
				if err != nil {
					return nil, err
				}
				found = append(found, scanned{sha: s.Name(), size: fi.Size(), mtime: fi.ModTime()})
			}
		case d.IsDir():
			c.log.Warn("content cache: leaving an unknown directory alone", "path", p)
		default:
			c.removeStray(p, "not a cached file")
		}
	}
	return found, nil
}

// removeStray removes a file of dir that is not a cached file, saying why.
func (c *Cache) removeStray(path, why string) {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		c.log.Warn("content cache: cannot remove a stray file", "path", path, "why", why, "err", err)
		return
	}
	c.log.Info("content cache: removed a stray file", "path", path, "why", why)
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Size returns the bytes the cache holds now.
func (c *Cache) Size() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.size
}

// Limit returns the cache's size limit in bytes; 0 is none.
func (c *Cache) Limit() int64 { return c.limit }

// pathOf is where the file of sha lives.
func (c *Cache) pathOf(sha string) string {
	return filepath.Join(c.dir, sha[:2], sha)
}

// Path returns the local path of a verified copy of ref, fetching it with fetch when the cache
// lacks it. Concurrent callers for the same ref share one verification or fetch, run in its own
// goroutine and cancelled only once every caller waiting for it has given up. A fetch writes to
// a temp file in dir while hashing, fsyncs it and renames it into place only if its hash and
// size match ref; a mismatch is an error wrapping ErrMismatch and leaves nothing cached, as
// does a failing fetch. A file already cached is hashed again the first time this Cache serves
// it (remembered afterwards while its size and mtime stay as this Cache left them), so a file
// damaged on disk is fetched again rather than used. Each use marks the file recently used, in
// memory and in its mtime.
func (c *Cache) Path(ctx context.Context, ref Ref, fetch Fetcher) (string, error) {
	if err := checkRef(ref); err != nil {
		return "", err
	}
	for {
		c.mu.Lock()
		f := c.flights[ref.SHA256]
		if f == nil {
			fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
			f = &flight{ref: ref, done: make(chan struct{}), cancel: cancel}
			c.flights[ref.SHA256] = f
			go c.run(fctx, f, fetch)
		}
		f.waiters++
		c.mu.Unlock()

		select {
		case <-f.done:
			c.mu.Lock()
			f.waiters--
			abandoned := f.abandoned
			c.mu.Unlock()
			if f.ref != ref || abandoned {
				// Another size for the same hash, or a flight its callers gave up on just as
				// this one joined: ask again, with a flight of our own.
				if err := ctx.Err(); err != nil {
					return "", fmt.Errorf("content %s: %w", ref.SHA256, err)
				}
				continue
			}
			return f.path, f.err
		case <-ctx.Done():
			c.mu.Lock()
			f.waiters--
			if f.waiters == 0 && !isClosed(f.done) {
				f.abandoned = true
				f.cancel()
			}
			c.mu.Unlock()
			return "", fmt.Errorf("content %s: %w", ref.SHA256, ctx.Err())
		}
	}
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// run does a flight's work and publishes its result. A panicking fetcher fails the flight
// rather than the process: its callers are other goroutines that would otherwise wait forever.
func (c *Cache) run(ctx context.Context, f *flight, fetch Fetcher) {
	var path string
	var err error
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("content cache: fetch panicked", "sha256", f.ref.SHA256, "panic", r, "stack", string(debug.Stack()))
			path, err = "", fmt.Errorf("content %s: fetch panicked: %v", f.ref.SHA256, r)
		}
		f.cancel()
		c.mu.Lock()
		f.path, f.err = path, err
		delete(c.flights, f.ref.SHA256)
		close(f.done)
		c.mu.Unlock()
	}()
	path, err = c.serve(ctx, f.ref, fetch)
	if err != nil {
		err = fmt.Errorf("content %s: %w", f.ref.SHA256, err)
	}
}

// serve returns the path of a verified copy of ref, from disk or fetched; it runs in ref's
// flight, so nothing else touches ref's file meanwhile and eviction leaves it alone.
func (c *Cache) serve(ctx context.Context, ref Ref, fetch Fetcher) (string, error) {
	p := c.pathOf(ref.SHA256)
	ok, err := c.serveCached(ctx, ref, p)
	if err != nil {
		return "", err
	}
	if ok {
		return p, nil
	}
	if fetch == nil {
		return "", errors.New("not cached and no fetcher")
	}
	if err := c.fetch(ctx, ref, p, fetch); err != nil {
		return "", err
	}
	return p, nil
}

// serveCached reports whether the file at p is a good copy of ref, hashing it unless this
// Cache already has since it last changed, and marks it used. A damaged copy is removed.
func (c *Cache) serveCached(ctx context.Context, ref Ref, p string) (bool, error) {
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		c.forget(ref.SHA256)
		return false, nil
	}
	if err != nil {
		return false, unpath(err)
	}
	if !fi.Mode().IsRegular() {
		return false, c.discard(ref.SHA256, p, "not a regular file")
	}
	c.mu.Lock()
	e := c.entries[ref.SHA256]
	memo := e != nil && e.verified && e.vsize == fi.Size() && e.vmtime.Equal(fi.ModTime())
	c.mu.Unlock()
	if !memo {
		got, err := hashFile(ctx, p, nil)
		if err != nil {
			if ctx.Err() != nil {
				return false, err
			}
			return false, c.discard(ref.SHA256, p, "unreadable: "+err.Error())
		}
		if got.SHA256 != ref.SHA256 {
			return false, c.discard(ref.SHA256, p, "damaged: its content no longer matches its hash")
		}
	}
	now := time.Now()
	if err := os.Chtimes(p, now, now); err != nil {
		c.log.Debug("content cache: cannot mark a file used", "path", p, "err", err)
	}
	fi, err = os.Stat(p)
	if err != nil {
		return false, unpath(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e = c.entries[ref.SHA256]
	if e == nil {
		// On disk but not known: put there behind the cache's back since it opened.
		e = c.addLocked(ref.SHA256, fi.Size())
		defer c.evictLocked()
	} else {
		c.resizeLocked(e, fi.Size())
		c.lru.MoveToFront(e.elem)
	}
	e.verified, e.vsize, e.vmtime = true, fi.Size(), fi.ModTime()
	if fi.Size() != ref.Size {
		// The file is this hash's content, so it is the ref's size that is wrong.
		return false, mismatch(ref, ref.SHA256, fi.Size())
	}
	return true, nil
}

// discard removes a cached copy that cannot be served, saying why, so it is fetched again.
func (c *Cache) discard(sha, p, why string) error {
	c.log.Warn("content cache: fetching a cached file again", "sha256", sha, "why", why)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgetLocked(sha)
	if err := removeFile(p); err != nil {
		return fmt.Errorf("remove bad cached copy: %w", unpath(err))
	}
	return nil
}

// fetch fetches ref into a temp file, hashing it as it is written, and renames it to p if it
// is ref. Whatever fails, no temp file stays.
func (c *Cache) fetch(ctx context.Context, ref Ref, p string, fetch Fetcher) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return unpath(err)
	}
	tmp, err := os.CreateTemp(c.dir, tmpPrefix+ref.SHA256[:16]+"-*")
	if err != nil {
		return fmt.Errorf("create temp file: %w", unpath(err))
	}
	renamed := false
	defer func() {
		// Also when the fetcher panics, before run turns the panic into an error.
		if !renamed {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	w := &hashingWriter{ctx: ctx, w: tmp, h: sha256.New(), want: ref}
	ferr := fetch(ctx, ref, w)
	if w.err != nil {
		// The fetcher may have swallowed the error of a write it made.
		return w.err
	}
	if ferr != nil {
		return fmt.Errorf("fetch: %w", ferr)
	}
	if got := hex.EncodeToString(w.h.Sum(nil)); w.n != ref.Size || got != ref.SHA256 {
		return mismatch(ref, got, w.n)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("sync temp file: %w", unpath(err))
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close temp file: %w", unpath(err))
	}
	if err := os.Chmod(tmp.Name(), 0o444); err != nil {
		return fmt.Errorf("make read-only: %w", unpath(err))
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return fmt.Errorf("rename into place: %w", err)
	}
	renamed = true
	_ = platform.SyncDir(filepath.Dir(p)) // best effort: the rename is atomic already
	fi, err := os.Stat(p)
	if err != nil {
		return unpath(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[ref.SHA256]
	if e == nil {
		e = c.addLocked(ref.SHA256, fi.Size())
	} else {
		c.resizeLocked(e, fi.Size())
		c.lru.MoveToFront(e.elem)
	}
	e.verified, e.vsize, e.vmtime = true, fi.Size(), fi.ModTime()
	if c.limit > 0 && fi.Size() > c.limit {
		c.log.Warn("content cache: file larger than the cache limit, cached anyway and evicting every unpinned file",
			"sha256", ref.SHA256, "size", fi.Size(), "limit", c.limit)
	}
	c.evictLocked()
	return nil
}

// hashingWriter writes to w and hashes what it wrote; a write that would take the content past
// want.Size fails at once, so a wrong fetch cannot fill the disk, and so does one once ctx is
// done, so a fetcher that ignores ctx still stops.
type hashingWriter struct {
	ctx  context.Context
	w    io.Writer
	h    hash.Hash
	want Ref
	n    int64
	err  error
}

func (hw *hashingWriter) Write(p []byte) (int, error) {
	if hw.err != nil {
		return 0, hw.err
	}
	if err := hw.ctx.Err(); err != nil {
		hw.err = err
		return 0, err
	}
	if int64(len(p)) > hw.want.Size-hw.n {
		hw.err = fmt.Errorf("%w: more than the %d bytes expected", ErrMismatch, hw.want.Size)
		return 0, hw.err
	}
	k, err := hw.w.Write(p)
	hw.h.Write(p[:k])
	hw.n += int64(k)
	if err != nil {
		hw.err = fmt.Errorf("write temp file: %w", unpath(err))
		return k, hw.err
	}
	return k, nil
}

// Pin marks refs as in use until the returned func is called: pinned files are never evicted,
// so a job unpacking or rendering a scene pins its files for as long as it reads them. Refs
// not cached yet may be pinned (they are protected once fetched). Pins nest: a file stays
// pinned until every Pin of it is undone. Calling unpin again does nothing.
func (c *Cache) Pin(refs ...Ref) (unpin func()) {
	shas := make([]string, len(refs))
	c.mu.Lock()
	for i, r := range refs {
		shas[i] = r.SHA256
		c.pins[r.SHA256]++
	}
	c.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			for _, sha := range shas {
				if c.pins[sha]--; c.pins[sha] <= 0 {
					delete(c.pins, sha)
				}
			}
			// What the pins held back may go now.
			c.evictLocked()
		})
	}
}

// addLocked records a file newly on disk as the most recently used.
func (c *Cache) addLocked(sha string, size int64) *entry {
	e := &entry{sha: sha, size: size}
	e.elem = c.lru.PushFront(e)
	c.entries[sha] = e
	c.size += size
	return e
}

// resizeLocked changes what e counts for, when its file changed size on disk.
func (c *Cache) resizeLocked(e *entry, size int64) {
	c.size += size - e.size
	e.size = size
}

// forget drops sha's entry, when its file has gone.
func (c *Cache) forget(sha string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgetLocked(sha)
}

func (c *Cache) forgetLocked(sha string) {
	if e := c.entries[sha]; e != nil {
		c.lru.Remove(e.elem)
		delete(c.entries, sha)
		c.size -= e.size
	}
}

// evictLocked removes the least recently used files, skipping pinned ones and those in flight,
// until the cache is within its limit or nothing more may go. Files are removed under c.mu, so
// no flight can start on a file half evicted.
func (c *Cache) evictLocked() {
	if c.limit <= 0 {
		return
	}
	for el := c.lru.Back(); el != nil && c.size > c.limit; {
		e := el.Value.(*entry)
		el = el.Prev()
		if c.pins[e.sha] > 0 || c.flights[e.sha] != nil {
			continue
		}
		if err := removeFile(c.pathOf(e.sha)); err != nil {
			c.log.Warn("content cache: cannot evict a file", "sha256", e.sha, "err", err)
			continue
		}
		c.forgetLocked(e.sha)
		c.log.Debug("content cache: evicted", "sha256", e.sha, "size", e.size)
	}
	if c.size > c.limit {
		c.log.Debug("content cache: over its limit, the rest is pinned or in use", "bytes", c.size, "limit", c.limit)
	}
}

// removeFile removes a cached file; one already gone is no error.
func removeFile(p string) error {
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
