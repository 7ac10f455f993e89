package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"

	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/content"
	"github.com/tilefarm/tilefarm/internal/failure"
	"github.com/tilefarm/tilefarm/internal/flight"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/platform"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/objstore"
)

// maxCachedScenes bounds the parsed scenes (BVHs, meshes) a process keeps in memory.
const maxCachedScenes = 4

// Scenes is a process's cache of loaded scenes by scene version: every slot and every worker
// of the process shares one, and a scene is loaded by its kind (parsed, or unpacked for
// Blender) once, however many slots ask for it at the same moment. A scene's files come by
// content through the node's content cache (internal/content: each file fetched once by its
// hash, shared by jobs and slots, verified, evicted least recently used), or from the studio's
// shared storage as this node mounts it (ScenesOptions.Shared), verified against the hash the
// submitter recorded.
type Scenes struct {
	objects objstore.Store
	dir     string
	kinds   scene.Kinds
	log     *slog.Logger
	cache   *content.Cache       // nil: files are read from the store as they are needed
	shared  []content.SharedRoot // the node's mounts of studio shares
	// parsed keeps the newest loaded scenes: a long-lived worker sees many shots.
	parsed *flight.Cache[scene.Renderer]
}

// ScenesOptions are a scene cache's content cache and shares.
type ScenesOptions struct {
	// Cache keeps scene files by content; nil with a dir opens one under dir/content with
	// CacheLimit.
	Cache      *content.Cache
	CacheLimit int64 // bytes; 0 is DefaultCacheLimit
	Shared     []content.SharedRoot
}

// DefaultCacheLimit is the content cache's size limit when an operator sets none.
const DefaultCacheLimit = 100 << 30

// NewScenes makes a scene cache reading manifests and files from objects, with its content
// cache under dir (""  reads files from the store as they are needed, and leaves kinds that
// unpack their files, such as Blender's, nowhere to do it), loading them with their kind among
// kinds.
func NewScenes(objects objstore.Store, dir string, kinds scene.Kinds, log *slog.Logger, opts ...ScenesOptions) (*Scenes, error) {
	s := &Scenes{objects: objects, dir: dir, kinds: kinds, log: log, parsed: flight.New[scene.Renderer](maxCachedScenes)}
	var o ScenesOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	s.cache, s.shared = o.Cache, o.Shared
	if s.cache == nil && dir != "" {
		limit := o.CacheLimit
		if limit == 0 {
			limit = DefaultCacheLimit
		}
		c, err := content.OpenCache(filepath.Join(dir, "content"), limit, log)
		if err != nil {
			return nil, fmt.Errorf("opening the scene file cache: %w", err)
		}
		s.cache = c
	}
	return s, nil
}

// Get returns the loaded scene of version. Concurrent callers asking for the same version
// share one load.
func (s *Scenes) Get(ctx context.Context, version string) (scene.Renderer, error) {
	return s.parsed.Get(ctx, version, func(ctx context.Context) (scene.Renderer, error) { return s.load(ctx, version) })
}

// load reads the scene's manifest and loads it, its files read through the content cache.
func (s *Scenes) load(ctx context.Context, version string) (scene.Renderer, error) {
	data, err := s.objects.Get(ctx, layout.SceneKey(version))
	if err != nil {
		if errors.Is(err, objstore.ErrNotFound) {
			return nil, failure.Terminalf("scene %s is not in the object store: %w", version, err)
		}
		return nil, fmt.Errorf("fetching scene %s: %w", version, err)
	}
	// A manifest the coordinator stored is within its limits; the worker knows none of them.
	b, err := bundle.Decode(data, bundle.Limits{Files: math.MaxInt32})
	if err != nil {
		return nil, failure.Terminal(err)
	}
	if got := b.Version(); got != version {
		return nil, failure.Terminalf("the store's manifest of scene %s has version %s: it is not that scene's", version, got)
	}
	if s.cache != nil {
		refs := make([]content.Ref, 0, len(b.Files))
		for _, f := range b.Files {
			refs = append(refs, content.Ref{SHA256: f.SHA256, Size: f.Size})
		}
		defer s.cache.Pin(refs...)() // none evicted while the scene is unpacked or parsed
	}
	r, _, err := s.kinds.Load(ctx, b.WithSource(nodeSource{s, b.SharedRoot}), version, s.dir)
	return r, err
}

