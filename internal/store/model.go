// Package store is the coordinator's persistence: jobs, frames, tiles and the transactional
// outbox in one bbolt file. A submission and its outbox records are written in one transaction,
// so a crash can never leave a tile recorded but never dispatched, or dispatched but unrecorded.
package store

import (
	"time"

	"github.com/tilefarm/tilefarm/render"
	"github.com/tilefarm/tilefarm/tiles"
)

// Tile states.
const (
	TileQueued          = "queued"
	TileRendering       = "rendering"
	TileFailedRetryable = "failed_retryable"
	TileCompleted       = "completed"
	TileFailedTerminal  = "failed_terminal"
	TileDeadLettered    = "dead_lettered"
)

// Frame and job states.
const (
	FrameQueued     = "queued"
	FrameRendering  = "rendering"
	FrameAssembling = "assembling"
	FrameCompleted  = "completed"
	FrameFailed     = "failed"
	JobCancelled    = "cancelled"
)

// Transition records one state change, so `status` can say exactly what happened to a tile.
type Transition struct {
	State   string    `json:"state"`
	Attempt string    `json:"attempt,omitempty"`
	Worker  string    `json:"worker,omitempty"`
	Error   string    `json:"error,omitempty"`
	Code    string    `json:"code,omitempty"` // error class, see farm.ErrorCode
	Time    time.Time `json:"time"`
}

// Job is one submission. Its state is derived from its frames (see JobState).
type Job struct {
	ID             string          `json:"id"`
	IdempotencyKey string          `json:"idempotency_key"`
	PayloadHash    string          `json:"payload_hash"`
	Project        string          `json:"project,omitempty"`
	SceneVersion   string          `json:"scene_version"`
	SceneName      string          `json:"scene_name"`
	Camera         string          `json:"camera"`
	First          int             `json:"first"`
	Last           int             `json:"last"`
	Settings       render.Settings `json:"settings"`
	TileSize       int             `json:"tile_size"`
	Priority       int             `json:"priority"`
	Formats        []string        `json:"formats"`
	FrameKeys      []string        `json:"frame_keys"` // index i is frame First+i
	Cancelled      bool            `json:"cancelled,omitempty"`
	Created        time.Time       `json:"created"`
}

// Frame is one frame_key. Jobs asking for the same frame_key share it.
type Frame struct {
	Key              string          `json:"key"`
	Frame            int             `json:"frame"`
	SceneVersion     string          `json:"scene_version"`
	Settings         render.Settings `json:"settings"`
	TileSize         int             `json:"tile_size"` // tiles are derived: see Tiles
	TilesTotal       int             `json:"tiles_total"`
	TilesCompleted   int             `json:"tiles_completed"`
	TilesFailed      int             `json:"tiles_failed"`
	TileAttempts     int             `json:"tile_attempts"`
	SamplesRecovered int             `json:"samples_recovered"`
	State            string          `json:"state"`
	Error            string          `json:"error,omitempty"`
	Formats          []string        `json:"formats"`
	JobIDs           []string        `json:"job_ids"`
	History          []Transition    `json:"history"`
}

// Tile is one tile_key.
type Tile struct {
	Key              string       `json:"key"`
	FrameKey         string       `json:"frame_key"`
	Rect             render.Rect  `json:"rect"`
	State            string       `json:"state"`
	Attempts         int          `json:"attempts"`
	Worker           string       `json:"worker,omitempty"`
	Error            string       `json:"error,omitempty"`
	SamplesRecovered int          `json:"samples_recovered,omitempty"`
	History          []Transition `json:"history"`
}

// Terminal reports whether the tile will not change state by itself any more.
func (t *Tile) Terminal() bool {
	switch t.State {
	case TileCompleted, TileFailedTerminal, TileDeadLettered:
		return true
	}
	return false
}

// Move records a transition of the tile to state.
func (t *Tile) Move(state, attempt, worker, errText string, now time.Time) {
	t.State, t.Worker, t.Error = state, worker, errText
	t.History = append(t.History, Transition{State: state, Attempt: attempt, Worker: worker, Error: errText, Time: now})
}

// Fail records a failed attempt of the tile with its error class and message.
func (t *Tile) Fail(state, attempt, worker, code, errText string, now time.Time) {
	t.Move(state, attempt, worker, errText, now)
	t.History[len(t.History)-1].Code = code
}

// Move records a transition of the frame to state.
func (f *Frame) Move(state, errText string, now time.Time) {
	f.State, f.Error = state, errText
	f.History = append(f.History, Transition{State: state, Error: errText, Time: now})
}

// Tiles derives the frame's tiles from its key, size and tile size.
func (f *Frame) Tiles() ([]tiles.FrameTile, error) {
	return tiles.FrameTiles(f.Key, f.Settings.Width, f.Settings.Height, f.TileSize)
}

// Terminal reports whether the frame is finished one way or the other.
func (f *Frame) Terminal() bool { return f.State == FrameCompleted || f.State == FrameFailed }

// OutboxRecord is a message the relay must publish. MsgID is the JetStream dedup id.
type OutboxRecord struct {
	Seq     uint64 `json:"seq"`
	Subject string `json:"subject"`
	MsgID   string `json:"msg_id"`
	Data    []byte `json:"data"`
}
