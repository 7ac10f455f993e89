// Package wire holds the messages the coordinator and the tile workers exchange over NATS:
// tile and assembly jobs on TILES, the events workers publish to EVENTS, and progress reports
// on core NATS. It has no behaviour of its own, so both sides depend on it and never on each
// other.
package wire

import (
	"encoding/json"
	"time"

	"github.com/tilefarm/tilefarm/render"
)

// TileJob asks a worker to render one tile. Everything a worker needs to reproduce the tile's
// pixels is in it, so any worker can take it and any retry renders the same bits.
type TileJob struct {
	JobID        string          `json:"job_id"` // the submission that first asked; for logs only
	TileKey      string          `json:"tile_key"`
	FrameKey     string          `json:"frame_key"`
	Index        int             `json:"index"` // position in tiles.FrameTiles of the frame
	SceneVersion string          `json:"scene_version"`
	Settings     render.Settings `json:"settings"`
	Frame        int             `json:"frame"`
	Rect         render.Rect     `json:"rect"`
	InputHash    string          `json:"input_hash"`
	// First marks the tile's first dispatch: its frame was new when submitted, so no attempt,
	// checkpoint or manifest of the tile can exist yet. A first delivery of it skips the store
	// reads that would find them (docs/design.md, "Store requests of a tile"): promotion is
	// create-if-absent, so the skip can cost a wasted render, never a second publication.
	First bool `json:"first,omitempty"`
}

// AssembleJob asks a worker to assemble a frame from its promoted tiles.
type AssembleJob struct {
	JobID        string          `json:"job_id"`
	FrameKey     string          `json:"frame_key"`
	SceneVersion string          `json:"scene_version"`
	Settings     render.Settings `json:"settings"`
	Frame        int             `json:"frame"`
	TileSize     int             `json:"tile_size"` // the tiles are derived with tiles.FrameTiles
	Formats      []string        `json:"formats"`   // sorted; always has "png"; "png16", "exr" on request
	// TileBuild and TileObjects, when set, name each tile's promoted object as the worker that
	// promoted it reported it (Event.Object), indexed like the frame's tiles: "attempt:sha256",
	// or "" where not known. The assembler reads such a tile's object alone, one request, and
	// reads it through its manifest where the entry is empty or the object does not match.
	TileBuild   string   `json:"tile_build,omitempty"`
	TileObjects []string `json:"tile_objects,omitempty"`
}

// KindMovie is the Kind of a MovieJob.
const KindMovie = "movie"

// MovieJob asks a worker to encode the preview movie of a completed job from its frames' PNG
// outputs (docs/design.md, "Preview movie"). It travels on the assembly subjects of the job's
// pool, so the assembly loop of any worker that assembles the job's frames takes it; Kind tells
// it from an AssembleJob there. The frames are named by what derives their keys
// (identity.FrameKey), not listed: a job of 100,000 frames still fits a message.
type MovieJob struct {
	Kind         string `json:"kind"` // KindMovie
	JobID        string `json:"job_id"`
	SceneVersion string `json:"scene_version"`
	Camera       string `json:"camera"`
	SettingsHash string `json:"settings_hash"`
	Build        string `json:"build,omitempty"` // the frames' build, for the movie's manifest
	First        int    `json:"first"`
	Last         int    `json:"last"`
	Step         int    `json:"step,omitempty"` // 0 or 1: every frame
	Width        int    `json:"width"`
	Height       int    `json:"height"`
	FPS          int    `json:"fps"`
}

// IsMovieJob reports whether data, a message on an assembly subject, is a MovieJob.
func IsMovieJob(data []byte) bool {
	var k struct {
		Kind string `json:"kind"`
	}
	return json.Unmarshal(data, &k) == nil && k.Kind == KindMovie
}

// TileObject is the object a tile was promoted as (its manifest's), reported with
// tile.completed so its frame's assembly can read it without reading the manifest first.
type TileObject struct {
	Attempt string `json:"attempt"` // the attempt whose object the manifest names
	SHA256  string `json:"sha256"`
	Build   string `json:"build"`
}

