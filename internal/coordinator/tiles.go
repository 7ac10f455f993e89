package coordinator

import (
	"context"
	"errors"
	"fmt"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/farm"
	"github.com/tilefarm/tilefarm/internal/store"
	"github.com/tilefarm/tilefarm/render"
	"github.com/tilefarm/tilefarm/tiles"
)

// TileRect is a tile's half-open rectangle [x0,x1) x [y0,y1) in frame pixels, y=0 at the top.
type TileRect struct {
	X0 int `json:"x0"`
	Y0 int `json:"y0"`
	X1 int `json:"x1"`
	Y1 int `json:"y1"`
}

// TileInfo is one tile of a frame as the coordinator's tile table has it.
type TileInfo struct {
	Index   int      `json:"index"`
	TileKey string   `json:"tile_key"`
	Rect    TileRect `json:"rect"`
	State   string   `json:"state"` // queued, rendering, failed_retryable, dead_lettered, completed
}

// FrameTiles is the body of GET /v1/jobs/{id}/frames/{frame}/tiles: where each tile of a
// frame lies and where it stands, so a viewer knows where to draw each promoted tile.
type FrameTiles struct {
	JobID  string `json:"job_id"`
	Frame  int    `json:"frame"`
	Width  int    `json:"width"`
	Height int    `json:"height"`
	State  string `json:"state"` // the frame's state as the job sees it
	// TilePNG says whether GET .../tiles/{index}/png serves the tiles: true for JSON scenes,
	// false for Blender scenes, whose PNGs Blender's colour management encodes.
	TilePNG bool       `json:"tile_png"`
	Tiles   []TileInfo `json:"tiles"`
}

// jobFrame looks up frame n of a job, checking that the job asked for it.
func jobFrame(tx *store.Tx, jobID string, n int) (*store.Job, *store.Frame, error) {
	j, err := tx.Job(jobID)
	if err != nil {
		return nil, nil, err
	}
	if n < j.First || n > j.Last {
		return nil, nil, fmt.Errorf("%w: frame %d is not in job %s (frames %d-%d)", ErrBadInput, n, jobID, j.First, j.Last)
	}
	f, err := tx.Frame(j.FrameKey(n))
	if err != nil {
		return nil, nil, err
	}
	return j, f, nil
}

// FrameTiles lists a job's frame's tiles with their rectangles and states.
func (c *Coordinator) FrameTiles(ctx context.Context, jobID string, frame int) (FrameTiles, error) {
	var out FrameTiles
	var version string
	err := c.store.View(ctx, func(tx *store.Tx) error {
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
		out = FrameTiles{JobID: j.ID, Frame: frame, Width: f.Settings.Width, Height: f.Settings.Height,
			State: f.StateFor(j.Formats).String(), Tiles: make([]TileInfo, len(ft))}
		for i, t := range ft {
			s, _ := table.Get(i)
			r := t.Rect
			out.Tiles[i] = TileInfo{Index: i, TileKey: t.Key, Rect: TileRect{r.X0, r.Y0, r.X1, r.Y1}, State: s.String()}
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

// TilePNG returns tile index of a job's frame, read through its manifest, tone-mapped and
// encoded exactly as the frame's 8-bit PNG is (finalize.EncodePNG8 with the frame's exposure,
// pixel by pixel), so tiles drawn at their rectangles reproduce the frame's PNG. A tile not
// completed yet is ErrTileNotReady; every tile of a Blender scene is a conflict, since its PNG
// is encoded by Blender's colour management and cannot be reproduced tile by tile.
func (c *Coordinator) TilePNG(ctx context.Context, jobID string, frame, index int) ([]byte, error) {
	var f *store.Frame
	var tile tiles.FrameTile
	err := c.store.View(ctx, func(tx *store.Tx) (err error) {
		_, f, err = jobFrame(tx, jobID, frame)
		if err != nil {
			return err
		}
		ft, err := f.Tiles()
		if err != nil {
			return err
		}
		if index < 0 || index >= len(ft) {
			return fmt.Errorf("%w: frame %d has tiles 0-%d, not %d", ErrBadInput, frame, len(ft)-1, index)
		}
		tile = ft[index]
		table, err := tx.TileTable(f)
		if err != nil {
			return err
		}
		if s, _ := table.Get(index); s != store.TileCompleted {
			return fmt.Errorf("tile %d of frame %d is %s: %w", index, frame, s, ErrTileNotReady)
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
		return nil, fmt.Errorf("frame %d is of a Blender scene: %w; fetch the finished frame (GET /v1/jobs/%s/frames/%d/png)", frame, ErrNoTilePNG, jobID, frame)
	}
	pix, err := farm.ReadTile(ctx, c.objects, f.Key, tile, f.Settings)
	if err != nil {
		return nil, fmt.Errorf("reading tile %d of frame %d: %w", index, frame, err)
	}
	return encodeTilePNG(tile.Rect, pix, f.Settings)
}

// ErrNoTilePNG is returned for the PNG of a Blender scene's tile.
var ErrNoTilePNG = errors.New("its tiles have no PNG of their own, since Blender's colour management encodes its PNG")

// ErrTileNotReady is returned for the PNG of a tile that is not completed yet.
var ErrTileNotReady = errors.New("tile not completed yet")

// encodeTilePNG encodes a tile's buffer as the frame PNG encodes its pixels.
func encodeTilePNG(r render.Rect, pix []float32, st render.Settings) ([]byte, error) {
	data, err := finalize.EncodePNG8(&finalize.Frame{Width: r.Dx(), Height: r.Dy(), Pix: pix}, st.Exposure)
	if err != nil {
		return nil, fmt.Errorf("encoding tile: %w", err)
	}
	return data, nil
}
