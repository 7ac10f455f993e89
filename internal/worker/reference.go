package worker

import (
	"context"
	"fmt"
	"sync"

	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/raster"
	"github.com/tilefarm/tilefarm/render"
	"github.com/tilefarm/tilefarm/tiles"
)

// Reference renders frames of a scene on this machine with no farm, through the renderer seam,
// tiles, passes and encoders the farm's workers use: the pixels every farm frame must equal.
type Reference struct {
	sc       scene.Renderer
	tileSize int // the default for the scene's kind
}

// NewReference loads a scene bundle for local rendering with its kind among kinds; a kind
// that unpacks files (Blender's) does so under dir.
func NewReference(ctx context.Context, kinds scene.Kinds, b *bundle.Bundle, dir string) (*Reference, error) {
	sc, k, err := kinds.Load(ctx, b, b.Version(), dir)
	if err != nil {
		return nil, err
	}
	return &Reference{sc: sc, tileSize: k.TileSize()}, nil
}

// ErrBadTiling is returned for a tile size that cannot split the frame.
var ErrBadTiling = fmt.Errorf("bad tile size")

// RenderFrame renders a whole frame on parallel goroutines, one tile each at a time, each tile
// pass by pass as a worker renders it (one pass where the partition is the worker's choice:
// the bits are the same). A tileSize of 0 is the scene kind's default. onTile, if set, is
// called after every tile.
func (ref *Reference) RenderFrame(ctx context.Context, st render.Settings, frame, tileSize, parallel int, onTile func(done, total int)) (*raster.Frame, error) {
	if tileSize == 0 {
		tileSize = ref.tileSize
	}
	rects, err := tiles.Split(st.Width, st.Height, tileSize)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadTiling, err)
	}
	img := raster.NewFrameOf(st.Width, st.Height, ref.sc.Channels(st))
	next := make(chan render.Rect)
	var (
		mu    sync.Mutex
		done  int
		first error
		wg    sync.WaitGroup
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range next {
				pix, err := ref.renderTile(ctx, st, frame, r)
				mu.Lock()
				if err == nil {
					err = img.Place(r.X0, r.Y0, r.X1, r.Y1, pix)
				}
				if err != nil && first == nil {
					first = err
					cancel()
				}
				done++
				if onTile != nil {
					onTile(done, len(rects))
				}
				mu.Unlock()
			}
		}()
	}
	for _, r := range rects {
		if ctx.Err() != nil {
			break
		}
		next <- r
	}
	close(next)
	wg.Wait()
	if first != nil {
		return nil, first
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return img, nil
}

func (ref *Reference) renderTile(ctx context.Context, st render.Settings, frame int, r render.Rect) ([]float32, error) {
	t, err := ref.sc.NewTile(ctx, st, frame, r)
	if err != nil {
		return nil, err
	}
	for _, end := range st.PassEnds(1) {
		if err := t.Render(ctx, t.Next(), end); err != nil {
			return nil, err
		}
	}
	return t.Pixels(), nil
}

// Encode encodes frame number frame in each of formats as the farm's assembler does.
func (ref *Reference) Encode(ctx context.Context, f *raster.Frame, frame int, st render.Settings, formats []string) ([]scene.Output, error) {
	if _, err := outputNames(formats); err != nil {
		return nil, err
	}
	return ref.sc.Encode(ctx, f, frame, st, formats)
}
