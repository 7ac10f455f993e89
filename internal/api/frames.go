package api

import "time"

// TileRect is a tile's half-open rectangle [x0,x1) x [y0,y1) in frame pixels, y=0 at the top.
type TileRect struct {
	X0 int `json:"x0"`
	Y0 int `json:"y0"`
	X1 int `json:"x1"`
	Y1 int `json:"y1"`
}

// TileInfo is one tile of a frame as the coordinator's tile table has it.
type TileInfo struct {
	Index   int       `json:"index"`
	TileKey string    `json:"tile_key"`
	Rect    TileRect  `json:"rect"`
	State   TileState `json:"state"`
	// RenderMillis is how long the attempt that completed the tile rendered it, as its worker
	// reported it; absent while unknown (not completed, or completed without a report).
	RenderMillis uint32 `json:"render_ms,omitempty"`
	// Failures is how many failed attempts of the tile are recorded (the newest few); GET
	// .../tiles/{index}/failures has them.
	Failures int `json:"failures,omitempty"`
}

// TileFailure is one failed attempt of a tile, as its worker reported it.
type TileFailure struct {
	Attempt      string    `json:"attempt,omitempty"`
	Worker       string    `json:"worker,omitempty"`
	Class        string    `json:"class"` // the error class: retryable, storage, panic, terminal, max_deliveries
	Error        string    `json:"error"`
	Delivery     uint64    `json:"delivery,omitempty"`
	DeadLettered bool      `json:"dead_lettered"`
	Time         time.Time `json:"time"`
	// Log is the last lines the worker logged about the attempt, its renderer's last output
	// among them ("renderer: ..."), oldest first.
	Log []string `json:"log"`
}

// TileFailures is the body of GET /v1/jobs/{id}/frames/{frame}/tiles/{index}/failures: a
// tile's recorded failed attempts, oldest first (the newest few are kept).
type TileFailures struct {
	JobID    string        `json:"job_id"`
	Frame    int           `json:"frame"`
	Index    int           `json:"index"`
	TileKey  string        `json:"tile_key"`
	Rect     TileRect      `json:"rect"`
	State    TileState     `json:"state"`
	Failures []TileFailure `json:"failures"`
}

// FrameTiles is the body of GET /v1/jobs/{id}/frames/{frame}/tiles: where each tile of a
// frame lies and where it stands, so a viewer knows where to draw each promoted tile.
type FrameTiles struct {
	JobID  string     `json:"job_id"`
	Frame  int        `json:"frame"`
	Width  int        `json:"width"`
	Height int        `json:"height"`
	State  FrameState `json:"state"` // the frame's state as the job sees it
	// TilePNG says whether GET .../tiles/{index}/png serves the tiles: true for JSON scenes,
	// false for Blender scenes, whose PNGs Blender's colour management encodes.
	TilePNG bool       `json:"tile_png"`
	Tiles   []TileInfo `json:"tiles"`
}

// FrameIndex is the body of GET /v1/jobs/{id}/frames/{frame}/{format}/index: the files of one
// output of a frame as its renderer named them. Name is the main file's (GET
// .../{format}): a Blender scene's own output is named as Blender names it, relative to the
// .blend's directory ("//render/plate_0001.exr") or absolute. Files are the other files (a
// Blender compositor's File Output nodes'), by their path relative to the .blend's
// directory; file i is GET .../{format}?file=i.
type FrameIndex struct {
	Name  string   `json:"name"`
	Files []string `json:"files"`
}

// FrameEvent is one frame whose tiles changed, in an `event: frame` message of GET /v1/events.
type FrameEvent struct {
	JobID          string     `json:"job_id"`
	Frame          int        `json:"frame"`
	State          FrameState `json:"state"`
	TilesCompleted int        `json:"tiles_completed"`
	TilesFailed    int        `json:"tiles_failed"`
}
