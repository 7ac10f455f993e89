// Package scene is where the farm meets a renderer. A Kind is one kind of scene (the tilefarm
// JSON scene of the built-in path tracer, a Blender .blend) and answers what every layer used
// to ask by branching on the kind: the commands read a scene file into a bundle; the
// coordinator checks a bundle, resolves a submission's settings and tile size from it and
// encodes tile previews; the worker loads it, renders its tiles pass by pass and encodes its
// frames. The kinds a process knows are one Kinds value, made in one place (internal/kinds),
// so adding a renderer is one package and one registration (docs/design.md, "Renderers").
package scene

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/failure"
	"github.com/tilefarm/tilefarm/raster"
	"github.com/tilefarm/tilefarm/render"
)

// Kind is one kind of scene. Its errors that no retry can fix (the scene is invalid, a tile
// was made for another build) are failure.Terminal; the rest (a renderer process that died, a
// renderer missing on this machine) may work when tried again.
type Kind interface {
	// Name names the kind in messages.
	Name() string
	// ClaimsFile reports whether the file at path is a scene of this kind, by its name or its
	// first bytes.
	ClaimsFile(path string) bool
	// ClaimsDocument reports whether a bundle's scene document is one of this kind.
	ClaimsDocument(doc []byte) bool
	// Read reads the scene file at path and every file it needs into a bundle.
	Read(ctx context.Context, path string) (*bundle.Bundle, error)
	// Describe reads what a submission needs from a scene document alone, assets unread.
	Describe(doc []byte) (Description, error)
	// Validate checks a bundle's scene and every file it names, rendering nothing: how a
	// bundle is checked where it is not rendered. It reads content through the bundle's
	// Source, and only what it must (a .blend's header, not the .blend).
	Validate(ctx context.Context, b *bundle.Bundle) error
	// Load makes a bundle renderable on this machine; dir is where the kind may keep files of
	// the scene (a worker's scene cache, "" for none).
	Load(ctx context.Context, b *bundle.Bundle, version, dir string) (Renderer, error)
	// TileSize is the default tile edge in pixels: tile size never changes a pixel, it trades
	// parallelism against what each tile costs the renderer.
	TileSize() int
	// Formats are the output formats the kind encodes, its default first: what a submission
	// naming none gets (with png, which the monitor shows, always added).
	Formats() []string
	// TilePreviews reports whether EncodeTilePreview can encode a tile on its own.
	TilePreviews() bool
	// EncodeTilePreview encodes a promoted tile's pixels as its frame's 8-bit PNG shows them,
	// for the monitor to draw while the frame renders.
	EncodeTilePreview(r render.Rect, pix []float32, st render.Settings) ([]byte, error)
}

// Description is what a scene document says: its settings with a request's overrides applied,
// its own frame range, and the bundle files it references.
type Description interface {
	Resolve(render.Overrides) (render.Settings, error)
	Frames() (first, last int)
	// FrameStep is the distance between the frames the scene renders by default (a .blend's
	// frame step; 1 for every frame).
	FrameStep() int
	Assets() []string
	// Notes are lines for the artist about how the farm renders the scene with these
	// overrides: whether its frames split or render whole and why, what is switched off.
	Notes(render.Overrides) []string
}

// Renderer is a loaded scene: what the Render and Finalize flows, checkpoints and assembly
// see of it (docs/design.md, "Renderers").
type Renderer interface {
	// NewTile prepares rendering rect r of frame with st.
	NewTile(ctx context.Context, st render.Settings, frame int, r render.Rect) (Tile, error)
	// Channels names the values of a pixel of the scene's tiles and frames rendered with st
	// when they are more than linear RGB (a Blender scene's every view layer and pass, which a
	// frame rendered whole may have more of); nil is R, G, B.
	Channels(st render.Settings) []string
	// Encode encodes an assembled frame of the given number in each of formats, returned in
	// their order: one call for all of them, so a renderer whose encoding runs a pipeline (a
	// Blender compositor) runs it once a frame.
	Encode(ctx context.Context, f *raster.Frame, frame int, st render.Settings, formats []string) ([]Output, error)
}

// Output is an assembled frame encoded in one format: its main file and, for a renderer whose
// own pipeline writes more (a Blender compositor's File Output nodes), the other files.
type Output struct {
	// Name is the main file's name as the renderer names it, or "" where the farm names it
	// (a Blender scene's own output: "//render/shot_0001.exr", relative to the .blend).
	Name string
	Data []byte
	// Files are the other files by their path relative to the scene's directory.
	Files map[string][]byte
}

// Tile renders one tile in sample ranges [from, to) that end on the ends of
// Settings.PassEnds; its exported state is what a checkpoint holds, and importing it resumes
// the tile bit for bit.
type Tile interface {
	Next() int
	Render(ctx context.Context, from, to int) error
	Export() render.State
	Import(render.State) error
	Pixels() []float32
}

// OutputError is an error of a renderer that carries the last lines the renderer printed
// before it (a Blender process's stdout and stderr), so that the worker's failure event can
// quote them (docs/design.md, "Failures, deliveries and the failure budget").
type OutputError interface {
	error
	RendererOutput() []string
}

// RendererOutput returns the lines of renderer output err carries (OutputError, anywhere in
// its chain), nil if none.
func RendererOutput(err error) []string {
	var o OutputError
	if errors.As(err, &o) {
		return o.RendererOutput()
	}
	return nil
}

