package content

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/logtest"
)

var quiet = slog.New(slog.DiscardHandler)

func openCache(t *testing.T, dir string, limit int64) *Cache {
	t.Helper()
	c, err := OpenCache(dir, limit, quiet)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// wantContent checks the file at p holds data.
func wantContent(t *testing.T, p string, data []byte) {
	t.Helper()
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("%s holds %d bytes other than the %d expected", p, len(got), len(data))
	}
}

// cachedName is where ref's file lives under a cache's dir, as listFiles names it.
func cachedName(ref Ref) string { return ref.SHA256[:2] + "/" + ref.SHA256 }

func TestCacheFetchOnceThenDisk(t *testing.T) {
	dir := t.TempDir()
	data := pattern(5000, 1)
	s, refs := newStore(data)
	ref := refs[0]
	c := openCache(t, dir, 0)
	p, err := c.Path(context.Background(), ref, s.fetch)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, ref.SHA256[:2], ref.SHA256); p != want {
		t.Errorf("Path = %s, want %s", p, want)
	}
	wantContent(t, p, data)
	for range 3 {
		if p2, err := c.Path(context.Background(), ref, s.fetch); err != nil || p2 != p {
			t.Fatalf("Path again = %s, %v", p2, err)
		}
	}
	if n := s.count(ref); n != 1 {
		t.Errorf("%d fetches, want 1", n)
	}
	if got := c.Size(); got != ref.Size {
		t.Errorf("Size = %d, want %d", got, ref.Size)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm()&0o222 != 0 {
		t.Errorf("cached file mode %v, %v; want read-only", fi.Mode(), err)
	}

	// A new Cache on the same dir serves it from disk (hashing it once to verify it).
	c2 := openCache(t, dir, 0)
	if _, err := c2.Path(context.Background(), ref, s.fetch); err != nil {
		t.Fatal(err)
	}
	if n := s.count(ref); n != 1 {
		t.Errorf("%d fetches after reopening, want 1", n)
	}
	if got := listFiles(t, dir); !slices.Equal(got, []string{cachedName(ref)}) {
		t.Errorf("cache dir holds %v", got)
	}
}

func TestCacheConcurrentCallersShareOneFetch(t *testing.T) {
	const callers = 32
	data := pattern(100000, 2)
	s, refs := newStore(data)
	ref := refs[0]
	c := openCache(t, t.TempDir(), 0)
	gate := make(chan struct{})
	fetch := func(ctx context.Context, ref Ref, w io.Writer) error {
		<-gate
		return s.fetch(ctx, ref, w)
	}
	paths := make([]string, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() { paths[i], errs[i] = c.Path(context.Background(), ref, fetch) })
	}
	waitWaiters(t, c, ref, callers) // the fetch goes once every caller waits for it
	close(gate)
	wg.Wait()
	for i := range callers {
		if errs[i] != nil || paths[i] != paths[0] {
			t.Fatalf("caller %d: %s, %v", i, paths[i], errs[i])
		}
	}
	wantContent(t, paths[0], data)
	if n := s.count(ref); n != 1 {
		t.Errorf("%d concurrent callers caused %d fetches, want 1", callers, n)
	}
}

func TestCacheFetchMismatch(t *testing.T) {
	data := pattern(4000, 3)
	ref := refOf(data)
	tests := []struct {
		name string
		give []byte
	}{
		{"wrong bytes", pattern(4000, 9)},
		{"short", data[:3999]},
		{"long", append(append([]byte{}, data...), 0)},
		{"empty", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			c := openCache(t, dir, 0)
			fetch := func(ctx context.Context, ref Ref, w io.Writer) error {
				_, err := w.Write(tt.give)
				return err
			}
			_, err := c.Path(context.Background(), ref, fetch)
			if !errors.Is(err, ErrMismatch) {
				t.Fatalf("Path = %v, want ErrMismatch", err)
			}
			if !strings.Contains(err.Error(), ref.SHA256) {
				t.Errorf("error %q does not name the hash", err)
			}
			if got := listFiles(t, dir); len(got) != 0 {
				t.Errorf("after a mismatch the cache dir holds %v, want nothing", got)
			}
			if c.Size() != 0 {
				t.Errorf("Size = %d after a mismatch", c.Size())
			}
		})
	}
}

func TestCacheFailingFetcherLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	data := pattern(10000, 4)
	ref := refOf(data)
	c := openCache(t, dir, 0)
	broken := errors.New("connection reset")
	fetch := func(ctx context.Context, ref Ref, w io.Writer) error {
		if _, err := w.Write(data[:5000]); err != nil {
			return err
		}
		return broken
	}
	if _, err := c.Path(context.Background(), ref, fetch); !errors.Is(err, broken) {
		t.Fatalf("Path = %v, want the fetcher's error", err)
	}
	if got := listFiles(t, dir); len(got) != 0 {
		t.Errorf("after a failed fetch the cache dir holds %v, want nothing", got)
	}
	// A later fetch that works caches it.
	s, _ := newStore(data)
	p, err := c.Path(context.Background(), ref, s.fetch)
	if err != nil {
		t.Fatal(err)
	}
	wantContent(t, p, data)
}

func TestCachePanickingFetcher(t *testing.T) {
	dir := t.TempDir()
	c := openCache(t, dir, 0)
	fetch := func(ctx context.Context, ref Ref, w io.Writer) error {
		w.Write([]byte("abc"))
		panic("fetcher bug")
	}
	if _, err := c.Path(context.Background(), refOf([]byte("abcdef")), fetch); err == nil || !strings.Contains(err.Error(), "fetcher bug") {
		t.Fatalf("Path = %v, want the panic as an error", err)
	}
	if got := listFiles(t, dir); len(got) != 0 {
		t.Errorf("cache dir holds %v", got)
	}
}

// TestCacheRefetchesDamaged checks a cached file damaged on disk is fetched again by a new Cache
// rather than served, whether its size changed or not (with its mtime put back).
func TestCacheRefetchesDamaged(t *testing.T) {
	data := pattern(20000, 5)
	tests := []struct {
		name   string
		damage []byte
	}{
		{"same size, mtime restored", pattern(20000, 6)},
		{"size changed", data[:15000]},
		{"grown", append(append([]byte{}, data...), data...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			s, refs := newStore(data)
			ref := refs[0]
			c := openCache(t, dir, 0)
			p, err := c.Path(context.Background(), ref, s.fetch)
			if err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, tt.damage, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(p, fi.ModTime(), fi.ModTime()); err != nil {
				t.Fatal(err)
			}

			c2 := openCache(t, dir, 0)
			if got := c2.Size(); got != int64(len(tt.damage)) {
				t.Errorf("reopened Size = %d, want the %d on disk", got, len(tt.damage))
			}
			p2, err := c2.Path(context.Background(), ref, s.fetch)
			if err != nil {
				t.Fatal(err)
			}
			wantContent(t, p2, data)
			if n := s.count(ref); n != 2 {
				t.Errorf("%d fetches, want 2 (the damaged copy fetched again)", n)
			}
			if got := c2.Size(); got != ref.Size {
				t.Errorf("Size = %d, want %d", got, ref.Size)
			}
			if got := listFiles(t, dir); !slices.Equal(got, []string{cachedName(ref)}) {
				t.Errorf("cache dir holds %v", got)
			}
		})
	}
}

func TestCacheEvictsLeastRecentlyUsed(t *testing.T) {
	dir := t.TempDir()
	s, r := newStore(pattern(10, 'a'), pattern(10, 'b'), pattern(10, 'c'), pattern(10, 'd'), pattern(10, 'e'))
	a, b, cc, d, e := r[0], r[1], r[2], r[3], r[4]
	c := openCache(t, dir, 30)
	use := func(ref Ref) {
		t.Helper()
		if _, err := c.Path(context.Background(), ref, s.fetch); err != nil {
			t.Fatal(err)
		}
	}
	cached := func(want ...Ref) {
		t.Helper()
		var names []string
		for _, r := range want {
			names = append(names, cachedName(r))
		}
		slices.Sort(names)
		if got := listFiles(t, dir); !slices.Equal(got, names) {
			t.Errorf("cache dir holds %v, want %v", got, names)
		}
		if got := c.Size(); got != int64(10*len(want)) {
			t.Errorf("Size = %d, want %d", got, 10*len(want))
		}
	}
	use(a)
	use(b)
	use(cc)
	cached(a, b, cc)
	use(a) // b is now the least recently used
	use(d)
	cached(a, cc, d)
	use(e) // then cc
	cached(a, d, e)
	use(b) // fetched again; a goes
	cached(d, e, b)
	if n := s.count(b); n != 2 {
		t.Errorf("b fetched %d times, want 2", n)
	}
	if n := s.count(a); n != 1 {
		t.Errorf("a fetched %d times, want 1 (served from disk when used again)", n)
	}
	if c.Limit() != 30 {
		t.Errorf("Limit = %d", c.Limit())
	}
}

