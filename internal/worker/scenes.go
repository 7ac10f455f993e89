package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/tilefarm/tilefarm/blender"
	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/failure"
	"github.com/tilefarm/tilefarm/internal/flight"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/objstore"
)

// maxCachedScenes bounds the parsed scenes (BVHs, meshes) a process keeps in memory.
const maxCachedScenes = 4

// Scenes is a process's cache of loaded scenes by scene version: every slot and every worker
// of the process shares one, and a scene is downloaded and parsed (or, for Blender, unpacked)
// once, however many slots ask for it at the same moment. Bundles are also kept on disk (when
// dir is set), so a restarted worker does not download them again.
type Scenes struct {
	objects objstore.Store
	dir     string
	blender *blender.Pool
	log     *slog.Logger
	// parsed keeps the newest loaded scenes: a long-lived worker sees many shots.
	parsed *flight.Cache[scene]
}

// NewScenes makes a scene cache reading bundles from objects, cached on disk under dir (""
// keeps JSON scenes in memory only; Blender scenes need a directory to be unpacked in).
// Blender scenes render on pool's processes; a nil pool renders JSON scenes only.
func NewScenes(objects objstore.Store, dir string, pool *blender.Pool, log *slog.Logger) *Scenes {
	return &Scenes{objects: objects, dir: dir, blender: pool, log: log, parsed: flight.New[scene](maxCachedScenes)}
}

// Get returns the loaded scene of version. Concurrent callers asking for the same version
// share one load.
func (s *Scenes) Get(ctx context.Context, version string) (scene, error) {
	return s.parsed.Get(ctx, version, func(ctx context.Context) (scene, error) { return s.load(ctx, version) })
}

// load reads the bundle from the disk cache, else from the object store, and loads it.
func (s *Scenes) load(ctx context.Context, version string) (scene, error) {
	b, err := s.cached(version)
	if err != nil {
		data, gerr := s.objects.Get(ctx, layout.SceneKey(version))
		if gerr != nil {
			if errors.Is(gerr, objstore.ErrNotFound) {
				return nil, failure.Terminalf("scene %s is not in the object store: %w", version, gerr)
			}
			return nil, fmt.Errorf("fetching scene %s: %w", version, gerr)
		}
		if b, err = bundle.Decode(data); err != nil {
			return nil, failure.Terminal(err)
		}
		if got := b.Version(); got != version {
			return nil, fmt.Errorf("scene bundle %s has version %s: corrupt download", version, got)
		}
		if s.dir != "" {
			err := os.MkdirAll(s.dir, 0o755)
			if err == nil {
				err = objstore.WriteFileAtomic(s.path(version), data)
			}
			if err != nil {
				s.log.Warn("caching scene", "scene_version", version, "err", err)
			}
		}
	}
	return loadBundle(b, version, s.dir, s.blender)
}

// loadBundle makes a decoded bundle renderable: a JSON scene is parsed, a Blender scene's
// files are unpacked under dir/blender for the pool's processes to open.
func loadBundle(b *bundle.Bundle, version, dir string, pool *blender.Pool) (scene, error) {
	if !b.IsBlender() {
		sc, err := b.Parse()
		if err != nil {
			return nil, failure.Terminalf("parsing scene %s: %w", version, err)
		}
		return pathTracer{sc}, nil
	}
	switch {
	case pool == nil:
		return nil, fmt.Errorf("scene %s is a Blender scene and this worker runs no Blender", version)
	case dir == "":
		return nil, fmt.Errorf("scene %s is a Blender scene and this worker has no directory to unpack it in", version)
	}
	if err := b.Validate(); err != nil {
		return nil, failure.Terminalf("scene %s: %w", version, err)
	}
	bs, err := b.Unpack(filepath.Join(dir, "blender"), version)
	if err != nil {
		return nil, fmt.Errorf("scene %s: %w", version, err)
	}
	// Tiles of this scene are coming: every slot will want its Blender process.
	pool.Warm(context.Background())
	return cycles{s: bs, pool: pool}, nil
}

func (s *Scenes) path(version string) string { return filepath.Join(s.dir, version+".tfb") }

// cached reads a bundle from the disk cache; one that does not hash to its name is ignored.
func (s *Scenes) cached(version string) (*bundle.Bundle, error) {
	if s.dir == "" {
		return nil, os.ErrNotExist
	}
	data, err := os.ReadFile(s.path(version))
	if err != nil {
		return nil, err
	}
	b, err := bundle.Decode(data)
	if err != nil || b.Version() != version {
		s.log.Warn("ignoring corrupt cached scene", "scene_version", version)
		return nil, errors.New("corrupt cached scene")
	}
	return b, nil
}
