package worker

import (
	"sync/atomic"
	"time"
)

// checkpointBudget bounds the share of a slot's time spent on checkpoints when their cadence
// is automatic: a save is due once the time since the last one (or since the render began) is
// at least checkpointBudget times what a save costs the render, so saving takes at most about
// 1/(budget+1) of the slot, 2%. What a save costs the render is the snapshot of the tile's
// state and its encoding; the local commit and the upload run in the background
// (checkpointer.go). Saving after every pass is what loses least to a kill (docs/design.md,
// "Checkpoints"); the budget keeps that from costing throughput when tiles are large.
const checkpointBudget = 49

// checkpointRate bounds the background part by bytes: a save is due only once the time since
// the last one is at least the last save's encoded size over checkpointRate, per slot. The local
// commit, the upload and the store's own work grow with the bytes, and none of them shows in the
// render's budget; a small tile's state (a 32 px tile encodes to tens of KB) is still saved after
// every pass, a large one's a few times a second, and the load on a shared store stays in
// proportion.
const checkpointRate = 4 << 20 // bytes per second

// remoteFloor is the least time between remote checkpoint uploads, and before the first, when
// their cadence is automatic: a remote checkpoint is what another node resumes from, and
// rendering less than this again costs less than the upload and its delete (two store
// requests). So a tile rendered within it costs no store request for checkpoints at all, and a
// long one uploads at most once a second, riding along with its local checkpoints.
const remoteFloor = time.Second

// newRemoteCadence is the cadence of remote uploads (Config.RemoteEvery): 0 is automatic (at
// least remoteFloor apart, and the local budgets), negative uploads with every local
// checkpoint and positive is a minimum interval.
func newRemoteCadence(every time.Duration, cost *saveCost, start time.Time) cadence {
	if every == 0 {
		return cadence{every: remoteFloor, auto: true, cost: cost, last: start}
	}
	return newCadence(every, cost, start)
}

// cadence decides, after each pass, whether a checkpoint is due. An every of 0 saves after
// every pass; a positive every is a minimum interval; auto adds the cost budget.
type cadence struct {
	every time.Duration // minimum time between saves; 0: none
	auto  bool          // also wait out the cost budgets of a save
	cost  *saveCost     // what a save costs on this worker
	last  time.Time     // when the render began or the last save's snapshot was taken
}

// saveCost is what a worker's last checkpoint cost, the estimate of the next one's: the render's
// share (snapshot and encoding) and its encoded size. Every tile run of the worker reads and
// updates it.
type saveCost struct{ renderNs, size atomic.Int64 }

func (c *saveCost) render() time.Duration { return time.Duration(c.renderNs.Load()) }
func (c *saveCost) bytes() int64          { return c.size.Load() }

// set records a save whose render share was render and whose encoding was size bytes.
func (c *saveCost) set(render time.Duration, size int) {
	c.renderNs.Store(int64(render))
	c.size.Store(int64(size))
}

// newCadence is the cadence of a Config interval (CheckpointEvery): 0 is automatic, negative
// saves after every pass and positive is a minimum interval.
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
		gap = max(gap, checkpointBudget*c.cost.render(), time.Duration(c.cost.bytes())*time.Second/checkpointRate)
	}
	return now.Sub(c.last) >= gap
}

// mark records a save whose snapshot was taken at now.
func (c *cadence) mark(now time.Time) { c.last = now }