func TestCachePinnedSurviveEviction(t *testing.T) {
	dir := t.TempDir()
	s, r := newStore(pattern(10, 'a'), pattern(10, 'b'), pattern(10, 'c'), pattern(10, 'd'), pattern(10, 'e'), pattern(10, 'f'))
	a, b, cc, d, e, f := r[0], r[1], r[2], r[3], r[4], r[5]
	c := openCache(t, dir, 20)
	use := func(ref Ref) {
		t.Helper()
		if _, err := c.Path(context.Background(), ref, s.fetch); err != nil {
			t.Fatal(err)
		}
	}
	has := func(ref Ref) bool {
		_, err := os.Stat(filepath.Join(dir, ref.SHA256[:2], ref.SHA256))
		return err == nil
	}
	unpin1 := c.Pin(a)
	unpin2 := c.Pin(a) // nested
	use(a)
	use(b)
	use(cc) // over the limit: a is the oldest but pinned, so b goes
	if !has(a) || has(b) || !has(cc) {
		t.Fatalf("after a pinned, b, c: a %v b %v c %v; want a and c", has(a), has(b), has(cc))
	}
	use(d) // c goes
	if !has(a) || has(cc) || !has(d) {
		t.Fatalf("after d: a %v c %v d %v; want a and d", has(a), has(cc), has(d))
	}
	unpin1()
	unpin1() // a second call does nothing
	use(e)   // a is still pinned once: d goes
	if !has(a) || has(d) || !has(e) {
		t.Fatalf("after one unpin and e: a %v d %v e %v; want a and e", has(a), has(d), has(e))
	}
	unpin2()
	use(f) // a is the least recently used and unpinned now
	if has(a) || !has(e) || !has(f) {
		t.Fatalf("after both unpins and f: a %v e %v f %v; want e and f", has(a), has(e), has(f))
	}
	if c.Size() != 20 {
		t.Errorf("Size = %d, want 20", c.Size())
	}
}

func TestCacheUnpinEvicts(t *testing.T) {
	dir := t.TempDir()
	s, r := newStore(pattern(10, 'a'), pattern(10, 'b'))
	c := openCache(t, dir, 10)
	unpin := c.Pin(r...)
	for _, ref := range r {
		if _, err := c.Path(context.Background(), ref, s.fetch); err != nil {
			t.Fatal(err)
		}
	}
	if c.Size() != 20 {
		t.Fatalf("Size with both pinned = %d, want 20 (over the limit, since both are pinned)", c.Size())
	}
	unpin()
	if c.Size() != 10 {
		t.Errorf("Size after unpin = %d, want 10", c.Size())
	}
	if got := listFiles(t, dir); !slices.Equal(got, []string{cachedName(r[1])}) {
		t.Errorf("cache dir holds %v, want only the most recently used", got)
	}
}

