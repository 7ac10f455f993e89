package worker

import (
	"context"
	"errors"
	"fmt"

	"github.com/tilefarm/tilefarm/blender"
	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/failure"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/raster"
	"github.com/tilefarm/tilefarm/render"
)

// scene is a loaded scene, whichever renderer draws it: the worker's renderer seam
// (docs/design.md, "Renderers"). The Render flow, checkpoints and assembly only ever see it
// and its tiles.
type scene interface {
	// newTile prepares rendering rect r of frame with st.
	newTile(ctx context.Context, st render.Settings, frame int, r render.Rect) (tileRenderer, error)
	// encode encodes an assembled linear frame in one output format; an error no retry can
	// fix is terminal.
	encode(ctx context.Context, f *raster.Frame, st render.Settings, format string) ([]byte, error)
}

// tileRenderer renders one tile in sample ranges [from, to) that end on the ends of
// Settings.PassEnds; its exported state is what a checkpoint holds, and importing it resumes
// the tile bit for bit.
type tileRenderer interface {
	Next() int
	Render(ctx context.Context, from, to int) error
	Export() render.State
	Import(render.State) error
	Pixels() []float32
}

// pathTracer is a tilefarm JSON scene, rendered by the built-in path tracer.
type pathTracer struct{ s *render.Scene }

func (p pathTracer) newTile(_ context.Context, st render.Settings, frame int, r render.Rect) (tileRenderer, error) {
	t, err := render.NewTile(p.s, st, frame, r)
	if err != nil {
		return nil, failure.Terminalf("creating tile: %w", err)
	}
	return t, nil
}

// encode tone-maps PNGs with tilefarm's own curve (the scene's exposure). Its errors are
// deterministic, so terminal.
func (p pathTracer) encode(_ context.Context, f *raster.Frame, st render.Settings, format string) ([]byte, error) {
	var data []byte
	var err error
	switch format {
	case "png":
		data, err = raster.EncodePNG8(f, st.Exposure)
	case "png16":
		data, err = raster.EncodePNG16(f, st.Exposure)
	default:
		return encodeLinear(f, format)
	}
	if err != nil {
		return nil, failure.Terminalf("encoding %s: %w", format, err)
	}
	return data, nil
}

// cycles is a Blender scene, rendered by Blender's Cycles through a pool of Blender processes.
type cycles struct {
	s    *blender.Scene
	pool *blender.Pool
}

func (c cycles) newTile(ctx context.Context, st render.Settings, frame int, r render.Rect) (tileRenderer, error) {
	t, err := blender.NewTile(ctx, c.pool, c.s, st, frame, r)
	if err != nil {
		return nil, blenderErr("creating tile", err)
	}
	return cyclesTile{t}, nil
}

// encode has Blender encode PNGs through the scene's own colour management, so they look as
// Blender's own renders of the scene do.
func (c cycles) encode(ctx context.Context, f *raster.Frame, _ render.Settings, format string) ([]byte, error) {
	depth := 0
	switch format {
	case "png":
		depth = 8
	case "png16":
		depth = 16
	default:
		return encodeLinear(f, format)
	}
	data, err := blender.EncodePNG(ctx, c.pool, c.s, f, depth)
	if err != nil {
		return nil, blenderErr("encoding "+format, err)
	}
	return data, nil
}

// cyclesTile classifies the errors of a Blender tile for the farm.
type cyclesTile struct{ *blender.Tile }

func (t cyclesTile) Render(ctx context.Context, from, to int) error {
	if err := t.Tile.Render(ctx, from, to); err != nil {
		return blenderErr("rendering", err)
	}
	return nil
}

// blenderErr makes an error of the scene or of a build mismatch terminal: no worker of this
// farm can render it. A crashed or hung Blender process is retried.
func blenderErr(what string, err error) error {
	if errors.Is(err, blender.ErrScene) || errors.Is(err, blender.ErrBuildMismatch) {
		return failure.Terminalf("%s: %w", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// encodeLinear encodes the formats that hold the linear frame itself, whatever the renderer.
func encodeLinear(f *raster.Frame, format string) ([]byte, error) {
	if format != "exr" {
		return nil, failure.Terminalf("unknown output format %q", format)
	}
	data, err := raster.EncodeEXR(f, raster.EXRZip)
	if err != nil {
		return nil, failure.Terminalf("encoding exr: %w", err)
	}
	return data, nil
}

// encodeFrame encodes a frame in each of formats, in order, as named outputs of a manifest.
func encodeFrame(ctx context.Context, sc scene, f *raster.Frame, st render.Settings, formats []string) ([]finalize.Output, error) {
	outs := make([]finalize.Output, 0, len(formats))
	for _, format := range formats {
		name, ok := layout.FrameOutputName(format)
		if !ok {
			return nil, failure.Terminalf("unknown output format %q", format)
		}
		data, err := sc.encode(ctx, f, st, format)
		if err != nil {
			return nil, err
		}
		outs = append(outs, finalize.Output{Name: name, Data: data})
	}
	return outs, nil
}
