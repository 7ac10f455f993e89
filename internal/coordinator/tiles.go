package coordinator

import (
	"context"
	"fmt"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/raster"
	"github.com/tilefarm/tilefarm/render"
	"github.com/tilefarm/tilefarm/tiles"
)

// jobFrame looks up frame n of a job, checking that the job asked for it.
func jobFrame(tx *coorddb.Tx, jobID string, n int) (*coorddb.Job, *coorddb.Frame, error) {
	j, err := tx.Job(jobID)
	if err != nil {
		return nil, nil, err
	}
	if n < j.First || n > j.Last {
		return nil, nil, fmt.Errorf("%w: frame %d is not in job %s (frames %d-%d)", api.ErrBadInput, n, jobID, j.First, j.Last)
	}
	f, err := tx.Frame(j.FrameKey(n))
	if err != nil {
		return nil, nil, err
	}
	return j, f, nil
}

// TilePNG returns tile index of a job's frame, read through its manifest, tone-mapped and
// encoded exactly as the frame's 8-bit PNG is (raster.EncodePNG8 with the frame's exposure,
// pixel by pixel), so tiles drawn at their rectangles reproduce the frame's PNG. A tile not
// completed yet is ErrTileNotReady; every tile of a Blender scene is a conflict, since its PNG
// is encoded by Blender's colour management and cannot be reproduced tile by tile.
func (c *Coordinator) TilePNG(ctx context.Context, jobID string, frame, index int) ([]byte, error) {
	var f *coorddb.Frame
	var tile tiles.FrameTile
	err := c.db.View(ctx, func(tx *coorddb.Tx) (err error) {
		_, f, err = jobFrame(tx, jobID, frame)
		if err != nil {
			return err
		}
		ft, err := f.Tiles()
		if err != nil {
			return err
		}
		if index < 0 || index >= len(ft) {
			return fmt.Errorf("%w: frame %d has tiles 0-%d, not %d", api.ErrBadInput, frame, len(ft)-1, index)
		}
		tile = ft[index]
		table, err := tx.TileTable(f)
		if err != nil {
			return err
		}
		if s, _ := table.Get(index); s != coorddb.TileCompleted {
			return fmt.Errorf("tile %d of frame %d is %s: %w", index, frame, s, api.ErrTileNotReady)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sc, err := c.scene(ctx, f.SceneVersion)
	if err != nil {
		return nil, err
	}
	if sc.blender {
		return nil, fmt.Errorf("frame %d is of a Blender scene: %w; fetch the finished frame (GET /v1/jobs/%s/frames/%d/png)", frame, api.ErrNoTilePNG, jobID, frame)
	}
	pix, err := layout.ReadTile(ctx, c.objects, f.Key, tile, f.Settings)
	if err != nil {
		return nil, fmt.Errorf("reading tile %d of frame %d: %w", index, frame, err)
	}
	return encodeTilePNG(tile.Rect, pix, f.Settings)
}

// encodeTilePNG encodes a tile's buffer as the frame PNG encodes its pixels.
func encodeTilePNG(r render.Rect, pix []float32, st render.Settings) ([]byte, error) {
	data, err := raster.EncodePNG8(&raster.Frame{Width: r.Dx(), Height: r.Dy(), Pix: pix}, st.Exposure)
	if err != nil {
		return nil, fmt.Errorf("encoding tile: %w", err)
	}
	return data, nil
}

// FrameTiles lists a job's frame's tiles with their rectangles and states.
func (c *Coordinator) FrameTiles(ctx context.Context, jobID string, frame int) (api.FrameTiles, error) {
	var out api.FrameTiles
	var version string
	err := c.db.View(ctx, func(tx *coorddb.Tx) error {
		j, f, err := jobFrame(tx, jobID, frame)
		if err != nil {
			return err
		}
		table, err := tx.TileTable(f)
		if err != nil {
			return err
		}
		ft, err := f.Tiles()
		if err != nil {
			return err
		}
		version = f.SceneVersion
		out = api.FrameTiles{JobID: j.ID, Frame: frame, Width: f.Settings.Width, Height: f.Settings.Height,
			State: apiFrameState(f.StateFor(j.Formats)), Tiles: make([]api.TileInfo, len(ft))}
		for i, t := range ft {
			s, _ := table.Get(i)
			r := t.Rect
			out.Tiles[i] = api.TileInfo{Index: i, TileKey: t.Key, Rect: api.TileRect{X0: r.X0, Y0: r.Y0, X1: r.X1, Y1: r.Y1}, State: apiTileState(s)}
		}
		return nil
	})
	if err != nil {
		return out, err
	}
	sc, err := c.scene(ctx, version)
	if err != nil {
		return out, err
	}
	out.TilePNG = !sc.blender
	return out, nil
}
