package worker

import (
	"sync/atomic"
	"time"
)

// checkpointBudget bounds the share of a slot's time spent saving checkpoints when their
// cadence is automatic: a save is due once the time since the last one (or since the render
// began) is at least checkpointBudget times what a save costs, so saving takes at most about
// 1/(budget+1) of the slot, 5%. Saving after every pass is what loses least to a kill
// (docs/design.md, "Checkpoints"); the budget keeps that from costing throughput when passes
// are short or the store is slow, and backs off by itself when the store is loaded.
const checkpointBudget = 19

// cadence decides, after each pass, whether a checkpoint is due. An every of 0 saves after
// every pass; a positive every is a minimum interval; auto adds the cost budget.
type cadence struct {
	every time.Duration // minimum time between saves; 0: none
	auto  bool          // also wait checkpointBudget times the cost of a save
	cost  *saveCost     // what saves of this kind cost on this worker
	last  time.Time     // when the render began or the last save ended
}

// saveCost is the duration of a worker's last save of one kind (local or remote), the estimate
// of the next one's; every tile run of the worker reads and updates it.
type saveCost struct{ ns atomic.Int64 }

func (c *saveCost) get() time.Duration  { return time.Duration(c.ns.Load()) }
func (c *saveCost) set(d time.Duration) { c.ns.Store(int64(d)) }

// newCadence is the cadence of a normalized Config interval (CheckpointEvery, RemoteEvery):
// 0 is automatic, negative saves after every pass and positive is a minimum interval.
func newCadence(every time.Duration, cost *saveCost, start time.Time) cadence {
	switch {
	case every == 0:
		return cadence{auto: true, cost: cost, last: start}
	case every < 0:
		return cadence{cost: cost, last: start}
	}
	return cadence{every: every, cost: cost, last: start}
}

// due reports whether a save is due at now.
func (c *cadence) due(now time.Time) bool {
	gap := c.every
	if c.auto {
		gap = max(gap, checkpointBudget*c.cost.get())
	}
	return now.Sub(c.last) >= gap
}

// saved records a save that ran from start to end.
func (c *cadence) saved(start, end time.Time) {
	c.last = end
	c.cost.set(end.Sub(start))
}

// tileCheckpoints is when a tile run's next checkpoints are due, locally and in the object
// store (from which any node resumes it).
type tileCheckpoints struct{ local, remote cadence }

func (w *Worker) newTileCheckpoints(start time.Time) *tileCheckpoints {
	return &tileCheckpoints{local: newCadence(w.cfg.CheckpointEvery, &w.localCost, start),
		remote: newCadence(w.cfg.RemoteEvery, &w.remoteCost, start)}
}
