package objstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tilefarm/tilefarm/internal/miniotest"
)

// The sizes the streaming tests upload: a small object (one PUT on S3), one of exactly one part
// (one PUT whose buffer the last Read fills), one of exactly two parts (a multipart upload
// ending on a part boundary) and one past two parts with a partial last part.
const (
	smallSize = 100_007
	onePart   = s3PartSize
	twoParts  = 2 * s3PartSize
	largeSize = 40<<20 + 123
)

// streamStore is a store under test and how to check that it holds no leftovers of a failed
// upload: temporary files on the filesystem, incomplete multipart uploads on S3. uploads logs
// the S3 store's multipart requests (nil for the filesystem).
type streamStore struct {
	name    string
	store   Store
	clean   func(t *testing.T)
	uploads *uploadLog
}

// uploadLog counts the multipart requests that go through it, so a test knows which way an
// upload went and that a failed one was aborted.
type uploadLog struct {
	next                               http.RoundTripper
	singles, initiated, parts, aborted atomic.Int32
}

func (l *uploadLog) RoundTrip(req *http.Request) (*http.Response, error) {
	q := req.URL.Query()
	switch {
	case req.Method == http.MethodPost && q.Has("uploads"):
		l.initiated.Add(1)
	case req.Method == http.MethodPut && q.Has("partNumber"):
		l.parts.Add(1)
	case req.Method == http.MethodDelete && q.Has("uploadId"):
		l.aborted.Add(1)
	case req.Method == http.MethodPut:
		l.singles.Add(1)
	}
	return l.next.RoundTrip(req)
}

// counts returns the multipart uploads initiated, the parts sent and the uploads aborted so
// far, and resets them (and the single PUTs, singles).
func (l *uploadLog) counts() (initiated, parts, aborted int32) {
	l.singles.Store(0)
	return l.initiated.Swap(0), l.parts.Swap(0), l.aborted.Swap(0)
}

// streamStores returns both stores: a filesystem one and one on a real MinIO.
func streamStores(t *testing.T) []streamStore {
	t.Helper()
	fsStore, err := NewFSStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv := miniotest.Start(t)
	log := &uploadLog{}
	s3, err := newS3Store(context.Background(), srv.Endpoint, srv.Bucket, false, srv.AccessKey, srv.SecretKey,
		func(next http.RoundTripper) http.RoundTripper { log.next = next; return log })
	if err != nil {
		t.Fatal(err)
	}
	return []streamStore{
		{"fs", fsStore, func(t *testing.T) { t.Helper(); noTempFiles(t, fsStore) }, nil},
		{"s3", s3, func(t *testing.T) { t.Helper(); noIncompleteUploads(t, s3) }, log},
	}
}

