package queue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Failures keeps, per message, the two kinds of deliveries that are not lost ones in the
// "failures" bucket: classified failures of the tile, and hand-backs (a blocklist, a
// shutdown, an outage). It survives the worker that counted and is shared by every worker, so
// a tile is dead-lettered after Config.MaxFailures failures, and only deliveries neither
// failed nor handed back (a kill, a lost connection) count toward the Config.MaxDeliver safety
// net (docs/design.md, "Failures, deliveries and the failure budget"). The record is kept per
// message id, so a retried or requeued tile (a new id) starts with a fresh budget.
type Failures struct {
	kv jetstream.KeyValue
}

// Tally is what Failures recorded of one message.
type Tally struct {
	Failures  int // classified failures of the work itself
	HandBacks int // deliveries handed back unrendered: no failure of the work
}

// Explained is how many of a message's deliveries the tally accounts for.
func (t Tally) Explained() int { return t.Failures + t.HandBacks }

// failureKey turns a message id into a KV key: ids are hex, "job-" names, digits and ':'
// separators, and KV keys take '.' where ids have ':'.
func failureKey(msgID string) string { return strings.ReplaceAll(msgID, ":", ".") }

// encode writes a tally as "<failures> <hand-backs>"; decodeTally reads it, and a bare
// "<failures>" as a farm before hand-backs were counted wrote it.
func (t Tally) encode() []byte { return fmt.Appendf(nil, "%d %d", t.Failures, t.HandBacks) }

func decodeTally(b []byte) Tally {
	f, h, _ := strings.Cut(string(b), " ")
	var t Tally
	t.Failures, _ = strconv.Atoi(f)
	t.HandBacks, _ = strconv.Atoi(h)
	return t
}

// Add records one more failure of msgID and returns the failures so far.
func (b *Failures) Add(ctx context.Context, msgID string) (int, error) {
	t, err := b.bump(ctx, msgID, func(t *Tally) { t.Failures++ })
	return t.Failures, err
}

// HandBack records that a delivery of msgID was handed back unrendered.
func (b *Failures) HandBack(ctx context.Context, msgID string) error {
	_, err := b.bump(ctx, msgID, func(t *Tally) { t.HandBacks++ })
	return err
}

// bump changes msgID's tally by change, by compare-and-set against every other worker.
func (b *Failures) bump(ctx context.Context, msgID string, change func(*Tally)) (Tally, error) {
	key := failureKey(msgID)
	for try := 0; try < 16; try++ {
		e, err := b.kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			var t Tally
			change(&t)
			if _, err := b.kv.Create(ctx, key, t.encode()); err == nil {
				return t, nil
			} else if !errors.Is(err, jetstream.ErrKeyExists) {
				return Tally{}, fmt.Errorf("counting deliveries of %q: %w", msgID, err)
			}
			continue // another worker counted first
		}
		if err != nil {
			return Tally{}, fmt.Errorf("counting deliveries of %q: %w", msgID, err)
		}
		t := decodeTally(e.Value())
		change(&t)
		if _, err := b.kv.Update(ctx, key, t.encode(), e.Revision()); err == nil {
			return t, nil
		} else if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return Tally{}, fmt.Errorf("counting deliveries of %q: %w", msgID, err)
		}
	}
	return Tally{}, fmt.Errorf("counting deliveries of %q: too much contention", msgID)
}

// Count returns what was recorded of msgID.
func (b *Failures) Count(ctx context.Context, msgID string) (Tally, error) {
	e, err := b.kv.Get(ctx, failureKey(msgID))
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return Tally{}, nil
	}
	if err != nil {
		return Tally{}, fmt.Errorf("reading deliveries of %q: %w", msgID, err)
	}
	return decodeTally(e.Value()), nil
}

// HandBack gives msg back to the queue unrendered, after delay (0: at once), and records that
// it was no failure and no lost delivery: a hand-back spends neither the failure budget nor
// the MaxDeliver safety net. Counting is best effort within a few seconds, whatever ctx: an
// uncounted hand-back only counts as one lost delivery.
func (f *Queue) HandBack(ctx context.Context, msg jetstream.Msg, delay time.Duration) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Second)
	defer cancel()
	if err := f.Failures.HandBack(cctx, MsgID(msg.Headers())); err != nil {
		f.logger().Warn("counting a hand-back", "subject", msg.Subject(), "err", err)
	}
	if delay > 0 {
		_ = msg.NakWithDelay(delay)
		return
	}
	_ = msg.Nak()
}