// Event types published by workers to the EVENTS stream.
const (
	EventTileStarted   = "tile.started"
	EventTileCompleted = "tile.completed"
	EventTileFailed    = "tile.failed"
	// EventFrameAssembled claims formats of a frame promoted; the coordinator believes it
	// only once it finds their manifests (a worker cannot complete a frame by saying so).
	EventFrameAssembled = "frame.assembled"
	EventFrameFailed    = "frame.failed"
	// EventMovieReady claims a job's preview movie promoted (JobID, no frame); like
	// frame.assembled it is believed only once the movie's manifest is found. EventMovieFailed
	// is its failure, terminal once dead-lettered.
	EventMovieReady  = "movie.ready"
	EventMovieFailed = "movie.failed"
)

// EventTypes are every event type a worker publishes, in the order above.
var EventTypes = []string{EventTileStarted, EventTileCompleted, EventTileFailed, EventFrameAssembled, EventFrameFailed,
	EventMovieReady, EventMovieFailed}

// Event reports progress from a worker. ID is unique per logical event so a republished event is
// deduplicated by JetStream. Seq and Delivery name the TILES message (stream sequence) and the
// delivery of it the event is about: the coordinator orders a tile's events by them, so an event
// applied late can never overwrite a newer state (docs/design.md, "States").
type Event struct {
	ID               string      `json:"id"`
	Type             string      `json:"type"`
	JobID            string      `json:"job_id,omitempty"`
	TileKey          string      `json:"tile_key,omitempty"`
	TileIndex        int         `json:"tile_index,omitempty"`
	FrameKey         string      `json:"frame_key"` // empty for a movie event, which names its job
	Seq              uint64      `json:"seq,omitempty"`
	Delivery         uint64      `json:"delivery,omitempty"`
	Attempt          string      `json:"attempt"`
	Worker           string      `json:"worker"`
	SamplesRendered  int         `json:"samples_rendered,omitempty"`
	SamplesRecovered int         `json:"samples_recovered,omitempty"`
	Duplicate        bool        `json:"duplicate,omitempty"` // the tile was already promoted by someone else
	Terminal         bool        `json:"terminal,omitempty"`
	Code             string      `json:"code,omitempty"`    // tile.failed, frame.failed: see ErrorCode
	Formats          []string    `json:"formats,omitempty"` // frame.completed: the formats now promoted
	Object           *TileObject `json:"object,omitempty"`  // tile.completed: the object promoted, when the worker read its manifest
	Error            string      `json:"error,omitempty"`
	Time             time.Time   `json:"time"`
	// RenderMillis is, on tile.completed, how long the attempt rendered the tile (its passes,
	// not its lease or finalize); 0 when it rendered nothing (a duplicate). Display data, never
	// state (docs/design.md, "Render times").
	RenderMillis int64 `json:"render_ms,omitempty"`
	// Log is, on tile.failed and frame.failed, the last lines the worker logged about the
	// attempt, its renderer's last output among them (at most 20 lines, 4 KiB).
	Log []string `json:"log,omitempty"`
}

// Progress reports the samples a tile has rendered so far, after each pass of a tile that has
// more to go, so a long tile (a Blender tile can take minutes) shows progress. It travels on
// core NATS, not a stream: it is advisory, and a lost report loses nothing.
type Progress struct {
	JobID    string    `json:"job_id"`
	FrameKey string    `json:"frame_key"`
	TileKey  string    `json:"tile_key"`
	Samples  int       `json:"samples"` // rendered so far, those recovered from a checkpoint included
	SPP      int       `json:"spp"`
	Worker   string    `json:"worker"`
	Time     time.Time `json:"time"`
}

// Subject returns the EVENTS subject for an event type.
func (e Event) Subject() string { return "events." + e.Type }
