package cli

import (
	"context"
	"fmt"
	"io"
	"path/filepath"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/failure"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/render"
)

// readScene reads a scene file into a validated bundle of its kind among kinds, so bad input
// fails before anything starts or is sent: a tilefarm JSON scene with the assets it names, a
// .blend that Blender inspects with every file it depends on. It resolves the settings with o
// and prints on w, one line each, what the scene's description notes about how the farm
// renders it so (a Blender scene rendering whole and why, what splitting switches off). An
// error of the scene is bad input (exit 1).
func readScene(ctx context.Context, path string, kinds scene.Kinds, o render.Overrides, w io.Writer) (*bundle.Bundle, scene.Kind, scene.Description, render.Settings, error) {
	bad := func(err error) error {
		if failure.IsTerminal(err) {
			return fmt.Errorf("%w: %v", api.ErrBadInput, err)
		}
		return err
	}
	b, k, err := kinds.Read(ctx, path)
	if err != nil {
		return nil, nil, nil, render.Settings{}, bad(err)
	}
	d, err := k.Describe(b.Scene)
	if err != nil {
		return nil, nil, nil, render.Settings{}, fmt.Errorf("%w: %v", api.ErrBadInput, err)
	}
	st, err := d.Resolve(o)
	if err != nil {
		return nil, nil, nil, render.Settings{}, fmt.Errorf("%w: %v", api.ErrBadInput, err)
	}
	for _, line := range d.Notes(o) {
		fmt.Fprintf(w, "%s: %s\n", filepath.Base(path), line)
	}
	return b, k, d, st, nil
}
