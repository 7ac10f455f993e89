package worker

import (
	"context"
	"errors"
	"fmt"
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

// countingGets counts Get calls on a store.
type countingGets struct {
	objstore.Store
	mu   sync.Mutex
	gets map[string]int
}

func (c *countingGets) Get(ctx context.Context, key string) ([]byte, error) {
	c.mu.Lock()
	c.gets[key]++
	c.mu.Unlock()
	time.Sleep(20 * time.Millisecond) // a download takes a while: concurrent callers overlap
	return c.Store.Get(ctx, key)
}

// The process's parsed-scene cache is bounded in memory, backed by a disk cache keyed by
// scene_version, loads a scene once however many slots ask at once, and never trusts a
// corrupt cached file.
func TestScenes(t *testing.T) {
	ctx := context.Background()
	fs, err := objstore.NewFSStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	objects := &countingGets{Store: fs, gets: map[string]int{}}
	base, err := jsonscene.ReadFile("../../examples/cornell/scene.json")
	if err != nil {
		t.Fatal(err)
	}
	var versions []string
	for i := range maxCachedScenes + 2 {
		b := *base
		b.Scene = append([]byte(strings.Repeat(" ", i)), base.Scene...) // same scene, another version
		if err := objects.Put(ctx, layout.SceneKey(b.Version()), b.Encode()); err != nil {
			t.Fatal(err)
		}
		versions = append(versions, b.Version())
	}
	cache := t.TempDir()
	scenes := NewScenes(objects, cache, scene.Kinds{jsonscene.Kind{}}, slog.New(slog.DiscardHandler))
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := scenes.Get(ctx, versions[0]); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if n := objects.gets[layout.SceneKey(versions[0])]; n != 1 {
		t.Fatalf("8 slots asking at once downloaded the scene %d times, want once", n)
	}
	for _, v := range versions {
		if _, err := scenes.Get(ctx, v); err != nil {
			t.Fatalf("scene %s: %v", v, err)
		}
	}
	if scenes.parsed.Len() != maxCachedScenes {
		t.Fatalf("%d scenes in memory, want at most %d", scenes.parsed.Len(), maxCachedScenes)
	}
	for _, v := range versions {
		if _, err := os.Stat(filepath.Join(cache, v+".tfb")); err != nil {
			t.Fatalf("scene %s not cached on disk: %v", v, err)
		}
	}
	// The evicted first scene comes back from disk even with the store gone.
	if err := objects.Delete(ctx, layout.SceneKey(versions[0])); err != nil {
		t.Fatal(err)
	}
	if _, err := scenes.Get(ctx, versions[0]); err != nil {
		t.Fatalf("scene from the disk cache: %v", err)
	}
	// A corrupt cached copy is never trusted.
	if err := os.WriteFile(filepath.Join(cache, versions[1]+".tfb"), []byte("TFBUNDLE\x01garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	scenes.parsed.Forget(versions[1])
	if err := objects.Delete(ctx, layout.SceneKey(versions[1])); err != nil {
		t.Fatal(err)
	}
	if _, err := scenes.Get(ctx, versions[1]); !errors.Is(err, objstore.ErrNotFound) || !failure.IsTerminal(err) {
		t.Fatalf("corrupt cache and no stored scene: %v, want a terminal not-found", err)
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
