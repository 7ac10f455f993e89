package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/checkpoint"
	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/failure"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/internal/scene/jsonscene"
	"github.com/tilefarm/tilefarm/internal/wire"
	"github.com/tilefarm/tilefarm/objstore"
	"github.com/tilefarm/tilefarm/render"
)

func validJob(t *testing.T) wire.TileJob {
	t.Helper()
	st := render.Settings{Camera: "main", Width: 64, Height: 32, SPP: 4, MaxDepth: 4, Seed: 1}
	fk := identity.FrameKey("sv", st.Camera, 3, identity.SettingsHash(st))
	r := render.Rect{X0: 32, X1: 64, Y1: 32}
	return wire.TileJob{TileKey: identity.TileKey(fk, r), FrameKey: fk, SceneVersion: "sv", Settings: st, Frame: 3,
		Rect: r, InputHash: identity.InputHash("sv", st, 3, r)}
}

func TestCheckIdentityRejectsForeignJobs(t *testing.T) {
	if err := checkIdentity(validJob(t)); err != nil {
		t.Fatalf("a job made by this build: %v", err)
	}
	for name, mutate := range map[string]func(*wire.TileJob){
		"input hash": func(j *wire.TileJob) { j.InputHash = strings.Repeat("0", 64) },
		"settings":   func(j *wire.TileJob) { j.Settings.SPP++ },
		"rect":       func(j *wire.TileJob) { j.Rect.X1-- },
		"frame":      func(j *wire.TileJob) { j.Frame++ },
		"tile key":   func(j *wire.TileJob) { j.TileKey = strings.Repeat("1", 64) },
	} {
		j := validJob(t)
		mutate(&j)
		if err := checkIdentity(j); !failure.IsTerminal(err) || !strings.Contains(err.Error(), "build mismatch") {
			t.Errorf("%s changed: %v, want a terminal build mismatch", name, err)
		}
	}
}

// countingGets counts Get and Open calls on a store, by key.
type countingGets struct {
	objstore.Store
	mu   sync.Mutex
	gets map[string]int
}

func (c *countingGets) count(key string) {
	c.mu.Lock()
	c.gets[key]++
	c.mu.Unlock()
	time.Sleep(20 * time.Millisecond) // a download takes a while: concurrent callers overlap
}

func (c *countingGets) Get(ctx context.Context, key string) ([]byte, error) {
	c.count(key)
	return c.Store.Get(ctx, key)
}

func (c *countingGets) Open(ctx context.Context, key string) (io.ReadCloser, objstore.ObjectInfo, error) {
	c.count(key)
	return c.Store.Open(ctx, key)
}

func (c *countingGets) n(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gets[key]
}

// storeScene puts scene b in objects as a coordinator leaves it: each file under its hash,
// then the manifest.
func storeScene(tb testing.TB, objects objstore.Store, b *bundle.Bundle) {
	tb.Helper()
	ctx := context.Background()
	for _, name := range b.Names() {
		f := b.Files[name]
		r, err := b.Open(ctx, name)
		if err != nil {
			tb.Fatal(err)
		}
		err = objects.PutStream(ctx, layout.ContentKey(f.SHA256), r, f.Size)
		r.Close()
		if err != nil {
			tb.Fatal(err)
		}
	}
	if err := objects.Put(ctx, layout.SceneKey(b.Version()), b.Encode()); err != nil {
		tb.Fatal(err)
	}
}