func TestCacheFileOverLimit(t *testing.T) {
	dir := t.TempDir()
	var logs logtest.Buffer
	c, err := OpenCache(dir, 10, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	big := pattern(25, 'B')
	s, r := newStore(pattern(4, 'x'), pattern(4, 'y'), big, pattern(4, 'z'))
	x, y, bigRef, z := r[0], r[1], r[2], r[3]
	use := func(ref Ref) string {
		t.Helper()
		p, err := c.Path(context.Background(), ref, s.fetch)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	unpin := c.Pin(x)
	defer unpin()
	use(x)
	use(y)
	p := use(bigRef)
	wantContent(t, p, big)
	if got, want := listFiles(t, dir), sortedNames(x, bigRef); !slices.Equal(got, want) {
		t.Errorf("cache dir holds %v, want %v (the big file and the pinned one)", got, want)
	}
	if c.Size() != 29 {
		t.Errorf("Size = %d, want 29", c.Size())
	}
	if out := logs.String(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, "size=25") || !strings.Contains(out, "limit=10") {
		t.Errorf("no warning naming the size and the limit in the log:\n%s", out)
	}
	use(z) // the big file is the least recently used unpinned one now
	if got, want := listFiles(t, dir), sortedNames(x, z); !slices.Equal(got, want) {
		t.Errorf("cache dir holds %v, want %v", got, want)
	}
}

func sortedNames(refs ...Ref) []string {
	var names []string
	for _, r := range refs {
		names = append(names, cachedName(r))
	}
	slices.Sort(names)
	return names
}

func TestCacheReopenScans(t *testing.T) {
	dir := t.TempDir()
	s, r := newStore(pattern(100, 1), pattern(200, 2), pattern(300, 3))
	c := openCache(t, dir, 0)
	for _, ref := range r {
		if _, err := c.Path(context.Background(), ref, s.fetch); err != nil {
			t.Fatal(err)
		}
	}
	// What a crash and strays leave.
	writeFile(t, dir, tmpPrefix+"0123456789abcdef-42", []byte("half a fetch"))
	writeFile(t, dir, "stray.txt", []byte("?"))
	writeFile(t, filepath.Join(dir, r[0].SHA256[:2]), "not-a-hash", []byte("?"))
	// A valid hash under the wrong prefix directory.
	writeFile(t, filepath.Join(dir, r[0].SHA256[:2]), r[1].SHA256, []byte("misplaced"))
	if err := os.MkdirAll(filepath.Join(dir, "unknown"), 0o755); err != nil {
		t.Fatal(err)
	}

	c2 := openCache(t, dir, 0)
	if got := c2.Size(); got != 600 {
		t.Errorf("reopened Size = %d, want 600", got)
	}
	if got, want := listFiles(t, dir), sortedNames(r...); !slices.Equal(got, want) {
		t.Errorf("reopened cache dir holds %v, want %v", got, want)
	}
	if _, err := os.Stat(filepath.Join(dir, "unknown")); err != nil {
		t.Errorf("an unknown directory was removed: %v", err)
	}
	for _, ref := range r {
		if _, err := c2.Path(context.Background(), ref, s.fetch); err != nil {
			t.Fatal(err)
		}
		if n := s.count(ref); n != 1 {
			t.Errorf("%d fetches after reopening, want 1", n)
		}
	}

	// Reopened with a lower limit it is trimmed to it, oldest first by mtime.
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(filepath.Join(dir, r[2].SHA256[:2], r[2].SHA256), old, old); err != nil {
		t.Fatal(err)
	}
	c3 := openCache(t, dir, 350)
	if got := c3.Size(); got != 300 {
		t.Errorf("Size reopened with limit 350 = %d, want 300", got)
	}
	if got, want := listFiles(t, dir), sortedNames(r[0], r[1]); !slices.Equal(got, want) {
		t.Errorf("cache dir holds %v, want %v (the oldest evicted)", got, want)
	}
}

func TestCacheCallerCancelled(t *testing.T) {
	dir := t.TempDir()
	c := openCache(t, dir, 0)
	data := pattern(1000, 8)
	ref := refOf(data)
	started := make(chan struct{})
	var fetchCancelled atomic.Bool
	fetch := func(ctx context.Context, ref Ref, w io.Writer) error {
		w.Write(data[:100])
		close(started)
		<-ctx.Done()
		fetchCancelled.Store(true)
		return ctx.Err()
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-started; cancel() }()
	if _, err := c.Path(ctx, ref, fetch); !errors.Is(err, context.Canceled) {
		t.Fatalf("Path = %v, want context.Canceled", err)
	}
	waitNoFlight(t, c, ref)
	if !fetchCancelled.Load() {
		t.Error("the fetch was not cancelled once its only caller left")
	}
	if got := listFiles(t, dir); len(got) != 0 {
		t.Errorf("cache dir holds %v", got)
	}
}

// TestCacheFetchOutlivesOneCaller checks that a caller giving up does not fail the fetch for
// another caller still waiting for it.
func TestCacheFetchOutlivesOneCaller(t *testing.T) {
	c := openCache(t, t.TempDir(), 0)
	data := pattern(1000, 9)
	s, refs := newStore(data)
	ref := refs[0]
	gate := make(chan struct{})
	fetch := func(ctx context.Context, ref Ref, w io.Writer) error {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
		return s.fetch(ctx, ref, w)
	}
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() { _, err := c.Path(ctx, ref, fetch); first <- err }()
	waitWaiters(t, c, ref, 1)
	second := make(chan error, 1)
	var p string
	go func() {
		var err error
		p, err = c.Path(context.Background(), ref, fetch)
		second <- err
	}()
	waitWaiters(t, c, ref, 2)
	cancel()
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Fatalf("first caller: %v, want context.Canceled", err)
	}
	close(gate)
	if err := <-second; err != nil {
		t.Fatalf("second caller: %v", err)
	}
	wantContent(t, p, data)
	if n := s.count(ref); n != 1 {
		t.Errorf("%d fetches, want 1", n)
	}
}

func waitWaiters(t *testing.T, c *Cache, ref Ref, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.mu.Lock()
		f := c.flights[ref.SHA256]
		ok := f != nil && f.waiters == n
		c.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("never %d callers waiting", n)
		}
		time.Sleep(time.Millisecond)
	}
}

