package coordinator

import (
	"context"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/queue"
)

// Reprioritizing a job: a new priority, and its tiles not started yet moved to the new band.

// Reprioritize gives a job a new priority. When that moves a frame of it to another band (a
// frame shared with other jobs goes in the highest band of those that want it), its tiles
// not started yet are dispatched again there by the frame's move (moveFrames); tiles
// rendering finish where they are.
func (c *Coordinator) Reprioritize(ctx context.Context, jobID string, priority int) (api.Status, error) {
	if priority < api.MinPriority || priority > api.MaxPriority {
		return api.Status{}, badInput("priority %d: want %d to %d", priority, api.MinPriority, api.MaxPriority)
	}
	frames := 0
	err := c.update(ctx, func(p *projection) error {
		j, err := p.job(jobID)
		if err != nil {
			return err
		}
		if j.Priority == priority {
			return nil
		}
		j.Priority = priority
		p.markJob(j)
		if queue.BandOf(p.jobs[jobID].before.Priority) == queue.BandOf(priority) {
			return nil
		}
		// Every frame of the job in the change, so flush sees where each must go now.
		for n := range j.FrameNumbers() {
			if _, err := p.edit(j.FrameKey(n)); err != nil {
				return err
			}
			frames++
		}
		return nil
	})
	if err != nil {
		return api.Status{}, err
	}
	c.log.Info("job reprioritized", "job_id", jobID, "priority", priority, "band", queue.BandOf(priority).String(), "frames", frames)
	return c.Status(ctx, jobID)
}
