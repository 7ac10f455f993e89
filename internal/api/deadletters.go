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
