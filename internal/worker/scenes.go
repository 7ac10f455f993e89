package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/failure"
	"github.com/tilefarm/tilefarm/internal/flight"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/objstore"
)

// maxCachedScenes bounds the parsed scenes (BVHs, meshes) a process keeps in memory.
const maxCachedScenes = 4

// Scenes is a process's cache of loaded scenes by scene version: every slot and every worker
// of the process shares one, and a scene is downloaded and loaded by its kind (parsed, or
// unpacked for Blender) once, however many slots ask for it at the same moment. Bundles are
// also kept on disk (when dir is set), so a restarted worker does not download them again.
type Scenes struct {
	objects objstore.Store
	dir     string
	kinds   scene.Kinds
	log     *slog.Logger
	// parsed keeps the newest loaded scenes: a long-lived worker sees many shots.
	parsed *flight.Cache[scene.Renderer]
}

// NewScenes makes a scene cache reading bundles from objects, cached on disk under dir (""
// keeps them in memory only, and leaves kinds that unpack their files, such as Blender's,
// nowhere to do it), loading them with their kind among kinds.
func NewScenes(objects objstore.Store, dir string, kinds scene.Kinds, log *slog.Logger) *Scenes {
	return &Scenes{objects: objects, dir: dir, kinds: kinds, log: log, parsed: flight.New[scene.Renderer](maxCachedScenes)}
}

// Get returns the loaded scene of version. Concurrent callers asking for the same version
// share one load.
func (s *Scenes) Get(ctx context.Context, version string) (scene.Renderer, error) {
	return s.parsed.Get(ctx, version, func(ctx context.Context) (scene.Renderer, error) { return s.load(ctx, version) })
}

// load reads the bundle from the disk cache, else from the object store, and loads it.
func (s *Scenes) load(ctx context.Context, version string) (scene.Renderer, error) {
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
	r, _, err := s.kinds.Load(ctx, b, version, s.dir)
	return r, err
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
