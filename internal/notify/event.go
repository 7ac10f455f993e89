// Package notify tells the world outside the farm what happened to its jobs: each event the
// coordinator records (a job completed, failed, cancelled or blocked; a frame completed or
// failed, when the job asked) is posted as signed JSON to webhook receivers and published on a
// NATS subject for consumers inside the farm (docs/design.md, "Notifications";
// docs/operations.md, "Notifications").
//
// An event is recorded in the coordinator's database, in the transaction of the change it
// tells of (Record), and the Notifier delivers it from there: after a crash, whatever was not
// delivered yet still is. Delivery is at least once; the event id lets a receiver drop a
// repeat.
package notify

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/queue"
)

// Event types. A job event tells of a job's state; a frame event, sent only for a job
// submitted with --notify-frames, of one of its frames as the job sees it (with its formats).
const (
	JobCompleted   = "job.completed"
	JobFailed      = "job.failed"
	JobCancelled   = "job.cancelled"
	JobBlocked     = "job.blocked" // a job waiting on a dependency that cannot complete
	FrameCompleted = "frame.completed"
	FrameFailed    = "frame.failed"
)

// Event is the body of a notification, as posted and published. Fields are only ever added.
type Event struct {
	// ID is unique per event: a receiver that sees an id again has seen the event.
	ID   string    `json:"id"`
	Type string    `json:"type"`
	Time time.Time `json:"time"` // when the coordinator recorded the change
	// JobID, Project and Scene name the job.
	JobID   string `json:"job_id"`
	Project string `json:"project,omitempty"`
	Scene   string `json:"scene,omitempty"`
	// State is the job's state (a job event) or the frame's as the job sees it (a frame event),
	// as `status` names it.
	State string `json:"state"`
	// Frame is the frame's number; frame events only.
	Frame *int `json:"frame,omitempty"`
	// Frames counts the job's frames; job events only.
	Frames *Frames `json:"frames,omitempty"`
	// Reason says why a job or frame failed, or when a job was cancelled.
	Reason string `json:"reason,omitempty"`
}

// Frames counts a job's frames by state.
type Frames struct {
	Total     int `json:"total"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
}

// Subject is the NATS subject an event is published on: notify.<type>.<job_id>, so a consumer
// takes every event with notify.>, a job's with notify.*.*.<job_id>, completions with
// notify.job.completed.*.
func Subject(ev Event) string { return queue.NotifyPrefix + ev.Type + "." + ev.JobID }

// maxReason bounds an event's reason.
const maxReason = 1024

// Record records ev for delivery to the NATS subject, the job's own receivers urls and the
// farm-wide ones, inside the caller's transaction: the one way an event is recorded, and the
// hook for whatever makes one (docs/design.md, "Notifications"). An empty ID gets a random one,
// a zero Time the present.
func Record(tx *coorddb.Tx, ev Event, urls []string) error {
	if ev.ID == "" {
		ev.ID = newID()
	}
	if ev.Time.IsZero() {
		ev.Time = time.Now().UTC() // its deliveries' deadline counts from it
	}
	if len(ev.Reason) > maxReason {
		ev.Reason = ev.Reason[:maxReason] + "..."
	}
	body, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("encoding %s event of job %s: %w", ev.Type, ev.JobID, err)
	}
	return tx.AddNotification(coorddb.Notification{ID: ev.ID, Subject: Subject(ev), Body: body, URLs: urls, Created: ev.Time})
}

// newID is a random event id: unique across coordinators and databases, so a job submitted
// again to a farm that lost its database cannot repeat an id a receiver has seen.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails since Go 1.24
	return "ev_" + hex.EncodeToString(b[:])
}
