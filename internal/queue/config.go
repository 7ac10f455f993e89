package queue

import (
	"errors"
	"fmt"
	"time"
)

// ErrInvalidConfig is wrapped by Config.Validate so callers can tell a bad setting from a broken server.
var ErrInvalidConfig = errors.New("invalid queue config")

// Config holds the queue settings the farm exposes. Zero values are not defaults: start from DefaultConfig.
type Config struct {
	// AckWait is the visibility timeout of a delivered tile; workers extend it with InProgress.
	AckWait time.Duration
	// MaxDeliver is the safety net: deliveries of a message lost without a word (its worker
	// killed, its connection lost) after which a worker dead-letters it. Failures and hand-backs
	// are not lost deliveries (Failures), so the server itself delivers without limit and the
	// limit travels in the consumers' metadata.
	MaxDeliver int
	// MaxFailures is how many classified failures of a tile (a render error, a panic) dead-letter
	// it. Infrastructure outages, handbacks and waits for a live lease are not failures.
	MaxFailures int
	// Backoff replaces AckWait for ack timeouts only (not for Nak); at most MaxDeliver steps.
	// When set, the server uses Backoff[0] as the consumer's AckWait.
	Backoff []time.Duration
	// DedupWindow is how long a Nats-Msg-Id is remembered by TILES, EVENTS and DLQ.
	DedupWindow time.Duration
	// LeaseTTL is the bucket TTL of "leases": a lease not renewed for this long disappears.
	LeaseTTL time.Duration
	// Replicas is the stream and bucket replication factor (1 embedded, 3 on a cluster).
	Replicas int
}

// EventsRetention is how long EVENTS keeps history for a coordinator catching up after downtime.
const EventsRetention = 7 * 24 * time.Hour

// DefaultConfig returns the defaults (ack-wait 3 s, 5 failures, MaxDeliver 20, dedup 10 min,
// lease TTL 3 s). A worker heartbeats every fifth of the shorter of ack-wait and lease TTL, so
// a live tile is kept through four lost beats, while a killed worker's tile is delivered again
// and its lease free within about 3 s: recovery takes seconds, not a quarter of a minute.
func DefaultConfig() Config {
	return Config{
		AckWait:     3 * time.Second,
		MaxDeliver:  20,
		MaxFailures: 5,
		DedupWindow: 10 * time.Minute,
		LeaseTTL:    3 * time.Second,
		Replicas:    1,
	}
}

// Validate reports the first setting JetStream would reject or that would make the farm unsafe.
func (c Config) Validate() error {
	switch {
	case c.AckWait <= 0:
		return fmt.Errorf("%w: ack wait must be positive, got %v", ErrInvalidConfig, c.AckWait)
	case c.MaxDeliver < 1:
		return fmt.Errorf("%w: max deliver must be at least 1, got %d", ErrInvalidConfig, c.MaxDeliver)
	case c.MaxFailures < 1 || c.MaxFailures > 1000:
		return fmt.Errorf("%w: max failures must be 1..1000, got %d", ErrInvalidConfig, c.MaxFailures)
	case len(c.Backoff) > c.MaxDeliver:
		return fmt.Errorf("%w: %d backoff steps exceed max deliver %d", ErrInvalidConfig, len(c.Backoff), c.MaxDeliver)
	case c.DedupWindow <= 0:
		return fmt.Errorf("%w: dedup window must be positive, got %v", ErrInvalidConfig, c.DedupWindow)
	case c.DedupWindow > EventsRetention:
		return fmt.Errorf("%w: dedup window %v exceeds the events retention %v", ErrInvalidConfig, c.DedupWindow, EventsRetention)
	case c.LeaseTTL < 100*time.Millisecond:
		return fmt.Errorf("%w: lease ttl must be at least 100ms, got %v", ErrInvalidConfig, c.LeaseTTL)
	case c.Replicas < 1 || c.Replicas > 5:
		return fmt.Errorf("%w: replicas must be 1..5, got %d", ErrInvalidConfig, c.Replicas)
	}
	for i, d := range c.Backoff {
		if d <= 0 {
			return fmt.Errorf("%w: backoff step %d must be positive, got %v", ErrInvalidConfig, i, d)
		}
	}
	return nil
}
