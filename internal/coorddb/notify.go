package coorddb

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"
)

// The notification outbox (docs/design.md, "Notifications"): an event about a job is recorded
// here in the transaction that changes the job's state, so a crash between the change and the
// event's delivery loses nothing; the notifier (internal/notify) delivers it and deletes it.

var (
	bucketNotify    = []byte("notify")    // sequence -> Notification
	bucketAnnounced = []byte("announced") // job_id -> Announcement
)

// Notification is one event to deliver: to the farm's NATS subject, the job's own receivers and
// the farm-wide ones. Its body is stored as the bytes every delivery sends, so each retry of
// it carries the same event id and the same signature.
type Notification struct {
	Seq uint64 `json:"-"`
	// ID is the event's id, unique per event: receivers deduplicate on it.
	ID string `json:"id"`
	// Subject is the NATS subject the event is published on.
	Subject string `json:"subject"`
	// Body is the event as JSON, byte for byte what is posted and published.
	Body json.RawMessage `json:"body"`
	// URLs are the job's own receivers (submit --notify), as the job had them when the event
	// happened; the farm-wide ones are added when the notifier first takes the record.
	URLs    []string  `json:"urls,omitempty"`
	Created time.Time `json:"created"`
	// Targets are the deliveries still owed, set when the notifier first takes the record
	// (Expanded); a delivery that succeeded or was given up on is removed.
	Expanded bool       `json:"expanded,omitempty"`
	Targets  []Delivery `json:"targets,omitempty"`
}

// Delivery is one destination of a notification and how its attempts went.
type Delivery struct {
	// To is a receiver's URL, or NATSTarget for the farm's NATS subject.
	To       string    `json:"to"`
	Attempts int       `json:"attempts,omitempty"`
	Next     time.Time `json:"next,omitzero"` // not before; zero: at once
	Error    string    `json:"error,omitempty"`
}

// NATSTarget is the Delivery.To of a notification's NATS publish.
const NATSTarget = "nats"

// Due is when the notification's next delivery is due: the earliest of its targets', or its
// creation while it has not been expanded.
func (n *Notification) Due() time.Time {
	if !n.Expanded {
		return n.Created
	}
	var due time.Time
	for i, d := range n.Targets {
		if i == 0 || d.Next.Before(due) {
			due = d.Next
		}
	}
	return due
}

// Announcement is what the coordinator last announced of a job: its state (empty while the
// job's state is one nothing is announced for) and how many events it recorded for it. A job
// has one from its submission on; a job submitted before notifications has none and is never
// announced.
type Announcement struct {
	State  string `json:"state,omitempty"`
	Events int    `json:"events"`
}

// AddNotification records an event for the notifier, in the caller's transaction: the one way
// an event is recorded (docs/design.md, "Notifications").
func (tx *Tx) AddNotification(n Notification) error {
	seq, err := tx.nextSeq(bucketNotify)
	if err != nil {
		return err
	}
	return put(tx, bucketNotify, seqKey(seq), n)
}

// Announcement returns what was announced of job id; ok is false for a job that has no record.
func (tx *Tx) Announcement(id string) (a Announcement, ok bool, err error) {
	raw := tx.tx.Bucket(bucketAnnounced).Get([]byte(id))
	if raw == nil {
		return a, false, nil
	}
	if err := json.Unmarshal(raw, &a); err != nil {
		return a, false, fmt.Errorf("decoding announcement of job %q: %w", id, err)
	}
	return a, true, nil
}

// PutAnnouncement stores what was announced of job id.
func (tx *Tx) PutAnnouncement(id string, a Announcement) error {
	return put(tx, bucketAnnounced, id, a)
}

// Notifications returns up to limit notifications after sequence after, in the order they were
// recorded.
func (s *DB) Notifications(ctx context.Context, after uint64, limit int) ([]Notification, error) {
	var out []Notification
	err := s.View(ctx, func(tx *Tx) error {
		c := tx.tx.Bucket(bucketNotify).Cursor()
		start := []byte(seqKey(after + 1))
		for k, v := c.Seek(start); k != nil && len(out) < limit; k, v = c.Next() {
			var n Notification
			if err := json.Unmarshal(v, &n); err != nil {
				return fmt.Errorf("decoding notification %x: %w", k, err)
			}
			n.Seq = binary.BigEndian.Uint64(k)
			out = append(out, n)
		}
		return nil
	})
	return out, err
}

// Notification returns the notification of sequence seq; ok is false once it is gone.
func (s *DB) Notification(ctx context.Context, seq uint64) (n Notification, ok bool, err error) {
	err = s.View(ctx, func(tx *Tx) error {
		n, ok, err = tx.Notification(seq)
		return err
	})
	return n, ok, err
}

// Notification returns the notification of sequence seq in the caller's transaction; ok is
// false once it is gone.
func (tx *Tx) Notification(seq uint64) (n Notification, ok bool, err error) {
	raw := tx.tx.Bucket(bucketNotify).Get([]byte(seqKey(seq)))
	if raw == nil {
		return n, false, nil
	}
	if err := json.Unmarshal(raw, &n); err != nil {
		return n, false, fmt.Errorf("decoding notification %d: %w", seq, err)
	}
	n.Seq = seq
	return n, true, nil
}

// PutNotification writes back a notification the notifier worked on, or deletes it once it has
// no target left.
func (s *DB) PutNotification(ctx context.Context, n Notification) error {
	return s.Update(ctx, func(tx *Tx) error { return tx.PutNotification(n) })
}

// PutNotification is DB.PutNotification in the caller's transaction: the notifier writes the
// outcomes of many attempts, of many notifications, in one.
func (tx *Tx) PutNotification(n Notification) error {
	if n.Expanded && len(n.Targets) == 0 {
		return tx.del(bucketNotify, []byte(seqKey(n.Seq)))
	}
	return put(tx, bucketNotify, seqKey(n.Seq), n)
}

// NotificationsLen counts the notifications not yet delivered.
func (s *DB) NotificationsLen(ctx context.Context) (int, error) {
	n := 0
	err := s.View(ctx, func(tx *Tx) error {
		n = tx.tx.Bucket(bucketNotify).Stats().KeyN
		return nil
	})
	return n, err
}
