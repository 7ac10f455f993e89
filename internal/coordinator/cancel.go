package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
)

// Cancelling a job and giving one up, both through stopJob, which drops the frames no other
// live job waits for (liveJob), and reviving a dropped frame a new job asks for.

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
		if k.Cancelled.IsZero() && k.Failed == "" && f.StateFor(k.Formats) != coorddb.FrameCompleted {
			return k, nil
		}
	}
	return nil, nil
}

// revive makes a dropped frame wanted again for job j: workers are told before its tiles not
// completed are dispatched anew (completed ones are reused, in-flight ones resume from their
// checkpoints), inside the transaction, so no new message can meet the old mark.
func (c *Coordinator) revive(ctx context.Context, p *projection, e *frameEdit, j *coorddb.Job) error {
	if err := c.queue.Dropped.Revive(ctx, e.f.Key); err != nil {
		return err
	}
	e.f.Dropped = false
	// The dropped copies may still queue: the new ones are dispatched as a move, so no old copy
	// can fail the tile (coorddb.TileMoved). The outbox is not awaited here, inside the
	// submission's transaction; a dropped frame's copies were published long before.
	ord, err := c.movedOrder(ctx)
	if err != nil {
		return err
	}
	_, err = p.redispatch(e.f.Key, j, func(_ int, s coorddb.TileState) bool { return s != coorddb.TileCompleted }, coorddb.TileMoved, ord)
	return err
}

// movedOrder is the order of a tile moved to a new copy (coorddb.TileMoved): the dead letter
// of the newest message TILES holds, so every copy of it dispatched before is older and every
// copy dispatched after is newer.
func (c *Coordinator) movedOrder(ctx context.Context) (coorddb.Order, error) {
	seq, err := c.queue.LastSeq(ctx)
	if err != nil {
		return coorddb.Order{}, err
	}
	return coorddb.DeadLetterOrder(seq), nil
}

// publishOutbox has the relay publish the outbox and waits, at most wait, until it is empty, so
// that every copy of a tile dispatched so far is in TILES.
func (c *Coordinator) publishOutbox(ctx context.Context, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		c.kickRelay()
		n, err := c.db.OutboxLen(ctx)
		if err != nil || n == 0 {
			return err
		}
		if time.Now().After(deadline) {
			c.log.Warn("the outbox did not empty in time: copies not yet published may still count", "records", n)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