// newScenes is NewScenes that must succeed.
func newScenes(tb testing.TB, objects objstore.Store, dir string, kinds scene.Kinds) *Scenes {
	tb.Helper()
	s, err := NewScenes(objects, dir, kinds, slog.New(slog.DiscardHandler))
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// The process's parsed-scene cache is bounded in memory, loads a scene once however many slots
// ask at once, and its files come by content through the node's cache: fetched once, kept on
// disk by hash, and never trusted once damaged there (docs/design.md, "Scenes by content").
func TestScenes(t *testing.T) {
	ctx := context.Background()
	fs, err := objstore.NewFSStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	objects := &countingGets{Store: fs, gets: map[string]int{}}
	base, err := jsonscene.ReadFile(ctx, "../../examples/shot/scene.json")
	if err != nil {
		t.Fatal(err)
	}
	var versions []string
	for i := range maxCachedScenes + 2 {
		b := *base
		b.Scene = append([]byte(strings.Repeat(" ", i)), base.Scene...) // same scene, another version
		storeScene(t, objects, &b)
		versions = append(versions, b.Version())
	}
	names := base.Names()
	if len(names) == 0 {
		t.Fatal("the example scene names no files")
	}
	mesh := base.Files[names[0]]
	cache := t.TempDir()
	scenes := newScenes(t, objects, cache, scene.Kinds{jsonscene.Kind{}})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if _, err := scenes.Get(ctx, versions[0]); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := objects.n(layout.SceneKey(versions[0])); n != 1 {
		t.Fatalf("8 slots asking at once downloaded the scene's manifest %d times, want once", n)
	}
	for _, v := range versions {
		if _, err := scenes.Get(ctx, v); err != nil {
			t.Fatalf("scene %s: %v", v, err)
		}
	}
	if n := objects.n(layout.ContentKey(mesh.SHA256)); n != 1 {
		t.Fatalf("%d scenes sharing one mesh downloaded it %d times, want once", len(versions), n)
	}
	if scenes.parsed.Len() != maxCachedScenes {
		t.Fatalf("%d scenes in memory, want at most %d", scenes.parsed.Len(), maxCachedScenes)
	}
	cached := filepath.Join(cache, "content", mesh.SHA256[:2], mesh.SHA256)
	if _, err := os.Stat(cached); err != nil {
		t.Fatalf("the mesh is not kept on disk by its hash: %v", err)
	}
	// The evicted first scene loads again from the node's copy with the store's gone.
	if err := objects.Delete(ctx, layout.ContentKey(mesh.SHA256)); err != nil {
		t.Fatal(err)
	}
	if _, err := scenes.Get(ctx, versions[0]); err != nil {
		t.Fatalf("scene from the content cache: %v", err)
	}
	// A damaged copy is never trusted: a new process (a restarted worker) hashes it before its
	// first use, and with no copy in the store the scene's file is a terminal not-found.
	if err := os.WriteFile(cached, []byte(strings.Repeat("x", int(mesh.Size))), 0o644); err != nil {
		t.Fatal(err)
	}
	again := newScenes(t, objects, cache, scene.Kinds{jsonscene.Kind{}})
	if _, err := again.Get(ctx, versions[1]); !errors.Is(err, objstore.ErrNotFound) || !failure.IsTerminal(err) {
		t.Fatalf("a damaged cached file and none in the store: %v, want a terminal not-found", err)
	}
	if err := objects.Delete(ctx, layout.SceneKey(versions[2])); err != nil {
		t.Fatal(err)
	}
	if _, err := again.Get(ctx, versions[2]); !errors.Is(err, objstore.ErrNotFound) || !failure.IsTerminal(err) {
		t.Fatalf("no stored manifest: %v, want a terminal not-found", err)
	}
}

func TestPruneCheckpointsDropsOnlyPromotedTiles(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	objects, err := objstore.NewFSStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ckpts, err := checkpoint.OpenLocal(filepath.Join(t.TempDir(), "c.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer ckpts.Close()
	done, live, fk := strings.Repeat("a", 64), strings.Repeat("b", 64), strings.Repeat("f", 64)
	for _, k := range []string{done, live} {
		if err := ckpts.Save(ctx, checkpoint.Checkpoint{TileKey: k, FrameKey: fk, InputHash: "h", Next: 1, Sum: []float64{1, 2, 3}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := finalize.Promote(ctx, objects, layout.TileManifestKey(fk, done), "att", "build",
		[]finalize.Output{{Name: layout.TileOutputName, Data: []byte("px")}}, nil); err != nil {
		t.Fatal(err)
	}
	go PruneCheckpoints(ctx, ckpts, objects, time.Hour, slog.New(slog.DiscardHandler))
	deadline := time.Now().Add(10 * time.Second)
	for {
		keys, _ := ckpts.List(ctx)
		if len(keys) == 1 && keys[0] == live {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("checkpoints left: %v, want only the unfinished tile", keys)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestErrorCodeClassifiesFailures(t *testing.T) {
	storage := objstore.IsRetryable
	cases := map[string]struct {
		err  error
		want string
	}{
		"terminal": {failure.Terminalf("bad scene"), failure.CodeTerminal},
		"panic":    {fmt.Errorf("rendering: %w", &failure.PanicError{Value: "boom"}), failure.CodePanic},
		"storage":  {fmt.Errorf("promoting tile: %w", syscall.ECONNREFUSED), failure.CodeStorage},
		"other":    {errors.New("publishing start event: timeout"), failure.CodeRetryable},
	}
	for name, c := range cases {
		if got := failure.Classify(c.err, storage); got != c.want {
			t.Errorf("%s: ErrorCode = %q, want %q", name, got, c.want)
		}
	}
}

// flakyOpens fails the first Open of each content object with a transient error.
type flakyOpens struct {
	objstore.Store
	mu     sync.Mutex
	failed map[string]bool
}

func (f *flakyOpens) Open(ctx context.Context, key string) (io.ReadCloser, objstore.ObjectInfo, error) {
	f.mu.Lock()
	first := strings.HasPrefix(key, layout.ContentPrefix) && !f.failed[key]
	if first {
		f.failed[key] = true
	}
	f.mu.Unlock()
	if first {
		return nil, objstore.ObjectInfo{}, fmt.Errorf("connection reset by peer")
	}
	return f.Store.Open(ctx, key)
}

// Property: a scene file the store fails to hand over for a moment is the node's trouble, not
// the scene's: loading is retried (not terminal, so the tile is not dead-lettered), and works
// once the store answers.
func TestSceneFetchFailureIsRetried(t *testing.T) {
	ctx := context.Background()
	fs, err := objstore.NewFSStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b, err := jsonscene.ReadFile(ctx, "../../examples/shot/scene.json")
	if err != nil {
		t.Fatal(err)
	}
	storeScene(t, fs, b)
	flaky := &flakyOpens{Store: fs, failed: map[string]bool{}}
	for name, dir := range map[string]string{"through the node's cache": t.TempDir(), "straight from the store": ""} {
		scenes := newScenes(t, flaky, dir, scene.Kinds{jsonscene.Kind{}})
		clear(flaky.failed)
		if _, err := scenes.Get(ctx, b.Version()); err == nil || failure.IsTerminal(err) {
			t.Fatalf("%s: a store failing once: %v, want a retryable error", name, err)
		}
		if _, err := scenes.Get(ctx, b.Version()); err != nil {
			t.Fatalf("%s: once the store answers: %v", name, err)
		}
	}
}
