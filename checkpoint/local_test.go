package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/tilefarm/tilefarm/internal/logtest"
)

func openTestStore(t *testing.T, path string) *Local {
	t.Helper()
	s, err := OpenLocal(path)
	if err != nil {
		t.Fatalf("OpenCheckpointStore: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func storeCheckpoint(key string, n int) Checkpoint {
	ck := sampleCheckpoint(n, uint64(len(key)+n))
	ck.TileKey = key
	return ck
}

func TestCheckpointStoreSaveLoadDeleteList(t *testing.T) {
	ctx := context.Background()
	s := openTestStore(t, filepath.Join(t.TempDir(), "sub", "ckpt.db"))

	if _, ok, err := s.Load(ctx, "missing"); ok || err != nil {
		t.Fatalf("Load of missing key = %v, %v", ok, err)
	}
	if keys, err := s.List(ctx); err != nil || len(keys) != 0 {
		t.Fatalf("List of empty store = %v, %v", keys, err)
	}

	a, b := storeCheckpoint("tile-a", 64*64*3), storeCheckpoint("tile-b", 5)
	for _, ck := range []Checkpoint{b, a} {
		if err := s.Save(ctx, ck); err != nil {
			t.Fatalf("Save %s: %v", ck.TileKey, err)
		}
	}
	got, ok, err := s.Load(ctx, "tile-a")
	if err != nil || !ok {
		t.Fatalf("Load tile-a = %v, %v", ok, err)
	}
	assertSameCheckpoint(t, got, a)
	if !got.Matches("tile-a", a.InputHash) || got.Matches("tile-a", "other") || got.Matches("tile-b", a.InputHash) {
		t.Error("Matches gives wrong answers")
	}
	if keys, err := s.List(ctx); err != nil || !slices.Equal(keys, []string{"tile-a", "tile-b"}) {
		t.Fatalf("List = %v, %v", keys, err)
	}

	// Save replaces the earlier checkpoint of the same tile.
	a2 := a
	a2.Next, a2.Sum = a.Next+64, []float64{42}
	if err := s.Save(ctx, a2); err != nil {
		t.Fatal(err)
	}
	got, ok, err = s.Load(ctx, "tile-a")
	if err != nil || !ok {
		t.Fatalf("Load after overwrite = %v, %v", ok, err)
	}
	assertSameCheckpoint(t, got, a2)

	if err := s.Delete(ctx, "tile-a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "tile-a"); err != nil {
		t.Fatalf("deleting an absent checkpoint: %v", err)
	}
	if _, ok, err := s.Load(ctx, "tile-a"); ok || err != nil {
		t.Fatalf("Load after Delete = %v, %v", ok, err)
	}
	if keys, err := s.List(ctx); err != nil || !slices.Equal(keys, []string{"tile-b"}) {
		t.Fatalf("List after Delete = %v, %v", keys, err)
	}

	if err := s.Save(ctx, Checkpoint{}); err == nil {
		t.Error("Save with empty tile key succeeded")
	}
	if err := s.Save(ctx, Checkpoint{TileKey: "bad", Next: -1}); err == nil {
		t.Error("Save of an unencodable checkpoint succeeded")
	}
}

func TestCheckpointStoreReopenKeepsData(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ckpt.db")
	want := storeCheckpoint("tile-x", 300)

	s, err := OpenLocal(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Save(ctx, want); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, _, err := s.Load(ctx, "tile-x"); !errors.Is(err, ErrClosed) {
		t.Errorf("Load on closed store: %v", err)
	}
	if err := s.Save(ctx, want); !errors.Is(err, ErrClosed) {
		t.Errorf("Save on closed store: %v", err)
	}

	s2 := openTestStore(t, path)
	got, ok, err := s2.Load(ctx, "tile-x")
	if err != nil || !ok {
		t.Fatalf("Load after reopen = %v, %v", ok, err)
	}
	assertSameCheckpoint(t, got, want)
}

func TestCheckpointStoreLockedByAnother(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ckpt.db")
	s := openTestStore(t, path)

	start := time.Now()
	s2, err := openLocal(path, 200*time.Millisecond)
	if err == nil {
		s2.Close()
		t.Fatal("second open of a held store succeeded")
	}
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("error %v does not wrap ErrCheckpointStoreLocked", err)
	}
	if !strings.Contains(err.Error(), path) {
		t.Errorf("error %q does not name the path", err)
	}
	if time.Since(start) > 10*time.Second {
		t.Errorf("lock wait took %v; the timeout is not applied", time.Since(start))
	}

	// Once the holder closes, the lock is free again.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s3, err := openLocal(path, 200*time.Millisecond)
	if err != nil {
		t.Fatalf("open after release: %v", err)
	}
	s3.Close()
}

// putRaw writes value under key directly with bbolt, bypassing the codec,
// to simulate damage on disk. The store must be closed.
func putRaw(t *testing.T, path, key string, value []byte) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte(checkpointBucket)).Put([]byte(key), value)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// captureLogs points slog's default logger at a buffer for the test.
func captureLogs(t *testing.T) *logtest.Buffer {
	t.Helper()
	buf := &logtest.Buffer{}
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(buf, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })
	return buf
}

