package coordinator

import (
	"context"
	"fmt"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/render"
	"github.com/tilefarm/tilefarm/tiles"
)

// jobFrame looks up frame n of a job, checking that the job asked for it.
func jobFrame(tx *coorddb.Tx, jobID string, n int) (*coorddb.Job, *coorddb.Frame, error) {
	j, err := tx.Job(jobID)
	if err != nil {
		return nil, nil, err
	}
	if !j.HasFrame(n) {
		return nil, nil, fmt.Errorf("%w: frame %d is not in job %s (%s)", api.ErrBadInput, n, jobID, j.FrameRange())
	}
	f, err := tx.Frame(j.FrameKey(n))
	if err != nil {
		return nil, nil, err
	}
	return j, f, nil
}

// frameTile is a tile of a job's frame with where it stands.
type frameTile struct {
	job   *coorddb.Job
	frame *coorddb.Frame
	tile  tiles.FrameTile
	state coorddb.TileState
}

// jobTile looks up tile index of frame n of a job; a frame the job does not have, or a tile the
// frame does not have, is bad input.
func jobTile(tx *coorddb.Tx, jobID string, n, index int) (frameTile, error) {
	j, f, err := jobFrame(tx, jobID, n)
	if err != nil {
		return frameTile{}, err
	}
	ft, err := f.Tiles()
	if err != nil {
		return frameTile{}, err
	}
	if index < 0 || index >= len(ft) {
		return frameTile{}, fmt.Errorf("%w: frame %d has tiles 0-%d, not %d", api.ErrBadInput, n, len(ft)-1, index)
	}
	table, err := tx.TileTable(f)
	if err != nil {
		return frameTile{}, err
	}
	s, _ := table.Get(index)
	return frameTile{job: j, frame: f, tile: ft[index], state: s}, nil
}

// TilePNG returns tile index of a job's frame, read through its manifest and encoded by the
// scene's kind exactly as the frame's 8-bit PNG holds it (scene.Kind.EncodeTilePreview), so
// tiles drawn at their rectangles reproduce the frame's PNG. A tile not completed yet is
// api.ErrTileNotReady; every tile of a kind without tile previews (a Blender scene, whose PNG
// Blender's colour management encodes from the whole frame) is api.ErrNoTilePNG.
func (c *Coordinator) TilePNG(ctx context.Context, jobID string, frame, index int) ([]byte, error) {
	var at frameTile
	err := c.db.View(ctx, func(tx *coorddb.Tx) (err error) {
		if at, err = jobTile(tx, jobID, frame, index); err != nil {
			return err
		}
		if at.state != coorddb.TileCompleted {
			return fmt.Errorf("tile %d of frame %d is %s: %w", index, frame, at.state, api.ErrTileNotReady)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	f, tile := at.frame, at.tile
	sc, err := c.scene(ctx, f.SceneVersion)
	if err != nil {
		return nil, err
	}
	if !sc.kind.TilePreviews() {
		return nil, fmt.Errorf("frame %d is of a %s: %w; fetch the finished frame (GET /v1/jobs/%s/frames/%d/png)", frame, sc.kind.Name(), api.ErrNoTilePNG, jobID, frame)
	}
	pix, err := layout.ReadTile(ctx, c.objects, f.Key, tile, f.Settings)
	if err != nil {
		return nil, fmt.Errorf("reading tile %d of frame %d: %w", index, frame, err)
	}
	data, err := sc.kind.EncodeTilePreview(tile.Rect, pix, f.Settings)
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
		// The frame's render times and failures are one read each, whatever its tiles.
		times, err := tx.TileTimes(f)
		if err != nil {
			return err
		}
		failures, err := tx.Failures(f.Key)
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
			out.Tiles[i] = api.TileInfo{Index: i, TileKey: t.Key, Rect: apiRect(t.Rect), State: apiTileState(s),
				Failures: len(failures[i])}
			if s == coorddb.TileCompleted {
				out.Tiles[i].RenderMillis = times.Get(i)
			}
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
	out.TilePNG = sc.kind.TilePreviews()
	return out, nil
}

func apiRect(r render.Rect) api.TileRect { return api.TileRect{X0: r.X0, Y0: r.Y0, X1: r.X1, Y1: r.Y1} }

// TileFailures returns the recorded failed attempts of tile index of a job's frame, with the
// log lines their workers quoted (docs/design.md, "Failures, deliveries and the failure
// budget").
func (c *Coordinator) TileFailures(ctx context.Context, jobID string, frame, index int) (api.TileFailures, error) {
	var out api.TileFailures
	err := c.db.View(ctx, func(tx *coorddb.Tx) error {
		at, err := jobTile(tx, jobID, frame, index)
		if err != nil {
			return err
		}
		list, err := tx.TileFailures(at.frame.Key, index)
		if err != nil {
			return err
		}
		out = api.TileFailures{JobID: at.job.ID, Frame: frame, Index: index, TileKey: at.tile.Key, Rect: apiRect(at.tile.Rect),
			State: apiTileState(at.state), Failures: apiFailures(list)}
		return nil
	})
	return out, err
}

// apiFailures is failures as the API shows them; never nil.
func apiFailures(list []coorddb.Failure) []api.TileFailure {
	out := make([]api.TileFailure, 0, len(list))
	for _, f := range list {
		log := f.Log
		if log == nil {
			log = []string{}
		}
		out = append(out, api.TileFailure{Attempt: f.Attempt, Worker: f.Worker, Class: f.Code, Error: f.Error, Delivery: f.Delivery,
			DeadLettered: f.DeadLettered, Time: f.Time, Log: log})
	}
	return out
}
