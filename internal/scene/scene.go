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
	"slices"

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
	// Read reads the scene file at path and every file it needs into a bundle. Notes are lines
	// for the artist about how the farm renders the scene (settings it switches off).
	Read(ctx context.Context, path string) (b *bundle.Bundle, notes []string, err error)
	// Describe reads what a submission needs from a scene document alone, assets unread.
	Describe(doc []byte) (Description, error)
	// Validate checks a bundle's scene and every file it names, rendering nothing: how a
	// bundle is checked where it is not rendered.
	Validate(b *bundle.Bundle) error
	// Load makes a bundle renderable on this machine; dir is where the kind may keep files of
	// the scene (a worker's scene cache, "" for none).
	Load(ctx context.Context, b *bundle.Bundle, version, dir string) (Renderer, error)
	// TileSize is the default tile edge in pixels: tile size never changes a pixel, it trades
	// parallelism against what each tile costs the renderer.
	TileSize() int
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
	Assets() []string
}

// Renderer is a loaded scene: what the Render and Finalize flows, checkpoints and assembly
// see of it (docs/design.md, "Renderers").
type Renderer interface {
	// NewTile prepares rendering rect r of frame with st.
	NewTile(ctx context.Context, st render.Settings, frame int, r render.Rect) (Tile, error)
	// Encode encodes an assembled linear frame in one output format.
	Encode(ctx context.Context, f *raster.Frame, st render.Settings, format string) ([]byte, error)
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

// Env is what the kinds of a process may use of its machine.
type Env struct {
	Dir   string // where renderer processes keep their working files
	Slots int    // renderer processes at most of each kind: one per tile slot
	Log   *slog.Logger
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

// Read reads the scene file at path into a validated bundle of its kind, with the kind's
// notes for the artist. An error of the scene itself is terminal (failure.IsTerminal): the
// artist's to fix, where anything else is this machine's.
func (ks Kinds) Read(ctx context.Context, path string) (*bundle.Bundle, Kind, []string, error) {
	k, err := ks.ForFile(path)
	if err != nil {
		return nil, nil, nil, failure.Terminal(err)
	}
	b, notes, err := k.Read(ctx, path)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := k.Validate(b); err != nil {
		return nil, nil, nil, failure.Terminal(err)
	}
	return b, k, notes, nil
}

// Check is how a bundle that is stored, not rendered, is checked: of a known kind, carrying
// exactly the files its scene references (nothing an attacker or a stray directory could add),
// valid, and describing itself. Every error is the bundle's fault.
func (ks Kinds) Check(b *bundle.Bundle) (Kind, Description, error) {
	k, err := ks.ForDocument(b.Scene)
	if err != nil {
		return nil, nil, err
	}
	d, err := k.Describe(b.Scene)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", bundle.ErrInvalid, err)
	}
	refs := d.Assets()
	for name := range b.Assets {
		if !slices.Contains(refs, name) {
			return nil, nil, fmt.Errorf("%w: asset %q is not referenced by the scene", bundle.ErrInvalid, name)
		}
	}
	if err := k.Validate(b); err != nil {
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

// EncodeLinear encodes the formats that hold the linear frame itself, whatever the renderer:
// OpenEXR. Its errors are deterministic, so terminal.
func EncodeLinear(f *raster.Frame, format string) ([]byte, error) {
	if format != "exr" {
		return nil, failure.Terminalf("unknown output format %q", format)
	}
	data, err := raster.EncodeEXR(f, raster.EXRZip)
	if err != nil {
		return nil, failure.Terminalf("encoding exr: %w", err)
	}
	return data, nil
}
