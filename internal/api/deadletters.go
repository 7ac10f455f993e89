package api

import (
	"time"
)

// DeadLetter is a message removed from TILES after it could not be processed, with its error context.
type DeadLetter struct {
	// DLQSeq is the dead letter's own sequence in the DLQ stream, the handle for RequeueDeadLetter; it is
	// 0 in a DeadLetter that has not been stored yet.
	DLQSeq uint64 `json:"dlq_seq"`
	// StreamSeq is the original sequence in TILES.
	StreamSeq uint64 `json:"stream_seq"`
	// Subject is the original subject (a band's tiles.render subject, or tiles.assemble).
	Subject string `json:"subject"`
	// MsgID is the original Nats-Msg-Id.
	MsgID string `json:"msg_id"`
	Data  []byte `json:"data"`
	// Header holds the original application headers (Nats-* and DLQ bookkeeping headers removed).
	Header     map[string][]string `json:"header,omitempty"`
	Deliveries uint64              `json:"deliveries"`
	Reason     string              `json:"reason"`
	// Time is when the dead letter was stored.
	Time time.Time `json:"time"`
}

// DeadLetterDetail is the body of GET /v1/dlq/{seq}: a dead letter with what the farm knows
// of the work it held, and, for a tile, the tile's recorded failed attempts with their logs.
type DeadLetterDetail struct {
	DeadLetter
	// Kind is "tile" or "assembly", by the dead letter's subject; "" for a payload the farm
	// cannot read.
	Kind     string `json:"kind"`
	JobID    string `json:"job_id,omitempty"` // the job that first asked for the work
	FrameKey string `json:"frame_key,omitempty"`
	Frame    int    `json:"frame,omitempty"`
	// TileIndex and TileKey name a tile's dead letter's tile.
	TileIndex *int   `json:"tile_index,omitempty"`
	TileKey   string `json:"tile_key,omitempty"`
	// Failures are the tile's recorded failed attempts, oldest first (none for an assembly).
	Failures []TileFailure `json:"failures"`
}
