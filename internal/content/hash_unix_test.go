//go:build unix

package content

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestHashFilesParallel shows HashFiles reads files at the same time: each path is a FIFO whose
// writer sends nothing until every FIFO has been opened by a reader, which only parallel
// readers can do.
func TestHashFilesParallel(t *testing.T) {
	const n = 4
	dir := t.TempDir()
	paths := make([]string, n)
	datas := make([][]byte, n)
	for i := range n {
		paths[i] = filepath.Join(dir, fmt.Sprintf("fifo%d", i))
		if err := syscall.Mkfifo(paths[i], 0o600); err != nil {
			t.Skipf("mkfifo: %v", err)
		}
		datas[i] = pattern(1000+i, byte(i))
	}
	var opened sync.WaitGroup
	opened.Add(n)
	all := make(chan struct{})
	go func() { opened.Wait(); close(all) }()
	var writers sync.WaitGroup
	for i := range n {
		writers.Go(func() {
			f, err := os.OpenFile(paths[i], os.O_WRONLY, 0) // blocks until a reader opens it
			if err != nil {
				t.Error(err)
				opened.Done()
				return
			}
			defer f.Close()
			opened.Done()
			select {
			case <-all:
			case <-time.After(10 * time.Second):
				t.Errorf("fifo %d: the other files were not opened while it was: not hashed in parallel", i)
			}
			f.Write(datas[i])
		})
	}
	refs, err := HashFiles(context.Background(), paths, n, nil)
	writers.Wait()
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range refs {
		if want := refOf(datas[i]); r != want {
			t.Errorf("refs[%d] = %+v, want %+v", i, r, want)
		}
	}
}
