package blender

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Inspection is what Inspect found: the scene description and where each of the bundle's
// files is on this machine.
type Inspection struct {
	Desc  *Description
	Paths map[string]string // bundle name -> path on disk
}

// inspectReply is the driver's answer to an inspect request: what the description says of the
// scene, and where the .blend's dependencies are.
type inspectReply struct {
	Description
	Deps []string `json:"deps"`
}

// Inspect asks Blender about the .blend at path: its cameras, settings and frame range, its
// output settings, view layers and the channels of every pass its tiles render (a one-pixel
// probe render), why its frames render whole or what splitting them switches off, and every
// file it depends on (images, linked
// libraries, caches, found by Blender itself). A file that is not a .blend, a missing
// dependency, an absolute path, a scene without a camera or one that needs scripts to run is
// an ErrScene naming the problem, so it is rejected at submit instead of rendering magenta.
func Inspect(ctx context.Context, pool *Pool, path string) (*Inspection, error) {
	blend, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("resolving %q: %w", path, err)
	}
	fi, err := os.Stat(blend)
	if err != nil {
		return nil, sceneErr("reading %s: %v", path, err)
	}
	if fi.IsDir() {
		return nil, sceneErr("%s is a directory, not a .blend file", path)
	}
	if err := checkMagic(blend); err != nil {
		return nil, err
	}
	saved, err := FileVersion(blend)
	if err != nil {
		return nil, err
	}
	build, err := pool.Build(ctx)
	if err != nil {
		return nil, err
	}
	if line, ok := BuildLine(build); ok && line.Less(saved) {
		return nil, sceneErr("%s was saved by Blender %s, which Blender %s cannot read: inspect it with a build of %s or newer (--blender)",
			filepath.Base(path), saved, releaseOf(build), saved)
	}
	probe, err := pool.scratch(".exr")
	if err != nil {
		return nil, err
	}
	defer os.Remove(probe)
	line, err := pool.call(ctx, blend, map[string]any{"op": "inspect", "file": blend, "probe": probe})
	if err != nil {
		return nil, fmt.Errorf("inspecting %s: %w", filepath.Base(path), err)
	}
	var r inspectReply
	if err := json.Unmarshal(line, &r); err != nil {
		return nil, fmt.Errorf("%w: unreadable inspection: %v", ErrProcess, err)
	}
	files := append([]string{blend}, r.Deps...)
	root := commonDir(files)
	in := &Inspection{Paths: make(map[string]string, len(files))}
	names := make([]string, 0, len(files))
	for _, f := range files {
		rel, err := filepath.Rel(root, f)
		if err != nil {
			return nil, fmt.Errorf("naming %s in the bundle: %w", f, err)
		}
		rel = filepath.ToSlash(rel)
		if _, dup := in.Paths[rel]; !dup {
			names = append(names, rel)
		}
		in.Paths[rel] = f
	}
	slices.Sort(names)
	blendName, _ := filepath.Rel(root, blend)
	d := r.Description
	d.Format, d.Blend, d.Files, d.Build, d.FileVersion = Format, filepath.ToSlash(blendName), names, build, saved.String()
	in.Desc = &d
	for _, l := range []*[]string{&in.Desc.Whole, &in.Desc.SplitOff, &in.Desc.Caveats, &in.Desc.Output.FileOutputs} {
		if *l == nil {
			*l = []string{}
		}
	}
	for i := range in.Desc.Layers {
		for _, l := range []*[]string{&in.Desc.Layers[i].AOVs, &in.Desc.Layers[i].Lightgroups} {
			if *l == nil {
				*l = []string{}
			}
		}
	}
	if err := in.Desc.validate(); err != nil {
		return nil, err
	}
	return in, nil
}

// checkMagic rejects a file that is not a .blend before Blender is asked to open it.
func checkMagic(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return sceneErr("reading %s: %v", filepath.Base(path), err)
	}
	defer f.Close()
	var head [7]byte
	n, _ := f.Read(head[:])
	if !IsBlend(head[:n]) {
		return sceneErr("%s is not a .blend file", filepath.Base(path))
	}
	return nil
}

// IsBlend reports whether data starts like a .blend file: uncompressed, gzip or zstd.
// BlendHeaderSize is how many first bytes of a file IsBlend needs.
const BlendHeaderSize = 8

func IsBlend(data []byte) bool {
	return strings.HasPrefix(string(data), "BLENDER") || strings.HasPrefix(string(data), "\x1f\x8b") ||
		strings.HasPrefix(string(data), "\x28\xb5\x2f\xfd")
}

// commonDir is the deepest directory holding every one of paths (absolute, cleaned).
func commonDir(paths []string) string {
	root := filepath.Dir(paths[0])
	for _, p := range paths[1:] {
		for !strings.HasPrefix(filepath.Dir(p)+string(filepath.Separator), root+string(filepath.Separator)) && root != filepath.Dir(root) {
			root = filepath.Dir(root)
		}
	}
	return root
}