func waitNoFlight(t *testing.T, c *Cache, ref Ref) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.mu.Lock()
		f := c.flights[ref.SHA256]
		c.mu.Unlock()
		if f == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the flight never ended")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestCacheBadRefs(t *testing.T) {
	dir := t.TempDir()
	c := openCache(t, dir, 0)
	var fetches atomic.Int64
	fetch := func(ctx context.Context, ref Ref, w io.Writer) error { fetches.Add(1); return nil }
	good := refOf([]byte("x")).SHA256
	for _, ref := range []Ref{
		{SHA256: "../../etc/passwd", Size: 1},
		{SHA256: strings.ToUpper(good), Size: 1},
		{SHA256: "", Size: 0},
		{SHA256: good, Size: -1},
	} {
		if _, err := c.Path(context.Background(), ref, fetch); err == nil {
			t.Errorf("Path(%+v) = nil error", ref)
		}
	}
	if fetches.Load() != 0 {
		t.Errorf("%d fetches for invalid refs", fetches.Load())
	}
	if _, err := c.Path(context.Background(), refOf([]byte("y")), nil); err == nil {
		t.Error("Path of a missing file with no fetcher = nil error")
	}
	if got := listFiles(t, dir); len(got) != 0 {
		t.Errorf("cache dir holds %v", got)
	}
}

// TestCacheWrongSizeForCachedHash checks a ref with the right hash but the wrong size is
// refused without harming the good copy.
func TestCacheWrongSizeForCachedHash(t *testing.T) {
	dir := t.TempDir()
	data := pattern(500, 10)
	s, refs := newStore(data)
	c := openCache(t, dir, 0)
	p, err := c.Path(context.Background(), refs[0], s.fetch)
	if err != nil {
		t.Fatal(err)
	}
	wrong := Ref{SHA256: refs[0].SHA256, Size: 400}
	if _, err := c.Path(context.Background(), wrong, s.fetch); !errors.Is(err, ErrMismatch) {
		t.Fatalf("Path(wrong size) = %v, want ErrMismatch", err)
	}
	wantContent(t, p, data)
	if n := s.count(refs[0]); n != 1 {
		t.Errorf("%d fetches, want 1", n)
	}
}

func TestOpenCacheErrors(t *testing.T) {
	if _, err := OpenCache("", 0, nil); err == nil {
		t.Error("OpenCache(\"\") = nil error")
	}
	file := writeFile(t, t.TempDir(), "file", []byte("x"))
	if _, err := OpenCache(filepath.Join(file, "cache"), 0, nil); err == nil {
		t.Error("OpenCache under a file = nil error")
	}
}
