package coordinator

import (
	"context"
	"errors"
	"fmt"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
)

// Cancelling a job and giving one up, both through stopJob, which drops the frames no other
// live job waits for (liveJob). A dropped frame a new job asks for is revived by its move
// (dispatch.go).

// Cancel stops a job: it is cancelled from now on, and each of its frames that no other live
// job waits for is dropped, so workers render none of its tiles (they check before leasing a
// tile and between passes). Frames other jobs wait for keep rendering for them. Cancelling a
// cancelled job again is harmless; a finished job cannot be cancelled (ErrConflict).
func (c *Coordinator) Cancel(ctx context.Context, jobID string) (api.Status, error) {
	return c.stopJob(ctx, jobID, func(j *coorddb.Job) {
		if j.Cancelled.IsZero() {
			j.Cancelled = c.now()
		}
	})
}

// giveUp fails a job the farm cannot render (every live worker blocklisted it) and drops its
// frames as Cancel does.
func (c *Coordinator) giveUp(ctx context.Context, jobID, reason string) error {
	_, err := c.stopJob(ctx, jobID, func(j *coorddb.Job) { j.Failed = reason })
	return err
}

// stopJob marks a job with mark and drops its frames no other live job waits for. The marks
// are recorded first and the dropped frames published after: a crash between the two leaves
// tiles rendering for nothing, which the next stop of the job (Cancel is idempotent) or the
// manifests settle; never a tile missing for a live job.
func (c *Coordinator) stopJob(ctx context.Context, jobID string, mark func(*coorddb.Job)) (api.Status, error) {
	var dropped []string
	err := c.update(ctx, func(p *projection) error {
		j, err := p.job(jobID)
		if err != nil {
			return err
		}
		st, err := jobStatus(p.tx, j, p.tx.Frame)
		if err != nil {
			return err
		}
		if st.State == api.JobCompleted || st.State == api.JobFailed {
			return fmt.Errorf("%w: job %s already %s: only a job not finished can be cancelled", api.ErrConflict, jobID, st.State)
		}
		mark(j)
		p.markJob(j)
		p.stopped = true
		for n := range j.FrameNumbers() {
			e, err := p.edit(j.FrameKey(n))
			if err != nil {
				return err
			}
			if e.f.Derive() == coorddb.FrameCompleted {
				continue
			}
			live, err := liveJob(p.tx, e.f, j.ID)
			if err != nil {
				return err
			}
			if live == nil {
				e.f.Dropped = true
				dropped = append(dropped, e.f.Key)
			}
		}
		return nil
	})
	if err != nil {
		return api.Status{}, err
	}
	for _, fk := range dropped {
		if err := c.queue.Dropped.Add(ctx, fk); err != nil {
			return api.Status{}, err
		}
	}
	c.log.Info("job stopped", "job_id", jobID, "frames_dropped", len(dropped))
	return c.Status(ctx, jobID)
}

// liveJob returns the newest live job other than except (not cancelled, not given up, not
// yet served by the frame) that waits for frame f, or nil when none does.
func liveJob(tx *coorddb.Tx, f *coorddb.Frame, except string) (*coorddb.Job, error) {
	for i := len(f.JobIDs) - 1; i >= 0; i-- {
		if f.JobIDs[i] == except {
			continue
		}
		k, err := tx.Job(f.JobIDs[i])
		if errors.Is(err, coorddb.ErrNotFound) {
			continue
		} else if err != nil {
			return nil, err
		}
		if wants(k, f) {
			return k, nil
		}
	}
	return nil, nil
}