func noTempFiles(t *testing.T, s *FSStore) {
	t.Helper()
	err := filepath.WalkDir(s.Root(), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.HasPrefix(d.Name(), tempPrefix) {
			t.Errorf("temporary file %s left behind", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func noIncompleteUploads(t *testing.T, s *S3Store) {
	t.Helper()
	for u := range s.client.ListIncompleteUploads(context.Background(), s.bucket, "", true) {
		if u.Err != nil {
			t.Fatal(u.Err)
		}
		t.Errorf("incomplete multipart upload of %q (%s) left behind", u.Key, u.UploadID)
	}
}

// prng is size bytes from a seeded ChaCha8, made as they are read: a large object's content
// that is never held whole. eofWithLast returns io.EOF with the last bytes rather than after.
type prng struct {
	src         *rand.ChaCha8
	left        int64
	eofWithLast bool
}

func newPRNG(seed byte, size int64) *prng {
	return &prng{src: rand.NewChaCha8([32]byte{seed}), left: size}
}

func (p *prng) Read(b []byte) (int, error) {
	if p.left == 0 {
		return 0, io.EOF
	}
	if int64(len(b)) > p.left {
		b = b[:p.left]
	}
	n, _ := p.src.Read(b)
	p.left -= int64(n)
	if p.left == 0 && p.eofWithLast {
		return n, io.EOF
	}
	return n, nil
}

// digestOf is the SHA-256 of the content of newPRNG(seed, size).
func digestOf(t *testing.T, seed byte, size int64) [32]byte {
	t.Helper()
	h := sha256.New()
	if _, err := io.Copy(h, newPRNG(seed, size)); err != nil {
		t.Fatal(err)
	}
	return [32]byte(h.Sum(nil))
}

var errInjected = errors.New("injected reader failure")

// failAfter fails with errInjected once it passed at bytes of r.
type failAfter struct {
	r  io.Reader
	at int64
}

func (f *failAfter) Read(p []byte) (int, error) {
	if f.at <= 0 {
		return 0, errInjected
	}
	if int64(len(p)) > f.at {
		p = p[:f.at]
	}
	n, err := f.r.Read(p)
	f.at -= int64(n)
	return n, err
}

var errDigest = errors.New("content does not match its digest")

// verifying hashes r as it is read and, at r's EOF, fails with errDigest instead when the
// digest is not want: the reader of a download whose hash is known, failing only its last Read.
type verifying struct {
	r    io.Reader
	h    hash.Hash
	want [32]byte
}

func newVerifying(r io.Reader, want [32]byte) *verifying {
	return &verifying{r: r, h: sha256.New(), want: want}
}

func (v *verifying) Read(p []byte) (int, error) {
	n, err := v.r.Read(p)
	v.h.Write(p[:n])
	if err == io.EOF && [32]byte(v.h.Sum(nil)) != v.want {
		return n, errDigest
	}
	return n, err
}

// readInChunks reads r through a 64 KiB buffer and returns the digest of what it read and how
// many Reads returned bytes.
func readInChunks(t *testing.T, r io.Reader) ([32]byte, int) {
	t.Helper()
	h := sha256.New()
	buf := make([]byte, 64<<10)
	reads := 0
	for {
		n, err := r.Read(buf)
		if n > 0 {
			reads++
			h.Write(buf[:n])
		}
		if err == io.EOF {
			return [32]byte(h.Sum(nil)), reads
		}
		if err != nil {
			t.Fatalf("reading: %v", err)
		}
	}
}

// checkContent checks that key holds size bytes of newPRNG(seed, size), read through Open in
// chunks.
func checkContent(t *testing.T, s Store, key string, seed byte, size int64) {
	t.Helper()
	ctx := context.Background()
	rc, info, err := s.Open(ctx, key)
	if err != nil {
		t.Fatalf("Open(%q): %v", key, err)
	}
	defer rc.Close()
	if info.Key != key || info.Size != size || info.ModTime.IsZero() {
		t.Fatalf("Open(%q) info = %+v, want key %q and %d bytes", key, info, key, size)
	}
	got, reads := readInChunks(t, rc)
	if got != digestOf(t, seed, size) {
		t.Fatalf("Open(%q) read other content than was put (%d bytes)", key, size)
	}
	if want := int((size + 64<<10 - 1) / (64 << 10)); reads < want {
		t.Fatalf("Open(%q) took %d reads of 64 KiB for %d bytes", key, reads, size)
	}
	if st, err := s.Stat(ctx, key); err != nil || st.Size != size {
		t.Fatalf("Stat(%q) = %+v, %v; want %d bytes", key, st, err, size)
	}
}

// checkUnchanged checks, after a refused upload, that key holds old (nil: nothing).
func checkUnchanged(t *testing.T, s Store, key string, old []byte) {
	t.Helper()
	ctx := context.Background()
	if old == nil {
		if _, err := s.Stat(ctx, key); !errors.Is(err, ErrNotFound) {
			t.Fatalf("a refused upload left an object at %q: Stat = %v", key, err)
		}
		if _, _, err := s.Open(ctx, key); !errors.Is(err, ErrNotFound) {
			t.Fatalf("a refused upload left an object at %q: Open = %v", key, err)
		}
		return
	}
	if got, err := s.Get(ctx, key); err != nil || !bytes.Equal(got, old) {
		t.Fatalf("a refused upload changed %q: holds %d bytes (%v), want the old %d", key, len(got), err, len(old))
	}
}

// Property: what PutStream stores is what Open reads back, in chunks, for an empty, a small
// and a multipart-sized object on either store, and a PutStream replaces an existing object.
func TestPutStreamRoundTrip(t *testing.T) {
	ctx := context.Background()
	for _, st := range streamStores(t) {
		t.Run(st.name, func(t *testing.T) {
			s := st.store
			for i, size := range []int64{0, 1, smallSize, largeSize} {
				key := fmt.Sprintf("scenes/round/%d", size)
				seed := byte(i + 1)
				if err := s.PutStream(ctx, key, newPRNG(seed, size), size); err != nil {
					t.Fatalf("PutStream of %d bytes: %v", size, err)
				}
				if st.uploads != nil {
					wantParts := int32(0)
					if size > s3PartSize {
						wantParts = int32((size + s3PartSize - 1) / s3PartSize)
					}
					if ups, parts, aborts := st.uploads.counts(); parts != wantParts || ups != min(wantParts, 1) || aborts != 0 {
						t.Fatalf("PutStream of %d bytes: %d multipart uploads of %d parts (%d aborted), want %d parts",
							size, ups, parts, aborts, wantParts)
					}
				}
				checkContent(t, s, key, seed, size)
			}
			if got, err := s.Get(ctx, "scenes/round/0"); err != nil || len(got) != 0 {
				t.Fatalf("Get of the empty object = %d bytes, %v", len(got), err)
			}
			// A reader that ends with its last bytes (io.EOF with them) is as good.
			r := newPRNG(9, smallSize)
			r.eofWithLast = true
			if err := s.PutStream(ctx, "scenes/round/eof-with-last", r, smallSize); err != nil {
				t.Fatal(err)
			}
			checkContent(t, s, "scenes/round/eof-with-last", 9, smallSize)
			// Replacing: a small object over the large one, then a large one over it.
			key := fmt.Sprintf("scenes/round/%d", largeSize)
			if err := s.PutStream(ctx, key, newPRNG(7, smallSize), smallSize); err != nil {
				t.Fatal(err)
			}
			checkContent(t, s, key, 7, smallSize)
			if err := s.PutStream(ctx, key, newPRNG(8, largeSize), largeSize); err != nil {
				t.Fatal(err)
			}
			checkContent(t, s, key, 8, largeSize)
			objs, err := s.List(ctx, "scenes/round/")
			if err != nil || len(objs) != 5 {
				t.Fatalf("List = %v, %v; want the 5 objects", objs, err)
			}
			if err := s.PutStream(ctx, "bad//key", newPRNG(1, 1), 1); !errors.Is(err, ErrBadKey) {
				t.Fatalf("PutStream of a bad key = %v, want ErrBadKey", err)
			}
			if err := s.PutStream(ctx, "scenes/round/neg", newPRNG(1, 1), -1); err == nil {
				t.Fatal("PutStream of a negative size succeeded")
			}
			st.clean(t)
		})
	}
}

// Property: a reader that fails, midway or only at its EOF (a hash checked at the end, failing
// after the last bytes or with them), makes PutStream fail with its error and store nothing: a
// new key stays missing, an existing key keeps its old content, and no temporary file or
// incomplete multipart upload is left, for a single PUT and for a multipart upload (which S3
// aborts), whether the failing Read is mid-part or the one that fills a part.
func TestPutStreamFailingReaderStoresNothing(t *testing.T) {
	ctx := context.Background()
	old := []byte("the object before the failed upload")
	modes := []struct {
		name   string
		want   error
		reader func(size int64) io.Reader
	}{
		{"midway", errInjected, func(size int64) io.Reader { return &failAfter{r: newPRNG(1, size), at: size / 2} }},
		{"last-read", errInjected, func(size int64) io.Reader { return &failAfter{r: newPRNG(1, size), at: size} }},
		{"digest-after-last-bytes", errDigest, func(size int64) io.Reader {
			return newVerifying(newPRNG(1, size), [32]byte{}) // the bytes, then (0, errDigest)
		}},
		{"digest-with-last-bytes", errDigest, func(size int64) io.Reader {
			r := newPRNG(1, size)
			r.eofWithLast = true
			return newVerifying(r, [32]byte{}) // (last bytes, errDigest)
		}},
	}
	for _, st := range streamStores(t) {
		t.Run(st.name, func(t *testing.T) {
			s := st.store
			for _, size := range []int64{smallSize, onePart, twoParts, largeSize} {
				for _, m := range modes {
					for _, existing := range []bool{false, true} {
						key := fmt.Sprintf("scenes/fail/%s/%d/%v", m.name, size, existing)
						var before []byte
						if existing {
							before = old
							if err := s.Put(ctx, key, old); err != nil {
								t.Fatal(err)
							}
						}
						if st.uploads != nil {
							st.uploads.counts()
						}
						err := s.PutStream(ctx, key, m.reader(size), size)
						if !errors.Is(err, m.want) || !strings.Contains(err.Error(), key) {
							t.Fatalf("PutStream of %d bytes, reader failing %s = %v; want %v naming the key", size, m.name, err, m.want)
						}
						if st.uploads != nil {
							checkAborted(t, st.uploads, size)
						}
						checkUnchanged(t, s, key, before)
					}
				}
			}
			// An empty object whose reader fails at once.
			if err := s.PutStream(ctx, "scenes/fail/empty", &failAfter{r: newPRNG(1, 0)}, 0); !errors.Is(err, errInjected) {
				t.Fatalf("PutStream of 0 bytes, reader failing = %v", err)
			}
			checkUnchanged(t, s, "scenes/fail/empty", nil)
			st.clean(t)
		})
	}
}

// checkAborted checks which way a failed S3 upload of size bytes went: a single PUT that was
// never sent up to s3PartSize, else a multipart upload that sent the parts read before the
// failure and was aborted.
func checkAborted(t *testing.T, l *uploadLog, size int64) {
	t.Helper()
	singles := l.singles.Load()
	ups, parts, aborts := l.counts()
	if size <= s3PartSize {
		if ups != 0 || parts != 0 || singles != 0 {
			t.Fatalf("a failed upload of %d bytes sent %d PUTs, %d multipart uploads of %d parts; want nothing sent",
				size, singles, ups, parts)
		}
		return
	}
	if ups != 1 || aborts != 1 || int64(parts) >= (size+s3PartSize-1)/s3PartSize {
		t.Fatalf("a failed upload of %d bytes: %d multipart uploads, %d parts, %d aborted; want one, aborted before its last part",
			size, ups, parts, aborts)
	}
}

// Property: a reader with fewer or more bytes than the size PutStream was given is refused and
// stores nothing, also when the size ends exactly on a part boundary (where a consumer that
// stops at size bytes would never see the extra ones).
func TestPutStreamSizeMismatchStoresNothing(t *testing.T) {
	ctx := context.Background()
	old := []byte("the object before the refused upload")
	for _, st := range streamStores(t) {
		t.Run(st.name, func(t *testing.T) {
			s := st.store
			for _, size := range []int64{0, smallSize, onePart, twoParts, largeSize} {
				for _, delta := range []int64{-1, +1} {
					if size+delta < 0 {
						continue
					}
					for _, existing := range []bool{false, true} {
						key := fmt.Sprintf("scenes/size/%d/%+d/%v", size, delta, existing)
						var before []byte
						if existing {
							before = old
							if err := s.Put(ctx, key, old); err != nil {
								t.Fatal(err)
							}
						}
						if st.uploads != nil {
							st.uploads.counts()
						}
						err := s.PutStream(ctx, key, newPRNG(1, size+delta), size)
						if !errors.Is(err, errSize) || IsRetryable(err) {
							t.Fatalf("PutStream of %d bytes given %d = %v; want a terminal size mismatch", size+delta, size, err)
						}
						if st.uploads != nil {
							checkAborted(t, st.uploads, size)
						}
						checkUnchanged(t, s, key, before)
					}
				}
			}
			st.clean(t)
		})
	}
}

// cancelAfter cancels its context once it passed at bytes of r, and reads on.
type cancelAfter struct {
	r      io.Reader
	at     int64
	cancel context.CancelFunc
}

func (c *cancelAfter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if c.at -= int64(n); c.at <= 0 {
		c.cancel()
	}
	return n, err
}

// Property: cancelling the context of a PutStream midway fails it with context.Canceled and
// stores nothing (S3 aborts the multipart upload despite the cancelled context).
func TestPutStreamCancelledStoresNothing(t *testing.T) {
	for _, st := range streamStores(t) {
		t.Run(st.name, func(t *testing.T) {
			for _, size := range []int64{smallSize, largeSize} {
				ctx, cancel := context.WithCancel(context.Background())
				key := fmt.Sprintf("scenes/cancel/%d", size)
				r := &cancelAfter{r: newPRNG(1, size), at: size * 3 / 4, cancel: cancel}
				err := st.store.PutStream(ctx, key, r, size)
				cancel()
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("PutStream of %d bytes cancelled midway = %v", size, err)
				}
				checkUnchanged(t, st.store, key, nil)
			}
			st.clean(t)
		})
	}
}

// Property: Open of a missing key, of a key prefix and of a path through an object fails at
// Open with ErrNotFound, and of a bad key with ErrBadKey; Counting records both new requests.
func TestOpenMissing(t *testing.T) {
	ctx := context.Background()
	for _, st := range streamStores(t) {
		t.Run(st.name, func(t *testing.T) {
			s := st.store
			if err := s.Put(ctx, "scenes/dir/obj", []byte("x")); err != nil {
				t.Fatal(err)
			}
			for _, key := range []string{"scenes/missing", "scenes/dir", "scenes/dir/obj/below"} {
				rc, _, err := s.Open(ctx, key)
				if !errors.Is(err, ErrNotFound) || rc != nil || !strings.Contains(err.Error(), key) {
					t.Fatalf("Open(%q) = %v, %v; want ErrNotFound naming the key", key, rc, err)
				}
			}
			if _, _, err := s.Open(ctx, "../escape"); !errors.Is(err, ErrBadKey) {
				t.Fatalf("Open of a bad key = %v, want ErrBadKey", err)
			}
			c := NewCounting(s)
			if err := c.PutStream(ctx, "scenes/counted", strings.NewReader("abc"), 3); err != nil {
				t.Fatal(err)
			}
			rc, _, err := c.Open(ctx, "scenes/counted")
			if err != nil {
				t.Fatal(err)
			}
			if got, err := io.ReadAll(rc); err != nil || string(got) != "abc" {
				t.Fatalf("read %q, %v", got, err)
			}
			rc.Close()
			if got, want := fmt.Sprint(c.Requests()), "[{PutStream scenes/counted} {Open scenes/counted}]"; got != want {
				t.Fatalf("Counting recorded %s, want %s", got, want)
			}
		})
	}
}

// Property: a read through Open fails once its context is cancelled, on either store.
func TestOpenHonoursContext(t *testing.T) {
	for _, st := range streamStores(t) {
		t.Run(st.name, func(t *testing.T) {
			if err := st.store.PutStream(context.Background(), "scenes/ctx", newPRNG(1, largeSize), largeSize); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			rc, _, err := st.store.Open(ctx, "scenes/ctx")
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			if _, err := io.ReadFull(rc, make([]byte, 1<<20)); err != nil {
				t.Fatal(err)
			}
			cancel()
			if _, err := io.Copy(io.Discard, rc); !errors.Is(err, context.Canceled) {
				t.Fatalf("reading on after cancel = %v, want context.Canceled", err)
			}
		})
	}
}

// Property: a multipart PutStream damaged on the way fails as Put does, with a retryable
// ErrVerify, and leaves neither an object nor an incomplete upload.
func TestS3PutStreamDamagedOnTheWay(t *testing.T) {
	srv := miniotest.Start(t)
	d := &damaging{}
	ctx := context.Background()
	s, err := newS3Store(ctx, srv.Endpoint, srv.Bucket, false, srv.AccessKey, srv.SecretKey,
		func(next http.RoundTripper) http.RoundTripper { d.next = next; return d })
	if err != nil {
		t.Fatal(err)
	}
	d.armed.Store(true)
	for _, size := range []int64{smallSize, largeSize} {
		key := fmt.Sprintf("scenes/damaged/%d", size)
		err := s.PutStream(ctx, key, newPRNG(1, size), size)
		if !errors.Is(err, ErrVerify) || !IsRetryable(err) {
			t.Fatalf("a damaged PutStream of %d bytes = %v, want a retryable ErrVerify", size, err)
		}
		checkUnchanged(t, s, key, nil)
	}
	if d.hits.Load() < 2 {
		t.Fatalf("%d uploads damaged, want both", d.hits.Load())
	}
	noIncompleteUploads(t, s)
}

// allocated is the bytes the process allocated while f ran.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// Property: PutStream and a read through Open stream: moving 64 MiB allocates far less than
// 64 MiB, about one copy buffer (copyBufSize) on the filesystem and one part (s3PartSize) on
// S3. The bounds leave room (16 MiB, two parts) yet stay under what holding the object takes.
func TestStreamingMemoryIsBounded(t *testing.T) {
	const size = 64 << 20
	ctx := context.Background()
	bounds := map[string]uint64{"fs": 16 << 20, "s3": 2 * s3PartSize}
	for _, st := range streamStores(t) {
		t.Run(st.name, func(t *testing.T) {
			var err error
			put := allocated(func() { err = st.store.PutStream(ctx, "scenes/big", newPRNG(3, size), size) })
			if err != nil {
				t.Fatal(err)
			}
			var got [32]byte
			get := allocated(func() {
				var rc io.ReadCloser
				if rc, _, err = st.store.Open(ctx, "scenes/big"); err != nil {
					return
				}
				defer rc.Close()
				h := sha256.New()
				if _, err = io.CopyBuffer(h, struct{ io.Reader }{rc}, make([]byte, 1<<20)); err == nil {
					got = [32]byte(h.Sum(nil))
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			if got != digestOf(t, 3, size) {
				t.Fatal("read back other content than was put")
			}
			t.Logf("%s: PutStream of 64 MiB allocated %.1f MiB, reading it through Open %.1f MiB",
				st.name, float64(put)/(1<<20), float64(get)/(1<<20))
			if bound := bounds[st.name]; put > bound || get > bound {
				t.Fatalf("moving 64 MiB allocated %d bytes to put and %d to read, want at most %d each", put, get, bound)
			}
		})
	}
}

// Property: the part size of a streamed upload is s3PartSize until S3's part count would not
// do, and always enough parts for the size.
func TestS3PartSizeFor(t *testing.T) {
	for _, size := range []int64{0, 1, s3PartSize, s3PartSize * s3MaxParts, s3PartSize*s3MaxParts + 1, 1 << 40, 5 << 40} {
		p := s3PartSizeFor(size)
		if p < s3PartSize || uint64(size) > p*s3MaxParts || (size <= s3PartSize*s3MaxParts && p != s3PartSize) {
			t.Errorf("s3PartSizeFor(%d) = %d", size, p)
		}
		if p%(1<<20) != 0 {
			t.Errorf("s3PartSizeFor(%d) = %d, not whole MiB", size, p)
		}
	}
}
