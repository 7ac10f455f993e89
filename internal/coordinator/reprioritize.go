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
	moved := 0
	err = c.update(ctx, func(p *projection) error {
		j, err := p.tx.Job(jobID)
		if err != nil {
			return err
		}
		old := j.Priority
		j.Priority = priority
		if err := p.tx.PutJob(j); err != nil {
			return err
		}
		if queue.BandOf(old) == queue.BandOf(priority) {
			return nil
		}
		for n := range j.FrameNumbers() {
			e, err := p.edit(j.FrameKey(n))
			if err != nil {
				return err
			}
			if e.f.Dropped || e.f.TilesCompleted == e.f.TilesTotal {
				continue
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
