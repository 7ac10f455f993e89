package queue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// Failures counts the classified failures of each message in the "failures" bucket, so the
// failure budget of a tile survives the worker that failed it and is shared by every worker:
// a tile is dead-lettered after Config.MaxFailures failures, while deliveries spent on kills,
// handbacks and outages cost it nothing. The count is kept per message id, so a retried or
// requeued tile (a new id) starts with a fresh budget.
type Failures struct {
	kv jetstream.KeyValue
}

// failureKey turns a message id into a KV key: ids are hex, "job-" names, digits and ':'
// separators, and KV keys take '.' where ids have ':'.
func failureKey(msgID string) string { return strings.ReplaceAll(msgID, ":", ".") }

// Add records one more failure of msgID and returns the count so far.
func (b *Failures) Add(ctx context.Context, msgID string) (int, error) {
	key := failureKey(msgID)
	for try := 0; try < 16; try++ {
		e, err := b.kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			if _, err := b.kv.Create(ctx, key, []byte("1")); err == nil {
				return 1, nil
			} else if !errors.Is(err, jetstream.ErrKeyExists) {
				return 0, fmt.Errorf("counting failures of %q: %w", msgID, err)
			}
			continue // another worker counted first
		}
		if err != nil {
			return 0, fmt.Errorf("counting failures of %q: %w", msgID, err)
		}
		n, _ := strconv.Atoi(string(e.Value()))
		n++
		if _, err := b.kv.Update(ctx, key, []byte(strconv.Itoa(n)), e.Revision()); err == nil {
			return n, nil
		} else if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return 0, fmt.Errorf("counting failures of %q: %w", msgID, err)
		}
	}
	return 0, fmt.Errorf("counting failures of %q: too much contention", msgID)
}

// Count returns the failures recorded for msgID.
func (b *Failures) Count(ctx context.Context, msgID string) (int, error) {
	e, err := b.kv.Get(ctx, failureKey(msgID))
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading failures of %q: %w", msgID, err)
	}
	n, _ := strconv.Atoi(string(e.Value()))
	return n, nil
}
