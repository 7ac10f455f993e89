package content

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"runtime"
	"sync"
	"sync/atomic"

	fanout "github.com/tilefarm/tilefarm/internal/flight"
)

// bufSize is the chunk files are hashed in: large enough that a read is not dominated by its
// system call, small enough that a node hashing on every core holds a few MiB.
const bufSize = 1 << 20

// bufPool holds the hashing buffers, so hashing thousands of files allocates a handful.
var bufPool = sync.Pool{New: func() any { b := make([]byte, bufSize); return &b }}

// HashFile streams the file at path through SHA-256 and returns its Ref. It reads in fixed
// 1 MiB chunks from a pool, never the whole file, so it hashes a 50 GB cache as cheaply as a
// thumbnail, and it stops between chunks when ctx is done. Its errors name the path.
func HashFile(ctx context.Context, path string) (Ref, error) {
	return hashFile(ctx, path, nil)
}

// hashFile is HashFile reporting each chunk to p (nil: none).
func hashFile(ctx context.Context, path string, p *Progress) (Ref, error) {
	ref, err := hashPath(ctx, path, p)
	if err != nil {
		return Ref{}, fmt.Errorf("hash %s: %w", path, err)
	}
	return ref, nil
}

// hashPath does hashFile's work; its errors leave the path out, for hashFile to name once.
func hashPath(ctx context.Context, path string, p *Progress) (Ref, error) {
	if err := ctx.Err(); err != nil {
		return Ref{}, err
	}
	f, err := os.Open(path)
	if err != nil {
		return Ref{}, unpath(err)
	}
	defer f.Close()
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	h := sha256.New()
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return Ref{}, err
		}
		k, err := f.Read(buf)
		if k > 0 {
			h.Write(buf[:k])
			n += int64(k)
			p.Add(int64(k))
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return Ref{}, unpath(err)
		}
	}
	return Ref{SHA256: hex.EncodeToString(h.Sum(nil)), Size: n}, nil
}

// unpath drops the path from an *fs.PathError (keeping its operation and cause, so errors.Is
// still finds fs.ErrNotExist), for a caller that names the path itself.
func unpath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", pe.Op, pe.Err)
	}
	return err
}

// Progress counts the bytes and files done, for a progress bar drawn while HashFiles works.
// Its counters are atomic, so hashing goroutines add to it while another reads it. The zero
// value is ready; methods on a nil *Progress do nothing.
type Progress struct {
	bytes, files atomic.Int64
}

// Add counts n more bytes done.
func (p *Progress) Add(n int64) {
	if p != nil {
		p.bytes.Add(n)
	}
}

// FileDone counts one more file done.
func (p *Progress) FileDone() {
	if p != nil {
		p.files.Add(1)
	}
}

// Snapshot returns the bytes and files done so far.
func (p *Progress) Snapshot() (bytes, files int64) {
	if p == nil {
		return 0, 0
	}
	return p.bytes.Load(), p.files.Load()
}

// HashFiles hashes paths with up to parallel goroutines (parallel <= 0: runtime.NumCPU()),
// since hashing thousands of scene files one by one leaves a submitter's cores and disks idle.
// It reports each chunk hashed and each file finished to p (p may be nil) and returns the
// refs in the order of paths. The first error cancels the rest and is returned, naming its
// path.
func HashFiles(ctx context.Context, paths []string, parallel int, p *Progress) ([]Ref, error) {
	if parallel <= 0 {
		parallel = runtime.NumCPU()
	}
	refs := make([]Ref, len(paths))
	err := fanout.Each(ctx, len(paths), parallel, func(ctx context.Context, i int) error {
		ref, err := hashFile(ctx, paths[i], p)
		if err != nil {
			return err
		}
		refs[i] = ref
		p.FileDone()
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("hash files: %w", err)
	}
	return refs, nil
}