func TestCheckpointStoreDiscardsCorrupt(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ckpt.db")
	logs := captureLogs(t)

	codec := newTestCodec(t)
	good, err := codec.Encode(storeCheckpoint("tile-good", 50))
	if err != nil {
		t.Fatal(err)
	}
	flipped := bytes.Clone(good)
	flipped[len(flipped)/2] ^= 0x20
	wrongTile, err := codec.Encode(storeCheckpoint("tile-other", 5))
	if err != nil {
		t.Fatal(err)
	}

	s, err := OpenLocal(path)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	damaged := map[string][]byte{
		"tile-garbage":   []byte("not a checkpoint"),
		"tile-flipped":   flipped,
		"tile-truncated": good[:len(good)-7],
		"tile-misfiled":  wrongTile, // valid, but names another tile
	}
	for k, v := range damaged {
		putRaw(t, path, k, v)
	}
	putRaw(t, path, "tile-good", good)

	s = openTestStore(t, path)
	for k := range damaged {
		ck, ok, err := s.Load(ctx, k)
		if err != nil || ok {
			t.Fatalf("Load of corrupt %s = %+v, %v, %v; want not found, no error", k, ck, ok, err)
		}
		if !strings.Contains(logs.String(), "tile_key="+k) {
			t.Errorf("discarding %s was not logged; logs:\n%s", k, logs.String())
		}
	}
	keys, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(keys, []string{"tile-good"}) {
		t.Fatalf("after loading corrupt checkpoints List = %v, want only tile-good", keys)
	}
	if _, ok, err := s.Load(ctx, "tile-good"); !ok || err != nil {
		t.Fatalf("intact checkpoint lost: %v, %v", ok, err)
	}
}

func TestCheckpointStoreHonoursContext(t *testing.T) {
	s := openTestStore(t, filepath.Join(t.TempDir(), "ckpt.db"))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Save(ctx, storeCheckpoint("k", 1)); !errors.Is(err, context.Canceled) {
		t.Errorf("Save with cancelled context: %v", err)
	}
	if _, _, err := s.Load(ctx, "k"); !errors.Is(err, context.Canceled) {
		t.Errorf("Load with cancelled context: %v", err)
	}
	if err := s.Delete(ctx, "k"); !errors.Is(err, context.Canceled) {
		t.Errorf("Delete with cancelled context: %v", err)
	}
	if _, err := s.List(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("List with cancelled context: %v", err)
	}
	if _, ok, err := s.Load(context.Background(), "k"); ok || err != nil {
		t.Errorf("a cancelled Save wrote anyway: %v, %v", ok, err)
	}
}

func TestCheckpointStoreConcurrent(t *testing.T) {
	ctx := context.Background()
	s := openTestStore(t, filepath.Join(t.TempDir(), "ckpt.db"))
	const workers, rounds = 4, 10
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("tile-%d", w)
			for i := 0; i < rounds; i++ {
				want := storeCheckpoint(key, 100+i)
				want.Next = i
				if err := s.Save(ctx, want); err != nil {
					errs <- err
					return
				}
				got, ok, err := s.Load(ctx, key)
				if err != nil || !ok || got.Next != i || len(got.Sum) != len(want.Sum) {
					errs <- fmt.Errorf("%s round %d: load = next %d, %d floats, %v, %v", key, i, got.Next, len(got.Sum), ok, err)
					return
				}
			}
			if err := s.Delete(ctx, key); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if keys, err := s.List(ctx); err != nil || len(keys) != 0 {
		t.Fatalf("List after concurrent work = %v, %v", keys, err)
	}
}