// nodeSource is a worker's Source of a scene's files: the studio's share where the manifest
// says a file is on it (root: the share as the submitter named it), else the content cache
// filled from the object store.
type nodeSource struct {
	s    *Scenes
	root string
}

// Path is a local, verified copy of the file: on the share, or in the content cache.
func (n nodeSource) Path(ctx context.Context, name string, f bundle.File) (string, error) {
	ref := content.Ref{SHA256: f.SHA256, Size: f.Size}
	if f.Shared != "" {
		return n.sharedPath(ctx, name, f, ref)
	}
	if n.s.cache == nil {
		return "", fmt.Errorf("%q: this worker keeps no scene files on disk", name)
	}
	p, err := n.s.cache.Path(ctx, ref, func(ctx context.Context, ref content.Ref, w io.Writer) error {
		r, _, err := n.s.objects.Open(ctx, layout.ContentKey(ref.SHA256))
		if errors.Is(err, objstore.ErrNotFound) {
			return failure.Terminalf("the scene's file %q (%s) is not in the object store: %w", name, ref.SHA256, err)
		}
		if err != nil {
			return fmt.Errorf("fetching the scene's file %q: %w", name, err)
		}
		defer r.Close()
		_, err = io.Copy(w, r)
		return err
	})
	if errors.Is(err, content.ErrMismatch) {
		return "", fmt.Errorf("the scene's file %q: %w", name, err) // a damaged download: retried
	}
	return p, err
}

// sharedPath resolves a file on the studio's share under this node's mount of the share the
// submitter named, and checks it is what the submitter hashed: a file changed since submit
// fails the tile, naming it.
func (n nodeSource) sharedPath(ctx context.Context, name string, f bundle.File, ref content.Ref) (string, error) {
	i := slices.IndexFunc(n.s.shared, func(r content.SharedRoot) bool { return r.Mounts(n.root) })
	if i < 0 {
		// This worker's, not the job's: another worker may mount the share.
		return "", fmt.Errorf("the scene's file %q is on the studio's share %s, which this worker does not mount (tileworker --shared %s=PATH)", name, n.root, n.root)
	}
	p, err := n.s.shared[i].Resolve(f.Shared)
	if err != nil {
		return "", failure.Terminalf("the scene's file %q on the share: %w", name, err)
	}
	if err := content.VerifyShared(ctx, p, ref); err != nil {
		if errors.Is(err, content.ErrSharedChanged) {
			return "", failure.Terminalf("the scene's file %q: %w", name, err) // the job's: submit it again
		}
		// A share not mounted yet, or unreadable here: this worker's trouble, retried.
		return "", fmt.Errorf("the scene's file %q on the share: %w", name, err)
	}
	return p, nil
}

// Open streams the file: from its local copy where there is one, else from the store. A node
// whose cache disk is full still reads the file, from the store, verified as it streams: a
// scene parsed into memory needs no copy on disk (a Blender scene does, and fails to unpack).
func (n nodeSource) Open(ctx context.Context, name string, f bundle.File) (io.ReadCloser, error) {
	if f.Shared != "" || n.s.cache != nil {
		p, err := n.Path(ctx, name, f)
		if err == nil && f.Shared != "" {
			// The share may change under the copy: what is read is verified as it is read.
			r, err := os.Open(p)
			if err != nil {
				return nil, err
			}
			return verified{content.VerifyingReader(r, content.Ref{SHA256: f.SHA256, Size: f.Size}), r}, nil
		}
		if err == nil {
			return os.Open(p)
		}
		if f.Shared != "" || !platform.DiskFull(err) {
			return nil, err
		}
		n.s.log.Warn("caching a scene file; reading it from the store", "file", name, "err", err)
	}
	r, _, err := n.s.objects.Open(ctx, layout.ContentKey(f.SHA256))
	if errors.Is(err, objstore.ErrNotFound) {
		return nil, failure.Terminalf("the scene's file %q (%s) is not in the object store: %w", name, f.SHA256, err)
	}
	if err != nil {
		return nil, fmt.Errorf("fetching the scene's file %q: %w", name, err)
	}
	return verified{content.VerifyingReader(r, content.Ref{SHA256: f.SHA256, Size: f.Size}), r}, nil
}

// verified reads through a verifying reader and closes what it reads from.
type verified struct {
	io.Reader
	io.Closer
}
