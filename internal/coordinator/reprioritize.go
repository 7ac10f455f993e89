package coordinator

import (
	"context"

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
	moved := 0
	err := c.update(ctx, func(p *projection) error {
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
			k, err := p.redispatch(e.f.Key, j, func(s coorddb.TileState) bool {
				return s == coorddb.TileQueued || s == coorddb.TileFailedRetryable
			}, coorddb.TileRequeued)
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
