package blender

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
func Unpack(dir, version string, desc *Description, read func(name string) ([]byte, error)) (*Scene, error) {
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
		data, err := read(name)
		if err != nil {
			return nil, fmt.Errorf("unpacking scene: %w", err)
		}
		p := filepath.Join(tmp, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, fmt.Errorf("unpacking scene: %w", err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
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

// Remove deletes the unpacked files.
func (s *Scene) Remove() error {
	if err := os.RemoveAll(s.Root); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
