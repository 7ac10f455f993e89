package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/internal/coorddb"
)

// Lost tiles (docs/design.md, "Flows": Reconcile): a tile's message can leave TILES without
// the tile being rendered. JetStream acknowledges a publish before it syncs it to disk, so an
// OS crash or power loss of its server can lose the dispatches of the last sync interval
// (queue.DefaultSync), and an operator can purge the stream. Nothing would deliver those tiles
// again. The reconciler notices: when the outbox is empty, TILES holds no message at all and
// the coordinator has applied every event, a tile not completed of a frame a live job waits
// for can no longer be delivered by anything. The reads go in that order: a record leaves the
// outbox only once its messages are in the queue, and a worker publishes a tile's completed
// event before it acks the tile's message, so once the queue is seen empty, events caught up
// after it account for every tile that left it. Work submitted meanwhile can look lost for a
// moment, so only a frame found so at two reconciliations in a row has those tiles
// dispatched again, under a new dedup id (projection.redispatch), as coorddb.TileLost: the tile
// forgets its order, since the new message's sequence may be lower than the lost one's. A
// copy of a tile that was not lost after all is harmless (whichever attempt promotes first
// wins). A tile dead-lettered by a terminal failure whose tile.failed event was lost (the
// worker publishes it after the message went to the DLQ) looks lost too, and renders again.

// lostTracker remembers the frames the last reconciliation found with lost tiles.
type lostTracker struct {
	mu   sync.Mutex
	last map[string]bool
}

// again records found as this reconciliation's and returns those the last one found too.
func (l *lostTracker) again(found map[string]*coorddb.Job) map[string]*coorddb.Job {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]*coorddb.Job{}
	for fk, j := range found {
		if l.last[fk] {
			out[fk] = j
		}
	}
	l.last = map[string]bool{}
	for fk := range found {
		l.last[fk] = true
	}
	return out
}

// lostState selects the tiles a lost message leaves undelivered: every state but completed
// and dead-lettered (whose message went to the DLQ, for an operator to requeue).
func lostState(_ int, s coorddb.TileState) bool {
	return s == coorddb.TileQueued || s == coorddb.TileRendering || s == coorddb.TileFailedRetryable
}

// lostFrames returns, by frame key, the frames with tiles nothing can deliver any more, each
// with the newest live job that waits for it; none while anything could still deliver them.
func (c *Coordinator) lostFrames(ctx context.Context) (map[string]*coorddb.Job, error) {
	// The outbox before the queue: a record leaves the outbox only once its messages are in
	// the queue, so an outbox seen empty and then a queue seen empty hold none of them.
	if n, err := c.db.OutboxLen(ctx); err != nil || n > 0 {
		return nil, err
	}
	if depth, _, err := c.queue.Depth(ctx); err != nil || depth > 0 {
		return nil, err
	}
	cons, err := c.queue.Events.Consumer(ctx, consumerEvents)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, nil // not consuming events yet: the projection may be behind
	} else if err != nil {
		return nil, fmt.Errorf("reading the events consumer: %w", err)
	}
	info, err := cons.Info(ctx)
	if err != nil || info.NumPending > 0 || info.NumAckPending > 0 {
		return nil, err
	}
	// The consumer counts a message pending a moment after the stream stored it: the stream's
	// last sequence, read after, says at once whether an event is still to be delivered.
	events, err := c.queue.Events.Info(ctx)
	if err != nil || events.State.LastSeq > info.Delivered.Stream {
		return nil, err
	}
	found := map[string]*coorddb.Job{}
	err = c.db.View(ctx, func(tx *coorddb.Tx) error {
		var err error
		tx.OpenFrames(func(fk string) bool {
			var j *coorddb.Job
			if j, err = lostFrame(tx, fk); err != nil {
				return false
			}
			if j != nil {
				found[fk] = j
			}
			return true
		})
		return err
	})
	return found, err
}

// lostFrame returns the newest live job waiting for frame fk if the frame has tiles in a
// lostState, else nil.
func lostFrame(tx *coorddb.Tx, fk string) (*coorddb.Job, error) {
	f, err := tx.Frame(fk)
	if err != nil {
		return nil, ignoreUnknown(err)
	}
	if f.Dropped || f.Held || f.TilesCompleted >= f.TilesTotal {
		return nil, nil // a held frame was never dispatched: nothing of it can be lost
	}
	table, err := tx.TileTable(f)
	if err != nil {
		return nil, err
	}
	undelivered := false
	for i := 0; i < table.Len() && !undelivered; i++ {
		s, _ := table.Get(i)
		undelivered = lostState(i, s)
	}
	if !undelivered {
		return nil, nil
	}
	return liveJob(tx, f, "")
}

// redispatchLost dispatches again the lost tiles of the frames found lost at this
// reconciliation and the one before, and returns how many.
func (c *Coordinator) redispatchLost(ctx context.Context) (int, error) {
	found, err := c.lostFrames(ctx)
	again := c.lost.again(found) // an error forgets the last sighting: two in a row means two looks
	if err != nil || len(again) == 0 {
		return 0, err
	}
	// The frames are live in the store; a drop mark left in the KV (a cancel racing a revive)
	// would have workers ack the new messages unrendered, so it goes first, as in revive.
	for fk := range again {
		if err := c.queue.Dropped.Remove(ctx, fk); err != nil {
			return 0, err
		}
	}
	n := 0
	err = c.update(ctx, func(p *projection) error {
		n = 0
		for fk, j := range again {
			k, err := p.redispatch(fk, j, lostState, coorddb.TileLost, coorddb.Order{})
			if err != nil {
				return err
			}
			n += k
		}
		return nil
	})
	if err == nil && n > 0 {
		c.log.Warn("tiles lost from the queue (nothing holds their messages); dispatching them again",
			"frames", len(again), "tiles", n)
	}
	return n, err
}
