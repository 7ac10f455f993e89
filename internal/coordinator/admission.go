package coordinator

import (
	"errors"
	"math"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/wire"
)

// Backpressure: a submission is admitted only while the tiles pending stay within the limit,
// and refused with when to retry from the measured drain rate.

// pendingTiles counts the tiles not completed of the frames a live job waits for: neither
// dropped nor failed, and not completed. It reads only unfinished frames (coorddb.OpenFrames),
// so a submission's admission costs what is in the queue, not the farm's history.
func pendingTiles(tx *coorddb.Tx) (int, error) {
	pending := 0
	var err error
	tx.OpenFrames(func(fk string) bool {
		var f *coorddb.Frame
		if f, err = tx.Frame(fk); errors.Is(err, coorddb.ErrNotFound) {
			err = nil
			return true
		} else if err != nil {
			return false
		}
		if f.Dropped || f.TilesCompleted >= f.TilesTotal || f.Derive() == coorddb.FrameFailed {
			return true
		}
		var live *coorddb.Job
		if live, err = liveJob(tx, f, ""); err != nil {
			return false
		}
		if live != nil {
			pending += f.TilesTotal - f.TilesCompleted
		}
		return true
	})
	return pending, err
}

// admit refuses a submission of adding tiles that would take the pending tiles over the
// configured limit, with when to retry: the excess over the measured drain rate. It counts in
// tx, the transaction that writes the job, so the limit holds whatever number of submissions
// race: the database serializes its writers.
func (c *Coordinator) admit(tx *coorddb.Tx, adding int) error {
	limit := c.cfg.MaxPendingTiles
	if limit <= 0 {
		return nil
	}
	if adding > limit {
		return badInput("the job has %d tiles, more than the farm's limit of %d pending tiles: split it into smaller jobs", adding, limit)
	}
	pending, err := pendingTiles(tx)
	if err != nil {
		return err
	}
	if pending+adding <= limit {
		return nil
	}
	retry := 30 * time.Second
	c.drainMu.Lock()
	rate, ok := c.drain.rate()
	c.drainMu.Unlock()
	if ok && rate > 0 {
		retry = time.Duration(math.Ceil(float64(pending+adding-limit)/rate)) * time.Second
	}
	return &api.BusyError{Pending: pending, Adding: adding, Limit: limit, RetryAfter: min(max(retry, time.Second), time.Hour)}
}

// countCompletions adds the tile completions among evs to the drain meter's count.
func (c *Coordinator) countCompletions(evs []wire.Event) {
	n := 0
	for i := range evs {
		if evs[i].Type == wire.EventTileCompleted {
			n++
		}
	}
	if n > 0 {
		c.completions.Add(int64(n))
	}
}
