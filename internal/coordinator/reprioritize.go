package coordinator

import (
	"context"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/queue"
)

// Reprioritizing a job: a new priority, and its tiles not started yet moved to the new band.

// Reprioritize gives a job a new priority. When that moves it to another band, its tiles not
// started yet are dispatched again in the new band (shared frames move with it); tiles
// rendering finish where they are.
func (c *Coordinator) Reprioritize(ctx context.Context, jobID string, priority int) (api.Status, error) {
	if priority < api.MinPriority || priority > api.MaxPriority {
		return api.Status{}, badInput("priority %d: want %d to %d", priority, api.MinPriority, api.MaxPriority)
	}
	// The tiles move to new copies in the new band; the old copies stay queued in the old one
	// until a worker acks them, and must not fail the tile meanwhile (coorddb.TileMoved): every
	// copy dispatched so far is published first, so the move's order is after all of them.
	if err := c.publishOutbox(ctx, 10*time.Second); err != nil {
		return api.Status{}, err
	}
	ord, err := c.movedOrder(ctx)
	if err != nil {
		return api.Status{}, err
	}
	if err := c.markCopies(ctx, jobID, priority); err != nil {
		return api.Status{}, err
	}
	moved := 0
	err = c.update(ctx, func(p *projection) error {
		j, err := p.job(jobID)
		if err != nil {
			return err
		}
		old := j.Priority
		j.Priority = priority
		p.markJob(j)
		if queue.BandOf(old) == queue.BandOf(priority) {
			return nil
		}
		for n := range j.FrameNumbers() {
			e, err := p.edit(j.FrameKey(n))
			if err != nil {
				return err
			}
			if e.f.Dropped || e.f.Held || e.f.TilesCompleted == e.f.TilesTotal {
				continue // a held frame is dispatched at its job's priority when it starts
			}
			k, err := p.redispatch(e.f.Key, j, func(_ int, s coorddb.TileState) bool {
				return s == coorddb.TileQueued || s == coorddb.TileFailedRetryable
			}, coorddb.TileMoved, ord)
			if err != nil {
				return err
			}
			moved += k
		}
		return nil
	})
	if err != nil {
		return api.Status{}, err
	}
	c.log.Info("job reprioritized", "job_id", jobID, "priority", priority, "band", queue.BandOf(priority).String(), "tiles_moved", moved)
	return c.Status(ctx, jobID)
}

// markCopies marks, before a job moves to another band, every frame of it whose tiles may be
// dispatched again there (queue.Dropped.MarkCopies): the first copies stay queued in the old
// band, and a worker taking one after the tile was promoted from its new copy must check, not
// render it again as a first dispatch would (docs/design.md, "Store requests of a tile").
func (c *Coordinator) markCopies(ctx context.Context, jobID string, priority int) error {
	var frames []string
	err := c.db.View(ctx, func(tx *coorddb.Tx) error {
		j, err := tx.Job(jobID)
		if err != nil || queue.BandOf(j.Priority) == queue.BandOf(priority) {
			return err
		}
		for n := range j.FrameNumbers() {
			f, err := tx.Frame(j.FrameKey(n))
			if err != nil {
				return err
			}
			if !f.Dropped && !f.Held && f.TilesCompleted < f.TilesTotal {
				frames = append(frames, f.Key)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, fk := range frames {
		if err := c.queue.Dropped.MarkCopies(ctx, fk); err != nil {
			return err
		}
	}
	return nil
}
