package blender

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/tilefarm/tilefarm/raster"
	"github.com/tilefarm/tilefarm/render"
)

// FormatBlend is the output format that is the .blend's own: the file a render of the scene
// writes (its format, colour mode, depth, codec, every view layer and pass of a multilayer
// EXR, the compositor's result), and the files of its File Output nodes.
const FormatBlend = "blend"

// Formats are the output formats Assemble writes: the .blend's own, and the farm's formats of
// the Composite result (8- and 16-bit PNG through the scene's colour management, linear EXR).
var Formats = []string{FormatBlend, "png", "png16", "exr"}

// Assembled is a frame written by Blender from its assembled tiles.
type Assembled struct {
	// Name is the main file's name as Blender names it: for FormatBlend the scene's output path
	// for the frame ("//render/plate_0001.exr", relative to the .blend's directory, or
	// absolute); for the farm's formats "frame.png" or "frame.exr".
	Name string
	Main []byte
	// Files are the File Output nodes' files by their path under the .blend's directory
	// ("render/depth/depth_0001.png"); only FormatBlend writes them.
	Files map[string][]byte
}

// assembleReply is the driver's answer to an assemble request.
type assembleReply struct {
	// Outputs are the files of each format asked for, in the request's order.
	Outputs []struct {
		Main  string   `json:"main"` // under the output directory
		Name  string   `json:"name"`
		Files []string `json:"files"` // under the output directory's files/
	} `json:"outputs"`
}

// Assemble writes an assembled frame (every channel of the scene's tiles, f.Names in the
// description's order) as Blender writes a render of the scene, in each of formats, returned
// in their order: a render engine of the driver whose result is the frame feeds Blender's own
// pipeline, so the compositor runs once on the whole frame with its Render Layers nodes fed
// from the assembled layers and passes, the File Output nodes write their files, and the
// output is written in FormatBlend, the scene's own settings, or png, png16 or exr, the
// Composite (or Combined) result. One Blender call writes every format: the first (the scene's
// own, where asked for) is rendered, the others are that Render Result saved again. The
// Cryptomatte manifests, which Cycles writes only into a render's metadata, come from a
// one-pixel render of the frame.
func Assemble(ctx context.Context, pool *Pool, sc *Scene, f *raster.Frame, frame int, st render.Settings, formats []string) ([]*Assembled, error) {
	if len(formats) == 0 {
		return nil, sceneErr("no output format to assemble")
	}
	order := make([]string, 0, len(formats)) // the scene's own first: only it writes File Output nodes' files
	for _, format := range formats {
		if !slices.Contains(Formats, format) {
			return nil, sceneErr("unknown output format %q (want %s)", format, strings.Join(Formats, ", "))
		}
		if slices.Contains(order, format) {
			return nil, sceneErr("output format %q asked for twice", format)
		}
		if format == FormatBlend {
			order = slices.Insert(order, 0, format)
		} else {
			order = append(order, format)
		}
	}
	if want := sc.Desc.TileChannels(st.Whole); !slices.Equal(f.Names, want) || f.Width != st.Width || f.Height != st.Height {
		return nil, sceneErr("the assembled frame's %dx%d channels %q are not the scene's %dx%d %q",
			f.Width, f.Height, f.Names, st.Width, st.Height, want)
	}
	f = f.Without(sc.Desc.Drop) // the colour passes only the tiles needed (Description.Drop)
	exr, err := raster.EncodeEXR(f, raster.EXRNone)
	if err != nil {
		return nil, err
	}
	in, err := pool.scratch(".exr")
	if err != nil {
		return nil, err
	}
	defer os.Remove(in)
	out := in + ".d"
	defer os.RemoveAll(out)
	if err := os.WriteFile(in, exr, 0o644); err != nil {
		return nil, fmt.Errorf("writing the frame for Blender: %w", err)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, fmt.Errorf("writing the frame for Blender: %w", err)
	}
	blend := sc.Blend()
	req := map[string]any{"op": "assemble", "file": blend, "frame": frame, "camera": st.Camera,
		"width": st.Width, "height": st.Height, "in": in, "out": out, "channels": f.Names,
		"own": sc.Desc.Output, "formats": order}
	what := strings.Join(order, ", ")
	line, err := pool.call(ctx, blend, req)
	if err != nil {
		return nil, fmt.Errorf("assembling frame %d as %s: %w", frame, what, err)
	}
	var reply assembleReply
	if err := json.Unmarshal(line, &reply); err != nil {
		return nil, fmt.Errorf("%w: unreadable assemble reply: %v", ErrProcess, err)
	}
	if len(reply.Outputs) != len(order) {
		return nil, fmt.Errorf("%w: Blender wrote %d outputs of frame %d for the %d formats %s", ErrProcess, len(reply.Outputs), frame, len(order), what)
	}
	byFormat := make(map[string]*Assembled, len(order))
	for i, o := range reply.Outputs {
		a := &Assembled{Name: o.Name, Files: map[string][]byte{}}
		if a.Main, err = readUnder(out, o.Main); err != nil {
			return nil, err
		}
		for _, name := range o.Files {
			data, err := readUnder(filepath.Join(out, "files"), name)
			if err != nil {
				return nil, err
			}
			a.Files[filepath.ToSlash(name)] = data
		}
		byFormat[order[i]] = a
	}
	as := make([]*Assembled, len(formats))
	for i, format := range formats {
		as[i] = byFormat[format]
	}
	return as, nil
}

// readUnder reads the file the driver named under dir, refusing a name that leaves it.
func readUnder(dir, name string) ([]byte, error) {
	if !filepath.IsLocal(name) {
		return nil, fmt.Errorf("%w: the driver named %q outside its output directory", ErrProcess, name)
	}
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return nil, fmt.Errorf("%w: reading what Blender wrote: %v", ErrProcess, err)
	}
	return data, nil
}
