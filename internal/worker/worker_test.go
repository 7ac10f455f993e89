package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/farm"
	"github.com/tilefarm/tilefarm/render"
	"github.com/tilefarm/tilefarm/tiles"
)

func validJob(t *testing.T) farm.TileJob {
	t.Helper()
	st := render.Settings{Camera: "main", Width: 64, Height: 32, SPP: 4, MaxDepth: 4, Seed: 1}
	fk := tiles.FrameKey("sv", st.Camera, 3, tiles.SettingsHash(st))
	r := render.Rect{X0: 32, X1: 64, Y1: 32}
	return farm.TileJob{TileKey: tiles.TileKey(fk, r), FrameKey: fk, SceneVersion: "sv", Settings: st, Frame: 3,
		Rect: r, InputHash: tiles.InputHash("sv", st, 3, r)}
}

func TestCheckIdentityRejectsForeignJobs(t *testing.T) {
	if err := checkIdentity(validJob(t)); err != nil {
		t.Fatalf("a job made by this build: %v", err)
	}
	for name, mutate := range map[string]func(*farm.TileJob){
		"input hash": func(j *farm.TileJob) { j.InputHash = strings.Repeat("0", 64) },
		"settings":   func(j *farm.TileJob) { j.Settings.SPP++ },
		"rect":       func(j *farm.TileJob) { j.Rect.X1-- },
		"frame":      func(j *farm.TileJob) { j.Frame++ },
		"tile key":   func(j *farm.TileJob) { j.TileKey = strings.Repeat("1", 64) },
	} {
		j := validJob(t)
		mutate(&j)
		if err := checkIdentity(j); !farm.IsTerminal(err) || !strings.Contains(err.Error(), "build mismatch") {
			t.Errorf("%s changed: %v, want a terminal build mismatch", name, err)
		}
	}
}

// The parsed-scene cache is bounded in memory, backed by a disk cache keyed by scene_version,
// and a corrupt cached file is ignored in favour of the object store.
func TestSceneCache(t *testing.T) {
	ctx := context.Background()
	objects, err := finalize.NewFSStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	base, err := farm.ReadBundle("../../examples/cornell/scene.json")
	if err != nil {
		t.Fatal(err)
	}
	var versions []string
	for i := range maxCachedScenes + 2 {
		b := *base
		b.Scene = append([]byte(strings.Repeat(" ", i)), base.Scene...) // same scene, another version
		data, err := b.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if err := objects.Put(ctx, farm.SceneKey(b.Version()), data); err != nil {
			t.Fatal(err)
		}
		versions = append(versions, b.Version())
	}
	cache := t.TempDir()
	w := &Worker{objects: objects, scenes: map[string]*render.Scene{}, log: slog.New(slog.DiscardHandler),
		cfg: Config{SceneCacheDir: cache}}
	for _, v := range versions {
		if _, err := w.scene(ctx, v); err != nil {
			t.Fatalf("scene %s: %v", v, err)
		}
	}
	if len(w.scenes) != maxCachedScenes || len(w.sceneOrder) != maxCachedScenes {
		t.Fatalf("%d scenes in memory, want at most %d", len(w.scenes), maxCachedScenes)
	}
	for _, v := range versions {
		if _, err := os.Stat(filepath.Join(cache, v+".json")); err != nil {
			t.Fatalf("scene %s not cached on disk: %v", v, err)
		}
	}
	// The evicted first scene comes back from disk even with the store gone.
	if err := objects.Delete(ctx, farm.SceneKey(versions[0])); err != nil {
		t.Fatal(err)
	}
	if _, err := w.scene(ctx, versions[0]); err != nil {
		t.Fatalf("scene from the disk cache: %v", err)
	}
	// A corrupt cached copy is never trusted.
	if err := os.WriteFile(filepath.Join(cache, versions[1]+".json"), []byte(`{"scene":"e30="}`), 0o644); err != nil {
		t.Fatal(err)
	}
	delete(w.scenes, versions[1])
	if err := objects.Delete(ctx, farm.SceneKey(versions[1])); err != nil {
		t.Fatal(err)
	}
	if _, err := w.scene(ctx, versions[1]); !errors.Is(err, finalize.ErrNotFound) || !farm.IsTerminal(err) {
		t.Fatalf("corrupt cache and no stored scene: %v, want a terminal not-found", err)
	}
}

func TestPruneCheckpointsDropsOnlyPromotedTiles(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	objects, err := finalize.NewFSStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ckpts, err := tiles.OpenCheckpointStore(filepath.Join(t.TempDir(), "c.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer ckpts.Close()
	done, live := strings.Repeat("a", 64), strings.Repeat("b", 64)
	for _, k := range []string{done, live} {
		if err := ckpts.Save(ctx, tiles.Checkpoint{TileKey: k, InputHash: "h", Next: 1, Sum: []float64{1, 2, 3}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := finalize.Promote(ctx, objects, farm.TileManifestKey(done), "att", "build",
		[]finalize.Output{{Name: farm.TileOutputName, Data: []byte("px")}}, nil); err != nil {
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
	storage := finalize.IsRetryable
	cases := map[string]struct {
		err  error
		want string
	}{
		"terminal": {farm.Terminalf("bad scene"), farm.CodeTerminal},
		"panic":    {fmt.Errorf("rendering: %w", &farm.PanicError{Value: "boom"}), farm.CodePanic},
		"storage":  {fmt.Errorf("promoting tile: %w", syscall.ECONNREFUSED), farm.CodeStorage},
		"other":    {errors.New("publishing start event: timeout"), farm.CodeRetryable},
	}
	for name, c := range cases {
		if got := farm.ErrorCode(c.err, storage); got != c.want {
			t.Errorf("%s: ErrorCode = %q, want %q", name, got, c.want)
		}
	}
}
