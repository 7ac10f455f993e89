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
)

// readScene reads a scene file into a validated bundle of its kind among kinds, so bad input
// fails before anything starts or is sent: a tilefarm JSON scene with the assets it names, a
// .blend that Blender inspects with every file it depends on. What the kind says about how the
// farm renders the scene (the settings of a Blender scene that cannot be split by tile and are
// switched off) is printed on w, one line each. An error of the scene is bad input (exit 1).
func readScene(ctx context.Context, path string, kinds scene.Kinds, w io.Writer) (*bundle.Bundle, scene.Kind, error) {
	b, k, notes, err := kinds.Read(ctx, path)
	if err != nil {
		if failure.IsTerminal(err) {
			return nil, nil, fmt.Errorf("%w: %v", api.ErrBadInput, err)
		}
		return nil, nil, err
	}
	for _, line := range notes {
		fmt.Fprintf(w, "%s: %s\n", filepath.Base(path), line)
	}
	return b, k, nil
}
