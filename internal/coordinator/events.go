package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/wire"
)

// consumerEvents is the coordinator's durable consumer on EVENTS: after a crash it resumes where
// it stopped, and applying an event again changes nothing (see coorddb.NextTileState).
const consumerEvents = ConsumerEvents

// ConsumerEvents names the coordinator's durable consumer on EVENTS, for tools that wait until
// it has applied what was published (farmbench).
const ConsumerEvents = "coordinator"

// eventBatch bounds the events applied in one transaction.
const eventBatch = 512

// eventsConsumer is the coordinator's durable consumer of EVENTS.
var eventsConsumer = jetstream.ConsumerConfig{
	Durable:   consumerEvents,
	AckPolicy: jetstream.AckExplicitPolicy,
	AckWait:   time.Minute,
	// Well above what the iterator, the channel and a batch being applied hold unacked
	// together: at the limit the server stops delivering and a pull can sit idle until it
	// expires.
	MaxAckPending: 16 * eventBatch,
	// An event that cannot be applied even alone is given up after a few tries: what it
	// said is repaired from the manifests by the reconciler.
	MaxDeliver: 10,
}

// consumeEvents applies EVENTS in batches: the events that have arrived are applied in one
// transaction and acked after it commits, so a burst of tile events costs one commit per
// batch, not per event. A batch never waits for more events: the last tile.completed of a
// frame asks for its assembly as soon as it arrives (docs/design.md, "Flows": Events).
func (c *Coordinator) consumeEvents(ctx context.Context) error {
	cons, err := c.queue.Events.CreateOrUpdateConsumer(ctx, eventsConsumer)
	if err != nil {
		return fmt.Errorf("creating events consumer: %w", err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(eventBatch))
	if err != nil {
		return fmt.Errorf("consuming events: %w", err)
	}
	defer it.Stop()
	msgs := make(chan jetstream.Msg, eventBatch)
	errc := make(chan error, 1)
	go func() {
		defer close(msgs)
		for {
			msg, err := it.Next()
			if err != nil {
				if ctx.Err() == nil && !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
					errc <- fmt.Errorf("consuming events: %w", err)
				}
				return
			}
			msgs <- msg
		}
	}()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	for {
		msg, ok := <-msgs
		if !ok {
			select {
			case err := <-errc:
				return err
			default:
				return nil
			}
		}
		c.applyBatch(ctx, takeReady(msg, msgs, eventBatch))
	}
}

// takeReady is group commit without a linger: first and whatever else has already arrived on
// msgs, up to limit, never waiting for more. Events that arrive while a batch commits queue up
// on msgs and make the next batch, so a burst still costs one transaction per batch, and a
// lone event (a frame's last tile) is applied at once.
func takeReady[T any](first T, msgs <-chan T, limit int) []T {
	batch := []T{first}
	for len(batch) < limit {
		select {
		case m, ok := <-msgs:
			if !ok {
				return batch
			}
			batch = append(batch, m)
		default:
			return batch
		}
	}
	return batch
}

// applyBatch applies a batch of event messages in one transaction, then acks them; if the
// transaction fails they are redelivered.
func (c *Coordinator) applyBatch(ctx context.Context, batch []jetstream.Msg) {
	evs := make([]wire.Event, 0, len(batch))
	keep := batch[:0]
	for _, m := range batch {
		var ev wire.Event
		if err := json.Unmarshal(m.Data(), &ev); err != nil {
			c.log.Error("dropping undecodable event", "subject", m.Subject(), "err", err)
			_ = m.Term()
			continue
		}
		movie := ev.Type == wire.EventMovieReady || ev.Type == wire.EventMovieFailed
		if movie && !validJobID(ev.JobID) || !movie && !validHash(ev.FrameKey) {
			c.log.Warn("dropping an event that names no frame or job", "subject", m.Subject(), "type", ev.Type)
			_ = m.Term()
			continue
		}
		if ev.Type == wire.EventMovieReady {
			// A movie is believed only once its manifest says so (docs/design.md, "Preview movie").
			promoted, err := c.moviePromoted(ctx, ev.JobID)
			if err != nil {
				c.log.Warn("checking a movie's manifest; retrying the event", "job_id", ev.JobID, "err", err)
				_ = m.NakWithDelay(time.Second)
				continue
			}
			if !promoted {
				c.log.Warn("ignoring movie.ready for a movie with no manifest", "job_id", ev.JobID, "worker", ev.Worker)
				_ = m.Ack()
				continue
			}
		}
		if ev.Type == wire.EventFrameAssembled {
			// A claim that outputs are promoted counts only once their manifests say so.
			promoted, err := c.formatsPromoted(ctx, ev.FrameKey, ev.Formats)
			if err != nil {
				c.log.Warn("checking an assembled frame's manifests; retrying the event", "frame_key", ev.FrameKey, "err", err)
				_ = m.NakWithDelay(time.Second)
				continue
			}
			if !promoted {
				c.log.Warn("ignoring frame.assembled for outputs with no manifest", "frame_key", ev.FrameKey, "formats", ev.Formats, "worker", ev.Worker)
				_ = m.Ack()
				continue
			}
		}
		evs = append(evs, ev)
		keep = append(keep, m)
	}
	if err := c.applyEvents(ctx, evs); err == nil {
		for _, m := range keep {
			_ = m.Ack()
		}
		return
	} else if len(evs) > 1 {
		c.log.Warn("applying a batch of events failed; applying them one by one", "events", len(evs), "err", err)
	}
	// One bad event must not hold up the others: apply each alone, retry only those that fail.
	for i, ev := range evs {
		if err := c.applyEvents(ctx, evs[i:i+1]); err != nil {
			c.log.Error("applying event", "event", ev.ID, "err", err)
			_ = keep[i].NakWithDelay(time.Second)
			continue
		}
		_ = keep[i].Ack()
	}
}

