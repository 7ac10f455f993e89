package worker

import (
	"context"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/failure"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/raster"
	"github.com/tilefarm/tilefarm/render"
)

// The worker sees a scene only as a scene.Renderer and its tiles as scene.Tile, whatever its
// kind (docs/design.md, "Renderers"): the Render flow, checkpoints, resumption, assembly and
// the reference render are the same code for every kind.

// encodeFrame encodes a frame in each of formats, in order, as named outputs of a manifest.
func encodeFrame(ctx context.Context, sc scene.Renderer, f *raster.Frame, st render.Settings, formats []string) ([]finalize.Output, error) {
	outs := make([]finalize.Output, 0, len(formats))
	for _, format := range formats {
		name, ok := layout.FrameOutputName(format)
		if !ok {
			return nil, failure.Terminalf("unknown output format %q", format)
		}
		data, err := sc.Encode(ctx, f, st, format)
		if err != nil {
			return nil, err
		}
		outs = append(outs, finalize.Output{Name: name, Data: data})
	}
	return outs, nil
}
