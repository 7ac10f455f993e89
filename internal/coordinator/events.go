package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/farm"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/store"
)

// consumerEvents is the coordinator's durable consumer on EVENTS: after a crash it resumes where
// it stopped, and re-applying an event it had already applied changes nothing.
const consumerEvents = "coordinator"

func (c *Coordinator) consumeEvents(ctx context.Context) error {
	cons, err := c.farm.Events.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       consumerEvents,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		MaxAckPending: 1024,
	})
	if err != nil {
		return fmt.Errorf("creating events consumer: %w", err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(256))
	if err != nil {
		return fmt.Errorf("consuming events: %w", err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()
	for {
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return fmt.Errorf("consuming events: %w", err)
		}
		var ev farm.Event
		if err := json.Unmarshal(msg.Data(), &ev); err != nil {
			c.log.Error("dropping undecodable event", "subject", msg.Subject(), "err", err)
			_ = msg.Term()
			continue
		}
		if err := c.applyEvent(ctx, ev); err != nil {
			c.log.Error("applying event", "event", ev.ID, "err", err)
			_ = msg.NakWithDelay(time.Second)
			continue
		}
		_ = msg.Ack()
	}
}

// applyEvent folds one event into the projection, once.
func (c *Coordinator) applyEvent(ctx context.Context, ev farm.Event) error {
	now := c.now()
	err := c.store.Update(ctx, func(tx *store.Tx) error {
		if seen, err := tx.SeenEvent(ev.ID, now); err != nil || seen {
			return err
		}
		switch ev.Type {
		case farm.EventTileStarted, farm.EventTileCompleted, farm.EventTileFailed:
			return c.applyTileEvent(tx, ev, now)
		case farm.EventFrameCompleted:
			return c.frameCompleted(tx, ev, now)
		case farm.EventFrameFailed:
			if !ev.Terminal {
				return nil
			}
			return c.settleFrame(tx, ev.FrameKey, store.FrameFailed, "assembly: "+ev.Error, now)
		}
		return nil
	})
	if err == nil {
		c.notify()
		c.kickRelay() // an event may have queued an assemble job
	}
	return err
}

func (c *Coordinator) applyTileEvent(tx *store.Tx, ev farm.Event, now time.Time) error {
	t, err := tx.Tile(ev.TileKey)
	if errors.Is(err, store.ErrNotFound) {
		c.log.Warn("event for unknown tile", "tile_key", ev.TileKey, "event", ev.ID)
		return nil
	}
	if err != nil {
		return err
	}
	if t.State == store.TileCompleted {
		return nil // late events about a finished tile change nothing
	}
	f, err := tx.Frame(t.FrameKey)
	if err != nil {
		return err
	}
	wasFailed := t.State == store.TileDeadLettered
	switch ev.Type {
	case farm.EventTileStarted:
		t.Attempts++
		t.SamplesRecovered += ev.SamplesRecovered
		f.TileAttempts++
		f.SamplesRecovered += ev.SamplesRecovered
		t.Move(store.TileRendering, ev.Attempt, ev.Worker, "", now)
		if f.State == store.FrameQueued {
			f.Move(store.FrameRendering, "", now)
		}
	case farm.EventTileFailed:
		if ev.Terminal {
			t.Fail(store.TileDeadLettered, ev.Attempt, ev.Worker, ev.Code, ev.Error, now)
			if !f.Terminal() {
				f.Move(store.FrameFailed, fmt.Sprintf("tile %s (%d,%d)-(%d,%d) dead-lettered [%s]: %s",
					t.Key[:12], t.Rect.X0, t.Rect.Y0, t.Rect.X1, t.Rect.Y1, ev.Code, ev.Error), now)
			}
		} else {
			t.Fail(store.TileFailedRetryable, ev.Attempt, ev.Worker, ev.Code, ev.Error, now)
			// Should the queue give up on it later, its dead letter carries this error.
			c.farm.NoteError(t.Key, ev.Error)
		}
	case farm.EventTileCompleted:
		t.Move(store.TileCompleted, ev.Attempt, ev.Worker, "", now)
		f.TilesCompleted++
		if f.TilesCompleted == f.TilesTotal {
			// A frame that failed on a dead-lettered tile recovers when an operator requeues it.
			suffix := ""
			if f.State == store.FrameFailed {
				suffix = "retry"
			}
			f.Move(store.FrameAssembling, "", now)
			if err := c.enqueueAssemble(tx, f, suffix); err != nil {
				return err
			}
		}
	}
	// Keep the frame's failed-tile count in step with its tiles (a requeued tile leaves the state).
	switch isFailed := t.State == store.TileDeadLettered; {
	case isFailed && !wasFailed:
		f.TilesFailed++
	case !isFailed && wasFailed:
		f.TilesFailed--
	}
	if err := tx.PutTile(t); err != nil {
		return err
	}
	return tx.PutFrame(f)
}

// enqueueAssemble queues the frame's assembly through the outbox. The first assembly's dedup id
// is "assemble:<frame_key>"; a later one (a retry after a failure, more formats) names why and
// when, since the first id may still sit in the dedup window.
func (c *Coordinator) enqueueAssemble(tx *store.Tx, f *store.Frame, suffix string) error {
	job := farm.AssembleJob{FrameKey: f.Key, SceneVersion: f.SceneVersion, Settings: f.Settings, Frame: f.Frame,
		Formats: f.Formats, TileSize: f.TileSize}
	if len(f.JobIDs) > 0 {
		job.JobID = f.JobIDs[0]
	}
	data, err := json.Marshal(job)
	if err != nil {
		return err
	}
	msgID := "assemble:" + f.Key
	if suffix != "" {
		msgID += fmt.Sprintf(":%s:%d", suffix, len(f.History))
	}
	return tx.AddOutbox(queue.SubjectAssemble, msgID, data)
}

// frameCompleted completes a frame once every format it owes has been promoted; a frame asked
// for more formats while it was being assembled is assembled again for those.
func (c *Coordinator) frameCompleted(tx *store.Tx, ev farm.Event, now time.Time) error {
	f, err := tx.Frame(ev.FrameKey)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	// A failed frame may complete: its assembly was requeued from the DLQ and succeeded.
	if err != nil || f.State == store.FrameCompleted {
		return err
	}
	for _, format := range f.Formats {
		if !slices.Contains(ev.Formats, format) {
			if err := c.enqueueAssemble(tx, f, "formats"); err != nil {
				return err
			}
			f.Move(store.FrameAssembling, "", now)
			return tx.PutFrame(f)
		}
	}
	f.Move(store.FrameCompleted, "", now)
	return tx.PutFrame(f)
}

func (c *Coordinator) settleFrame(tx *store.Tx, frameKey, state, errText string, now time.Time) error {
	f, err := tx.Frame(frameKey)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil || f.Terminal() {
		return err
	}
	f.Move(state, errText, now)
	return tx.PutFrame(f)
}

// watchDeadLetters records tiles the queue gave up on (MaxDeliver reached without the worker
// dead-lettering it itself, e.g. because every attempt was killed).
func (c *Coordinator) watchDeadLetters(ctx context.Context) error {
	return c.farm.WatchDeadLetters(ctx, c.nc, func(dl queue.DeadLetter) error {
		c.m.DeadLetters.Inc()
		ev := farm.Event{ID: fmt.Sprintf("dead-letter:%d", dl.StreamSeq), Terminal: true, Time: c.now(), Code: farm.CodeMaxDeliveries,
			Error: fmt.Sprintf("dead-lettered after %d deliveries: %s", dl.Deliveries, dl.Reason)}
		switch dl.Subject {
		case queue.SubjectRender:
			var job farm.TileJob
			if json.Unmarshal(dl.Data, &job) != nil {
				return nil // nothing to record for an undecodable message
			}
			// A tile promoted after all (its last ack was lost) is not a failure.
			if done, err := finalize.ManifestExists(ctx, c.objects, farm.TileManifestKey(job.TileKey)); err != nil || done {
				return err
			}
			ev.Type, ev.TileKey, ev.FrameKey = farm.EventTileFailed, job.TileKey, job.FrameKey
		case queue.SubjectAssemble:
			var job farm.AssembleJob
			if json.Unmarshal(dl.Data, &job) != nil {
				return nil // nothing to record for an undecodable message
			}
			ev.Type, ev.FrameKey = farm.EventFrameFailed, job.FrameKey
		default:
			return nil
		}
		return c.applyEvent(ctx, ev)
	})
}