// Env is what the kinds of a process may use of its machine.
type Env struct {
	Dir   string // where renderer processes keep their working files
	Slots int    // renderer processes at most of each kind: one per tile slot
	// Threads is how many threads each renderer process renders with (0: one). Measured on
	// every Blender line: the bits do not depend on it, so it is in no tile's identity.
	Threads int
	Log     *slog.Logger
}

// Kinds are the kinds of scene a process renders, in the order they are asked: the first that
// claims a file or a document is its kind.
type Kinds []Kind

// ErrUnknownKind is returned for a file or a bundle no kind claims.
var ErrUnknownKind = errors.New("unknown kind of scene")

// ForFile returns the kind of the scene file at path.
func (ks Kinds) ForFile(path string) (Kind, error) {
	for _, k := range ks {
		if k.ClaimsFile(path) {
			return k, nil
		}
	}
	return nil, fmt.Errorf("%w: %s (this farm knows: %s)", ErrUnknownKind, path, ks.names())
}

// ForDocument returns the kind of a bundle's scene document.
func (ks Kinds) ForDocument(doc []byte) (Kind, error) {
	for _, k := range ks {
		if k.ClaimsDocument(doc) {
			return k, nil
		}
	}
	return nil, fmt.Errorf("%w (this farm knows: %s)", ErrUnknownKind, ks.names())
}

func (ks Kinds) names() string {
	s := ""
	for i, k := range ks {
		if i > 0 {
			s += ", "
		}
		s += k.Name()
	}
	return s
}

// Read reads the scene file at path into a validated bundle of its kind. An error of the scene
// itself is terminal (failure.IsTerminal): the artist's to fix, where anything else is this
// machine's.
func (ks Kinds) Read(ctx context.Context, path string) (*bundle.Bundle, Kind, error) {
	k, err := ks.ForFile(path)
	if err != nil {
		return nil, nil, failure.Terminal(err)
	}
	b, err := k.Read(ctx, path)
	if err != nil {
		return nil, nil, err
	}
	if err := k.Validate(ctx, b); err != nil {
		return nil, nil, failure.Terminal(err)
	}
	return b, k, nil
}

// Check is how a bundle that is stored, not rendered, is checked: of a known kind, carrying
// exactly the files its scene references (nothing an attacker or a stray directory could add),
// valid, and describing itself. Every error is the bundle's fault.
func (ks Kinds) Check(ctx context.Context, b *bundle.Bundle) (Kind, Description, error) {
	k, err := ks.ForDocument(b.Scene)
	if err != nil {
		return nil, nil, err
	}
	d, err := k.Describe(b.Scene)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", bundle.ErrInvalid, err)
	}
	refs := make(map[string]bool, len(d.Assets()))
	for _, name := range d.Assets() {
		refs[name] = true
	}
	for name := range b.Files {
		if !refs[name] {
			return nil, nil, fmt.Errorf("%w: asset %q is not referenced by the scene", bundle.ErrInvalid, name)
		}
	}
	if err := k.Validate(ctx, b); err != nil {
		return nil, nil, err
	}
	return k, d, nil
}

// Load loads a bundle with its kind (Kind.Load).
func (ks Kinds) Load(ctx context.Context, b *bundle.Bundle, version, dir string) (Renderer, Kind, error) {
	k, err := ks.ForDocument(b.Scene)
	if err != nil {
		return nil, nil, failure.Terminalf("scene %s: %w", version, err)
	}
	r, err := k.Load(ctx, b, version, dir)
	return r, k, err
}

// Builder is a kind whose tiles render on a build of its renderer that the worker must run
// (Blender's, or the built-in path tracer's own): Builds are the fingerprints of this
// machine's builds, what a scene's render.Settings.Build names, the ones that run even when
// others fail (the error names those). Tiles of a build reach only the workers that report it
// (docs/design.md, "Dispatch").
type Builder interface {
	Builds(ctx context.Context) ([]string, error)
}

// BuildFilter is a description whose scene renders only on some of its renderer's builds (a
// .blend on a build of the Blender line that saved it, or the nearest newer line): FitBuilds
// returns those of builds (the live ones the job may use, in the farm's order) that render
// it, and a note for the artist when the choice is not the scene's own; an error of the scene
// when none can.
type BuildFilter interface {
	FitBuilds(builds []string) ([]string, string, error)
}

// Close stops the renderer processes of the kinds that run any.
func (ks Kinds) Close() error {
	var errs []error
	for _, k := range ks {
		if c, ok := k.(interface{ Close() error }); ok {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}

// RGBFormats are the output formats of a renderer of linear RGB frames: 8- and 16-bit PNG
// and OpenEXR.
var RGBFormats = []string{"png", "png16", "exr"}

// EncodeRGB encodes a linear RGB frame in each of formats as the renderers of such frames do:
// PNGs tone-mapped with tilefarm's curve at exposure, OpenEXR the linear frame itself. Its
// errors are deterministic, so terminal.
func EncodeRGB(f *raster.Frame, exposure float64, formats []string) ([]Output, error) {
	outs := make([]Output, len(formats))
	for i, format := range formats {
		var data []byte
		var err error
		switch format {
		case "png":
			data, err = raster.EncodePNG8(f, exposure)
		case "png16":
			data, err = raster.EncodePNG16(f, exposure)
		case "exr":
			data, err = raster.EncodeEXR(f, raster.EXRZip)
		default:
			return nil, failure.Terminalf("unknown output format %q", format)
		}
		if err != nil {
			return nil, failure.Terminalf("encoding %s: %w", format, err)
		}
		outs[i] = Output{Data: data}
	}
	return outs, nil
}
