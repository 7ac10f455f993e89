package cli

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/scene"
)

// Where the commands that write frames (render, outputs, tileworker render) put them. The
// farm's own formats go to --out; a Blender scene's own output (format blend) goes where
// Blender itself would write it: its output path from the .blend, relative to the .blend's
// directory, or --out as Blender's -o takes it ('####' or else four digits appended, the
// extension Blender adds); its File Output nodes' files under the .blend's directory. outputs
// writes them under --dir as if it were the .blend's directory, and nowhere else (outputDest's
// Confined). Every path of every frame is checked before the first byte is written, so a
// refused path leaves no half-written set of outputs behind (docs/design.md, "Assembly:
// Blender's own pipeline").

// formatBlend is a Blender scene's own output format.
const formatBlend = "blend"

// outputDest is where a command writes frames: Pattern is --out ("" for a Blender scene's own
// output path); Base is the directory a Blender scene's own paths ("//render/...") and its File
// Output nodes' files are relative to (the .blend's directory, or outputs --dir where the .blend
// is not at hand).
type outputDest struct {
	Pattern, Base string
	// Confined keeps a Blender scene's own output path under Base: a "//" path that leaves it
	// and an absolute one are refused. outputs --dir sets it, since the scene came from the
	// farm (perhaps submitted from another machine) and the user chose only the directory;
	// render and tileworker render write as Blender would, the .blend being the user's own,
	// named on their command line. --out is always the user's, and may be anywhere.
	Confined bool
}

// defaultFormat is the format a command writes when --format is not given: a Blender scene's
// own output, else the one --out's extension says.
func defaultFormat(k scene.Kind, out string) string {
	if slices.Contains(k.Formats(), formatBlend) {
		return formatBlend
	}
	if strings.EqualFold(filepath.Ext(out), ".exr") {
		return "exr"
	}
	return "png"
}

// outPattern is --out as a format takes it: for a Blender scene's own output, as Blender's -o
// does, four digits of frame number appended when it has no '#'.
func outPattern(out, format string) string {
	if format == formatBlend && out != "" && !strings.Contains(out, "#") {
		return out + "####"
	}
	return out
}

// imageExts are the extensions Blender gives image files; --out for a Blender scene's own output
// gets the one Blender gives its format, replacing another of these.
var imageExts = []string{".png", ".exr", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".tga", ".hdr", ".dpx", ".cin", ".jp2", ".j2c", ".webp", ".rgb"}

// mainPath is where frame's main file goes: the pattern's path, or, for a renderer that named
// the file itself (name, "" where the farm names it), that name under dest.Base, refused
// (api.ErrBadInput) where a confined dest's scene would write it elsewhere.
func mainPath(dest outputDest, name string, frame int) (string, error) {
	if dest.Pattern == "" {
		rel, ok := strings.CutPrefix(name, "//")
		switch {
		case name == "":
			return "", usagef("--out is required, e.g. --out 'out/shot_####.png'")
		case ok:
			rel = filepath.FromSlash(rel)
			if dest.Confined && !filepath.IsLocal(rel) {
				return "", fmt.Errorf("%w: frame %d: the scene's output path %q leaves --dir %q (it would be written at %q): give --out to choose where the frames go",
					api.ErrBadInput, frame, name, dest.Base, filepath.Join(dest.Base, rel))
			}
			return filepath.Join(dest.Base, rel), nil
		case filepath.IsAbs(name):
			if dest.Confined {
				return "", fmt.Errorf("%w: frame %d: the scene's output path %q is absolute, not under --dir %q: give --out to choose where the frames go",
					api.ErrBadInput, frame, name, dest.Base)
			}
			return name, nil
		}
		return "", fmt.Errorf("the scene names its output %q, neither relative to the .blend (//) nor absolute: give --out", name)
	}
	p, err := expandPattern(dest.Pattern, frame)
	if err != nil {
		return "", err
	}
	// As Blender's -o: an image extension of another format is replaced by the format's own.
	if ext := filepath.Ext(name); name != "" && slices.Contains(imageExts, strings.ToLower(ext)) {
		if have := filepath.Ext(p); !strings.EqualFold(have, ext) {
			if slices.Contains(imageExts, strings.ToLower(have)) {
				p = strings.TrimSuffix(p, have)
			}
			p += ext
		}
	}
	return p, nil
}

// framePaths is where writeFrame puts frame's output: its main file (named name by its
// renderer, or "") at mainPath, then its other files (paths, relative to dest.Base) under
// dest.Base. It is the check of every destination, made before anything is written: a File
// Output file that would leave dest.Base is refused (api.ErrBadInput) before its frame's main
// file is written, not after.
func framePaths(dest outputDest, frame int, name string, paths []string) ([]string, error) {
	main, err := mainPath(dest, name, frame)
	if err != nil {
		return nil, err
	}
	under := "the .blend's directory"
	if dest.Confined {
		under = "--dir"
	}
	to := []string{main}
	for _, p := range paths {
		rel := filepath.FromSlash(p)
		if !filepath.IsLocal(rel) {
			return nil, fmt.Errorf("%w: frame %d: the File Output file %q leaves %s %q", api.ErrBadInput, frame, p, under, dest.Base)
		}
		to = append(to, filepath.Join(dest.Base, rel))
	}
	return to, nil
}

// writeFrame writes one encoded output of frame where framePaths said: main at to[0], and
// file(i) at to[i+1]. It returns the paths written.
func writeFrame(frame int, to []string, main []byte, file func(i int) ([]byte, error)) ([]string, error) {
	if err := writeFile(to[0], main); err != nil {
		return nil, fmt.Errorf("writing frame %d: %w", frame, err)
	}
	written := []string{to[0]}
	for i, path := range to[1:] {
		data, err := file(i)
		if err != nil {
			return written, fmt.Errorf("fetching %s of frame %d: %w", path, frame, err)
		}
		if err := writeFile(path, data); err != nil {
			return written, fmt.Errorf("writing %s of frame %d: %w", path, frame, err)
		}
		written = append(written, path)
	}
	return written, nil
}
