package blender

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/tilefarm/tilefarm/internal/bundle"
)

// Scene is a Blender scene bundle unpacked on disk, ready for a Pool to render.
type Scene struct {
	Desc *Description
	Root string // the directory holding the bundle's files under their bundle names
	// plans are how the channels combine, of a frame split ([0]) and rendered whole ([1]).
	plans [2]*channelPlan
}

// plan is how a tile's channels combine, in a frame rendered whole or not.
func (s *Scene) plan(whole bool) *channelPlan {
	if whole {
		return s.plans[1]
	}
	return s.plans[0]
}

// Blend is the path of the scene's .blend file.
func (s *Scene) Blend() string { return filepath.Join(s.Root, filepath.FromSlash(s.Desc.Blend)) }

// Unpack writes the bundle's files under dir/version, or reuses them if an earlier Unpack
// finished there. The files are written into a temporary directory renamed into place, so a
// directory under its version is always complete. read returns a bundle file's content.
func Unpack(ctx context.Context, dir, version string, desc *Description, b *bundle.Bundle) (*Scene, error) {
	dir, err := filepath.Abs(dir) // Blender runs in its own working directory
	if err != nil {
		return nil, fmt.Errorf("unpacking scene: %w", err)
	}
	root := filepath.Join(dir, version)
	sc := &Scene{Desc: desc, Root: root}
	for i, whole := range []bool{false, true} {
		plan, err := planChannels(desc.mode(whole))
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrScene, err)
		}
		sc.plans[i] = plan
	}
	if fi, err := os.Stat(root); err == nil && fi.IsDir() {
		return sc, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating %s: %w", dir, err)
	}
	tmp, err := os.MkdirTemp(dir, ".unpack-*")
	if err != nil {
		return nil, fmt.Errorf("unpacking scene: %w", err)
	}
	defer os.RemoveAll(tmp) // left behind only if the rename below did not happen
	for _, name := range desc.Files {
		p := filepath.Join(tmp, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, fmt.Errorf("unpacking scene: %w", err)
		}
		if err := place(ctx, b, name, p); err != nil {
			return nil, fmt.Errorf("unpacking scene: %w", err)
		}
	}
	if err := os.Rename(tmp, root); err != nil {
		if fi, serr := os.Stat(root); serr == nil && fi.IsDir() {
			return sc, nil // another process of this worker unpacked it first
		}
		return nil, fmt.Errorf("unpacking scene: %w", err)
	}
	return sc, nil
}

// place puts the scene's file name at p: a hard link to the verified copy when the bundle's
// source has the file on this disk (a worker's cache: no byte copied, and the cache may evict
// its copy without touching this one), else a copy streamed from the source. A file on the
// studio's share is always copied, verified as it is read: a link would be the studio's own
// file, which may change after it was checked.
func place(ctx context.Context, b *bundle.Bundle, name, p string) error {
	f, ok := b.Files[name]
	if !ok {
		return fmt.Errorf("the scene needs %q, which its manifest does not name", name)
	}
	if pr, ok := b.Source().(bundle.Pather); ok && f.Shared == "" {
		src, err := pr.Path(ctx, name, f)
		if err != nil {
			return err
		}
		if err := os.Link(src, p); err == nil {
			return nil
		}
	}
	r, err := b.Open(ctx, name)
	if err != nil {
		return err
	}
	defer r.Close()
	// A plain write: the whole unpack directory is renamed into place once complete.
	w, err := os.Create(p)
	if err != nil {
		return err
	}
	if _, err := io.Copy(w, r); err != nil {
		w.Close()
		return fmt.Errorf("copying %q: %w", name, err)
	}
	return w.Close()
}

// Remove deletes the unpacked files.
func (s *Scene) Remove() error {
	if err := os.RemoveAll(s.Root); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
