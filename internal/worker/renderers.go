package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

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

// encodeFrame encodes a frame of the given number in each of formats, in order: each format
// the named objects of its manifest (the main file, and for a renderer that names its files,
// the other files and the index naming them, layout.FrameIndex).
func encodeFrame(ctx context.Context, sc scene.Renderer, f *raster.Frame, frame int, st render.Settings, formats []string) ([][]finalize.Output, error) {
	names, err := outputNames(formats)
	if err != nil {
		return nil, err
	}
	encoded, err := sc.Encode(ctx, f, frame, st, formats)
	if err != nil {
		return nil, err
	}
	if len(encoded) != len(formats) {
		return nil, fmt.Errorf("the renderer encoded %d outputs for the %d formats %v", len(encoded), len(formats), formats)
	}
	outs := make([][]finalize.Output, 0, len(formats))
	for i, format := range formats {
		name, o := names[i], encoded[i]
		objs := []finalize.Output{{Name: name, Data: o.Data}}
		if o.Name != "" || len(o.Files) > 0 {
			index := layout.FrameIndex{Name: o.Name, Files: append([]string{}, slices.Sorted(maps.Keys(o.Files))...)}
			for i, path := range index.Files {
				objs = append(objs, finalize.Output{Name: layout.FrameFileName(i), Data: o.Files[path]})
			}
			data, err := json.Marshal(index)
			if err != nil {
				return nil, failure.Terminalf("indexing %s: %w", format, err)
			}
			objs = append(objs, finalize.Output{Name: layout.FrameIndexName, Data: data})
		}
		outs = append(outs, objs)
	}
	return outs, nil
}

// outputNames are the object names of formats' main files, or a terminal error naming a format
// the farm does not know.
func outputNames(formats []string) ([]string, error) {
	names := make([]string, len(formats))
	for i, format := range formats {
		name, ok := layout.FrameOutputName(format)
		if !ok {
			return nil, failure.Terminalf("unknown output format %q", format)
		}
		names[i] = name
	}
	return names, nil
}
