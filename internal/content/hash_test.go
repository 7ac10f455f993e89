package content

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

func TestValidSHA256(t *testing.T) {
	good := refOf([]byte("x")).SHA256
	tests := []struct {
		s    string
		want bool
	}{
		{good, true},
		{strings.Repeat("0", 64), true},
		{strings.ToUpper(good), false},
		{good[:63], false},
		{good + "0", false},
		{strings.Repeat("g", 64), false},
		{"", false},
		{strings.Repeat("é", 32), false},
	}
	for _, tt := range tests {
		if got := ValidSHA256(tt.s); got != tt.want {
			t.Errorf("ValidSHA256(%q) = %v, want %v", tt.s, got, tt.want)
		}
	}
}

func TestHashFile(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		size int
	}{
		{"empty", 0},
		{"one byte", 1},
		{"small", 1000},
		{"one buffer", bufSize},
		{"one buffer and a byte", bufSize + 1},
		{"several buffers", 3*bufSize + bufSize/2},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := pattern(tt.size, byte(i))
			p := writeFile(t, dir, fmt.Sprintf("f%d", i), data)
			got, err := HashFile(context.Background(), p)
			if err != nil {
				t.Fatal(err)
			}
			if want := refOf(data); got != want {
				t.Errorf("HashFile = %+v, want %+v", got, want)
			}
		})
	}
}

func TestHashFileErrors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.exr")
	_, err := HashFile(context.Background(), missing)
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Errorf("HashFile(missing) = %v, want fs.ErrNotExist naming %s", err, missing)
	}
	if n := strings.Count(err.Error(), missing); n != 1 {
		t.Errorf("error %q names the path %d times, want once", err, n)
	}

	p := writeFile(t, dir, "f", pattern(100, 1))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := HashFile(ctx, p); !errors.Is(err, context.Canceled) {
		t.Errorf("HashFile(cancelled) = %v, want context.Canceled", err)
	}
}

// files writes n files of different sizes and returns their paths and contents.
func files(t *testing.T, n int) ([]string, [][]byte) {
	t.Helper()
	dir := t.TempDir()
	paths := make([]string, n)
	datas := make([][]byte, n)
	for i := range n {
		datas[i] = pattern((i*7919)%(bufSize/4)+i, byte(i))
		paths[i] = writeFile(t, dir, fmt.Sprintf("f%03d", i), datas[i])
	}
	return paths, datas
}

func TestHashFiles(t *testing.T) {
	paths, datas := files(t, 40)
	var total int64
	for _, d := range datas {
		total += int64(len(d))
	}
	for _, parallel := range []int{-1, 0, 1, 3, 8, 100} {
		t.Run(fmt.Sprintf("parallel %d", parallel), func(t *testing.T) {
			var p Progress
			refs, err := HashFiles(context.Background(), paths, parallel, &p)
			if err != nil {
				t.Fatal(err)
			}
			if len(refs) != len(paths) {
				t.Fatalf("%d refs for %d paths", len(refs), len(paths))
			}
			for i, r := range refs {
				if want := refOf(datas[i]); r != want {
					t.Errorf("refs[%d] = %+v, want %+v (of %s)", i, r, want, paths[i])
				}
			}
			if b, f := p.Snapshot(); b != total || f != int64(len(paths)) {
				t.Errorf("progress = %d bytes %d files, want %d bytes %d files", b, f, total, len(paths))
			}
		})
	}
	t.Run("nil progress", func(t *testing.T) {
		if _, err := HashFiles(context.Background(), paths, 4, nil); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("no paths", func(t *testing.T) {
		refs, err := HashFiles(context.Background(), nil, 4, nil)
		if err != nil || len(refs) != 0 {
			t.Fatalf("HashFiles(nil) = %v, %v", refs, err)
		}
	})
}

func TestHashFilesMissingNamesPath(t *testing.T) {
	paths, _ := files(t, 20)
	missing := filepath.Join(t.TempDir(), "gone.png")
	paths[11] = missing
	for _, parallel := range []int{1, 4} {
		refs, err := HashFiles(context.Background(), paths, parallel, nil)
		if err == nil {
			t.Fatalf("parallel %d: HashFiles with a missing file = %v, nil", parallel, refs)
		}
		if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), missing) {
			t.Errorf("parallel %d: error %v, want fs.ErrNotExist naming %s", parallel, err, missing)
		}
	}
}

func TestHashFilesFirstErrorCancelsRest(t *testing.T) {
	paths, _ := files(t, 30)
	paths[0] = filepath.Join(t.TempDir(), "gone.png")
	var p Progress
	if _, err := HashFiles(context.Background(), paths, 1, &p); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("HashFiles = %v, want fs.ErrNotExist", err)
	}
	if b, f := p.Snapshot(); b != 0 || f != 0 {
		t.Errorf("after the first file failed, %d bytes of %d files were hashed, want none", b, f)
	}
}

func TestHashFilesCancelled(t *testing.T) {
	paths, _ := files(t, 10)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var p Progress
	_, err := HashFiles(ctx, paths, 4, &p)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("HashFiles(cancelled) = %v, want context.Canceled", err)
	}
	if _, f := p.Snapshot(); f != 0 {
		t.Errorf("%d files hashed with a cancelled context", f)
	}
}

// TestHashFileMemory checks a big file is streamed, not read whole.
func TestHashFileMemory(t *testing.T) {
	const size = 64 << 20
	p := filepath.Join(t.TempDir(), "big")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	chunk := pattern(1<<20, 7)
	for range size / len(chunk) {
		if _, err := f.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	ref, err := HashFile(context.Background(), p)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if ref.Size != size {
		t.Fatalf("size %d, want %d", ref.Size, size)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew >= 8<<20 {
		t.Errorf("hashing a 64 MiB file allocated %d bytes, want < 8 MiB", grew)
	} else {
		t.Logf("hashing a 64 MiB file allocated %d bytes", grew)
	}
}
