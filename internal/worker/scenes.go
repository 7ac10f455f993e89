package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/farm"
	"github.com/tilefarm/tilefarm/internal/flight"
	"github.com/tilefarm/tilefarm/render"
)

// maxCachedScenes bounds the parsed scenes (BVHs, meshes) a process keeps in memory.
const maxCachedScenes = 4

// Scenes is a process's cache of parsed scenes by scene version: every slot and every worker
// of the process shares one, and a scene is downloaded and parsed once, however many slots ask
// for it at the same moment. Bundles are also kept on disk (when dir is set), so a restarted
// worker does not download them again.
type Scenes struct {
	objects finalize.Store
	dir     string
	log     *slog.Logger
	// parsed keeps the newest parsed scenes: a long-lived worker sees many shots.
	parsed *flight.Cache[*render.Scene]
}

// NewScenes makes a scene cache reading bundles from objects, cached on disk under dir
// ("" keeps them in memory only).
func NewScenes(objects finalize.Store, dir string, log *slog.Logger) *Scenes {
	return &Scenes{objects: objects, dir: dir, log: log, parsed: flight.New[*render.Scene](maxCachedScenes)}
}

// Get returns the parsed scene of version. Concurrent callers asking for the same version
// share one load.
func (s *Scenes) Get(ctx context.Context, version string) (*render.Scene, error) {
	return s.parsed.Get(ctx, version, func(ctx context.Context) (*render.Scene, error) { return s.load(ctx, version) })
}

// load reads the bundle from the disk cache, else from the object store, and parses it.
func (s *Scenes) load(ctx context.Context, version string) (*render.Scene, error) {
	b, err := s.cached(version)
	if err != nil {
		data, gerr := s.objects.Get(ctx, farm.SceneKey(version))
		if gerr != nil {
			if errors.Is(gerr, finalize.ErrNotFound) {
				return nil, farm.Terminalf("scene %s is not in the object store: %w", version, gerr)
			}
			return nil, fmt.Errorf("fetching scene %s: %w", version, gerr)
		}
		if b, err = farm.DecodeBundle(data); err != nil {
			return nil, farm.Terminal(err)
		}
		if got := b.Version(); got != version {
			return nil, fmt.Errorf("scene bundle %s has version %s: corrupt download", version, got)
		}
		if s.dir != "" {
			err := os.MkdirAll(s.dir, 0o755)
			if err == nil {
				err = finalize.WriteFileAtomic(s.path(version), data)
			}
			if err != nil {
				s.log.Warn("caching scene", "scene_version", version, "err", err)
			}
		}
	}
	sc, err := b.Parse()
	if err != nil {
		return nil, farm.Terminalf("parsing scene %s: %w", version, err)
	}
	return sc, nil
}

func (s *Scenes) path(version string) string { return filepath.Join(s.dir, version+".tfb") }

// cached reads a bundle from the disk cache; one that does not hash to its name is ignored.
func (s *Scenes) cached(version string) (*farm.Bundle, error) {
	if s.dir == "" {
		return nil, os.ErrNotExist
	}
	data, err := os.ReadFile(s.path(version))
	if err != nil {
		return nil, err
	}
	b, err := farm.DecodeBundle(data)
	if err != nil || b.Version() != version {
		s.log.Warn("ignoring corrupt cached scene", "scene_version", version)
		return nil, errors.New("corrupt cached scene")
	}
	return b, nil
}
