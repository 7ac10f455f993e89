package content

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
)

// refOf is the Ref of data, by crypto/sha256 directly.
func refOf(data []byte) Ref {
	sum := sha256.Sum256(data)
	return Ref{SHA256: hex.EncodeToString(sum[:]), Size: int64(len(data))}
}

// pattern is n deterministic bytes, different for each seed.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31) ^ seed ^ byte(i>>8)
	}
	return b
}

func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// listFiles is every non-directory under dir, relative and slash-separated, sorted.
func listFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

// store is an object store for tests: content by hash, counting the fetches of each.
type store struct {
	mu      sync.Mutex
	content map[string][]byte
	fetches map[string]*atomic.Int64
}

func newStore(datas ...[]byte) (*store, []Ref) {
	s := &store{content: map[string][]byte{}, fetches: map[string]*atomic.Int64{}}
	refs := make([]Ref, len(datas))
	for i, d := range datas {
		refs[i] = s.put(d)
	}
	return s, refs
}

func (s *store) put(d []byte) Ref {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := refOf(d)
	s.content[r.SHA256] = d
	if s.fetches[r.SHA256] == nil {
		s.fetches[r.SHA256] = new(atomic.Int64)
	}
	return r
}

func (s *store) fetch(ctx context.Context, ref Ref, w io.Writer) error {
	s.mu.Lock()
	d, ok := s.content[ref.SHA256]
	n := s.fetches[ref.SHA256]
	s.mu.Unlock()
	if !ok {
		return fs.ErrNotExist
	}
	n.Add(1)
	_, err := io.Copy(w, bytes.NewReader(d))
	return err
}

func (s *store) count(ref Ref) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fetches[ref.SHA256].Load()
}