// applyEvents folds events into the projection in one transaction.
func (c *Coordinator) applyEvents(ctx context.Context, evs []wire.Event) error {
	changed := false
	var p *projection
	err := c.db.Update(ctx, func(tx *coorddb.Tx) error {
		p = c.newProjection(ctx, tx)
		for _, ev := range evs {
			if err := c.applyEvent(p, ev); err != nil {
				if errors.Is(err, coorddb.ErrNotFound) || errors.Is(err, errUnknownTile) {
					// An event about a frame this coordinator never had (another farm's, or
					// forged) changes nothing.
					c.log.Warn("ignoring event for an unknown frame or tile", "event", ev.ID, "frame_key", ev.FrameKey, "err", err)
					continue
				}
				return err
			}
		}
		var err error
		changed, err = p.flush()
		return err
	})
	if err == nil {
		c.counted(p)
		for _, ev := range evs {
			if slices.Contains(wire.EventTypes, ev.Type) { // a forged type adds no series
				c.m.EventsApplied.WithLabelValues(ev.Type).Inc()
			}
		}
		c.fleet.failed(p.failed) // the workers page's recent failures
		c.progress.finished(evs) // a completed or failed tile is no longer in progress
		c.countCompletions(evs)
		c.kickRelay() // an event may have asked for an assembly
		if changed || len(evs) > 0 {
			c.notify()
		}
	}
	return err
}

// applyEvent turns one event into projection changes.
func (c *Coordinator) applyEvent(p *projection, ev wire.Event) error {
	switch ev.Type {
	case wire.EventTileStarted, wire.EventTileCompleted, wire.EventTileFailed:
		u := tileUpdate{Index: ev.TileIndex}
		switch ev.Type {
		case wire.EventTileStarted:
			u.Change, u.Order, u.Attempt, u.SamplesRecovered = coorddb.TileStarted, coorddb.StartedOrder(ev.Seq, ev.Delivery), ev.Attempt, ev.SamplesRecovered
		case wire.EventTileCompleted:
			u.Change, u.SamplesRendered, u.Object, u.RenderMillis = coorddb.TileDone, ev.SamplesRendered, ev.Object, ev.RenderMillis
			// The completion repeats what its attempt resumed: its start may reach the
			// projection after it, or a minute late (a pull answered on a connection that
			// moved to another NATS node is redelivered only after AckWait).
			u.Attempt, u.SamplesRecovered = ev.Attempt, ev.SamplesRecovered
		case wire.EventTileFailed:
			u.Change, u.Order = coorddb.TileFailed, coorddb.FailedOrder(ev.Seq, ev.Delivery)
			if ev.Terminal {
				u.Change, u.Order = coorddb.TileDeadLetter, coorddb.DeadLetterOrder(ev.Seq)
			}
			u.Failure = &coorddb.Failure{Attempt: ev.Attempt, Worker: ev.Worker, Code: ev.Code, Error: ev.Error, Delivery: ev.Delivery, Time: ev.Time, Log: ev.Log}
		}
		return p.tileChecked(ev.FrameKey, ev.TileKey, ev.TileIndex, u)
	case wire.EventFrameAssembled:
		return p.formatsDone(ev.FrameKey, ev.Formats)
	case wire.EventFrameFailed:
		if !ev.Terminal {
			return nil
		}
		return p.assemblyFailed(ev.FrameKey, ev.Formats, ev.Error)
	case wire.EventMovieReady:
		return p.movieChange(ev.JobID, coorddb.MovieDone, "")
	case wire.EventMovieFailed:
		if !ev.Terminal {
			return nil // retried: the movie stays pending
		}
		return p.movieChange(ev.JobID, coorddb.MovieDeadLetter, ev.Error)
	}
	return nil
}
