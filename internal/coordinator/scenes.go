package coordinator

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/objstore"
)

// ErrSceneMissing is returned for a submission naming a scene that was never uploaded.
var ErrSceneMissing = errors.New("scene not uploaded")

// sceneInfo is what a submission needs of a stored scene: its name, its kind, and what its
// document says about settings, cameras and frames. It is small: assets are never kept.
type sceneInfo struct {
	name string
	kind scene.Kind
	info scene.Description
}

// HasScene reports whether a scene bundle is stored under version.
func (c *Coordinator) HasScene(ctx context.Context, version string) (bool, error) {
	if !validHash(version) {
		return false, badInput("scene version %q is not a sha256 hex digest", version)
	}
	_, err := c.objects.Stat(ctx, layout.SceneKey(version))
	if errors.Is(err, objstore.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("checking stored scene: %w", err)
	}
	return true, nil
}

// PutScene validates an encoded scene bundle and stores it, once, under its scene version.
// raw is kept by the store call and parsed in place, so an upload holds its bundle in memory
// once. A bundle whose content does not hash to version, of no kind this coordinator knows,
// that carries assets its scene does not reference, or whose scene does not parse is bad
// input (scene.Kinds.Check); nothing is stored then.
func (c *Coordinator) PutScene(ctx context.Context, version string, raw []byte) error {
	if !validHash(version) {
		return badInput("scene version %q is not a sha256 hex digest", version)
	}
	b, err := bundle.Decode(raw)
	if err != nil {
		return badInput("%v", err)
	}
	if got := b.Version(); got != version {
		return badInput("scene bundle hashes to %s, not %s", got, version)
	}
	kind, info, err := c.kinds.Check(b)
	if err != nil {
		return badInput("%v", err)
	}
	if ok, err := c.HasScene(ctx, version); err != nil || ok {
		c.scenes.Put(version, &sceneInfo{name: b.Name, kind: kind, info: info})
		return err
	}
	if err := c.objects.Put(ctx, layout.SceneKey(version), raw); err != nil {
		return fmt.Errorf("storing scene %s: %w", version, err)
	}
	c.scenes.Put(version, &sceneInfo{name: b.Name, kind: kind, info: info})
	return nil
}

// scene returns what a submission needs of a stored scene.
func (c *Coordinator) scene(ctx context.Context, version string) (*sceneInfo, error) {
	if !validHash(version) {
		return nil, badInput("scene version %q is not a sha256 hex digest", version)
	}
	return c.scenes.Get(ctx, version, func(ctx context.Context) (*sceneInfo, error) {
		raw, err := c.objects.Get(ctx, layout.SceneKey(version))
		if errors.Is(err, objstore.ErrNotFound) {
			return nil, fmt.Errorf("%w: scene %s: upload it first (PUT /v1/scenes/%s)", ErrSceneMissing, version, version)
		}
		if err != nil {
			return nil, fmt.Errorf("reading stored scene %s: %w", version, err)
		}
		b, err := bundle.Decode(raw)
		if err != nil {
			return nil, fmt.Errorf("stored scene %s: %w", version, err)
		}
		kind, err := c.kinds.ForDocument(b.Scene)
		if err != nil {
			return nil, fmt.Errorf("stored scene %s: %w", version, err)
		}
		info, err := kind.Describe(b.Scene)
		if err != nil {
			return nil, fmt.Errorf("stored scene %s: %w", version, err)
		}
		return &sceneInfo{name: b.Name, kind: kind, info: info}, nil
	})
}

// validJobID reports whether v is a job id as identity.JobID makes them: "job-" and 24
// lowercase hex digits.
func validJobID(v string) bool {
	h, ok := strings.CutPrefix(v, "job-")
	return ok && len(h) == 24 && validHash(h+strings.Repeat("0", 40))
}

// validHash accepts the lowercase sha256 hex of a scene version or a frame key and nothing
// else, so what a client or a worker sends can never be more than a hash inside an object key.
func validHash(v string) bool {
	if len(v) != 64 {
		return false
	}
	for _, c := range v {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
