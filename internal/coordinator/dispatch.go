package coordinator

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/queue"
)

// Where a frame's tiles go (docs/design.md, "Dispatch"). A frame is shared by every job that
// asks for it, so its dispatch target follows its jobs: the pool and band that every job still
// wanting the frame reaches, under the loosest limit among them. When a job joins a frame,
// leaves it (cancelled, given up) or changes priority, or a dropped frame is revived, flush's
// "move frames" step records a move, and the relay moves the tiles not started yet to where
// their jobs are now (Coordinator.move), outside the transaction: a NATS request never holds
// up the database.

// target is where a frame's tiles are dispatched: a pool, and a priority band in it.
type target struct {
	pool queue.Pool
	band queue.Band
}

// subject is the target's subject, which names it: two targets are the same where their
// subjects are.
func (t target) subject() string { return t.pool.Subject(t.band) }

// wants reports whether job j still wants frame f rendered: it is live (not cancelled, not
// given up) and f is not completed in its formats.
func wants(j *coorddb.Job, f *coorddb.Frame) bool {
	return j != nil && j.Cancelled.IsZero() && j.Failed == "" && f.StateFor(j.Formats) != coorddb.FrameCompleted
}

// frameTarget is where frame f's tiles go given its jobs (in f.JobIDs' order, nil for one not
// known): the loosest pool of the jobs that want it, the tags every one of them requires, a
// slot limit only if each has one (the largest), the newest one's renderer build; and the
// highest band among them. A frame no job wants any more goes where fallback (the job an
// outbox record names; nil: none known) would send it, at priority.
func frameTarget(f *coorddb.Frame, jobs []*coorddb.Job, fallback *coorddb.Job, priority int) target {
	var wanting []*coorddb.Job
	for _, j := range jobs {
		if wants(j, f) {
			wanting = append(wanting, j)
		}
	}
	if len(wanting) == 0 {
		if fallback != nil {
			priority = fallback.Priority
		}
		return target{pool: poolOf(fallback, f), band: queue.BandOf(priority)}
	}
	newest := wanting[len(wanting)-1]
	t := target{pool: queue.Pool{Build: cmp.Or(newest.Build, f.Settings.Build), Requires: slices.Clone(newest.Requires)}}
	unlimited := false
	var limited *coorddb.Job // the wanting job of the largest slot limit
	for _, j := range wanting {
		t.band = max(t.band, queue.BandOf(j.Priority))
		t.pool.Requires = slices.DeleteFunc(t.pool.Requires, func(tag string) bool { return !slices.Contains(j.Requires, tag) })
		switch {
		case j.MaxSlots == 0:
			unlimited = true
		case limited == nil || j.MaxSlots >= limited.MaxSlots:
			limited = j
		}
	}
	if !unlimited && limited != nil {
		t.pool.Job, t.pool.Slots = limited.ID, limited.MaxSlots
	}
	if len(t.pool.Requires) == 0 {
		t.pool.Requires = nil
	}
	return t
}

// frameJobs reads the jobs of frame f, in f.JobIDs' order, with job (nil for one not known).
func frameJobs(f *coorddb.Frame, job func(id string) (*coorddb.Job, error)) ([]*coorddb.Job, error) {
	out := make([]*coorddb.Job, 0, len(f.JobIDs))
	for _, id := range f.JobIDs {
		j, err := job(id)
		if errors.Is(err, coorddb.ErrNotFound) {
			j, err = nil, nil
		}
		if err != nil {
			return nil, err
		}
		out = append(out, j)
	}
	return out, nil
}

// newestWanting is the newest job that wants f, nil for none.
func newestWanting(f *coorddb.Frame, jobs []*coorddb.Job) *coorddb.Job {
	for i := len(jobs) - 1; i >= 0; i-- {
		if wants(jobs[i], f) {
			return jobs[i]
		}
	}
	return nil
}

// moveFrames records a move (coorddb.OutboxMove) of every frame changed whose tiles not
// started yet are now in the wrong place: one whose jobs joined, left or changed so that its
// target is another, and one revived from dropped (every tile not completed moves). A frame
// new in this projection is dispatched where its outbox record finds it; a held, dropped or
// finished one has nothing queued.
func (p *projection) moveFrames() error {
	for _, fk := range p.order {
		e := p.frames[fk]
		f := e.f
		if !e.dirty || e.before == nil || f.Held || f.Dropped || f.TilesCompleted == f.TilesTotal {
			continue
		}
		revived := e.before.Dropped
		if !revived {
			moved, err := p.retargeted(e)
			if err != nil || !moved {
				if err != nil {
					return err
				}
				continue
			}
		}
		jobs, err := frameJobs(f, p.job)
		if err != nil {
			return err
		}
		jobID := ""
		if j := newestWanting(f, jobs); j != nil {
			jobID = j.ID
		}
		if err := p.tx.AddOutbox(coorddb.OutboxRecord{Kind: coorddb.OutboxMove, FrameKey: fk, JobID: jobID, Revive: revived}); err != nil {
			return err
		}
	}
	return nil
}

// retargeted reports whether frame e's target changed in this projection: its jobs are not
// the ones it had, or one of them changed.
func (p *projection) retargeted(e *frameEdit) (bool, error) {
	changed := !slices.Equal(e.before.JobIDs, e.f.JobIDs)
	for _, id := range e.f.JobIDs {
		if je, ok := p.jobs[id]; ok && je.dirty {
			changed = true
		}
	}
	if !changed {
		return false, nil
	}
	after, err := frameJobs(e.f, p.job)
	if err != nil {
		return false, err
	}
	before, err := frameJobs(e.before, func(id string) (*coorddb.Job, error) {
		if je, ok := p.jobs[id]; ok {
			if je.before == nil {
				return nil, coorddb.ErrNotFound // the job this projection submits
			}
			return je.before, nil
		}
		return p.job(id)
	})
	if err != nil {
		return false, err
	}
	return frameTarget(e.before, before, nil, 0).subject() != frameTarget(e.f, after, nil, 0).subject(), nil
}

// move carries out a move record (moveFrames), after every record before it is published: the
// frame's copies marked so that none is trusted as a first dispatch, then its tiles not
// started yet (every tile not completed, for a frame revived) dispatched again as
// coorddb.TileMoved at movedOrder, so no event of an old copy counts any more, and, for a
// frame revived, the workers told it is wanted again before the new copies exist.
func (c *Coordinator) move(ctx context.Context, r coorddb.OutboxRecord) error {
	if !r.Revive {
		if err := c.queue.Dropped.MarkCopies(ctx, r.FrameKey); err != nil {
			return err
		}
	}
	ord, err := c.movedOrder(ctx)
	if err != nil {
		return err
	}
	revive := false
	err = c.update(ctx, func(p *projection) error {
		e, err := p.edit(r.FrameKey)
		if err != nil {
			return ignoreUnknown(err)
		}
		f := e.f
		if f.Dropped || f.Held {
			return nil // dropped again, or held, since: nothing to move
		}
		jobs, err := frameJobs(f, p.job)
		if err != nil {
			return err
		}
		j := newestWanting(f, jobs)
		if j == nil {
			if j, err = p.job(r.JobID); err != nil {
				return ignoreUnknown(err)
			}
		}
		revive = r.Revive
		pick := func(_ int, s coorddb.TileState) bool {
			return s == coorddb.TileQueued || s == coorddb.TileFailedRetryable
		}
		if r.Revive {
			pick = func(_ int, s coorddb.TileState) bool { return s != coorddb.TileCompleted }
		}
		_, err = p.redispatch(f.Key, j, pick, coorddb.TileMoved, ord)
		return err
	})
	if err != nil || !revive {
		return err
	}
	// The new copies are published after this, by the relay's next round.
	if err := c.queue.Dropped.Revive(ctx, r.FrameKey); err != nil {
		return fmt.Errorf("reviving frame %s: %w", r.FrameKey, err)
	}
	return nil
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

// Retiring pools: a pool's tile consumers exist while a frame wanted is dispatched there, and
// go once none is, so no worker polls a finished job's own pool (--max-slots) for ever, and no
// stale copy waits in TILES where no worker pulls (a tag's pool once its last job left a
// shared frame).

// poolsInUse are the pools (by ID) where the tiles of a frame some job still wants rendered
// go: every unfinished frame's target, held, dropped and finished ones aside.
func poolsInUse(tx *coorddb.Tx) (map[string]bool, error) {
	jobs := map[string]*coorddb.Job{}
	job := func(id string) (*coorddb.Job, error) {
		if j, ok := jobs[id]; ok {
			return j, nil
		}
		j, err := tx.Job(id)
		if err == nil {
			jobs[id] = j
		}
		return j, err
	}
	inUse := map[string]bool{}
	var err error
	tx.OpenFrames(func(fk string) bool {
		var f *coorddb.Frame
		if f, err = tx.Frame(fk); err != nil {
			return false
		}
		if f.Held || f.Dropped || f.TilesCompleted == f.TilesTotal {
			return true
		}
		var fj []*coorddb.Job
		if fj, err = frameJobs(f, job); err != nil {
			return false
		}
		if newestWanting(f, fj) != nil {
			inUse[frameTarget(f, fj, nil, 0).pool.ID()] = true
		}
		return true
	})
	return inUse, err
}

// DefaultRetirePoolsAfter is how long an idle pool keeps its consumers by default
// (Config.RetirePoolsAfter).
const DefaultRetirePoolsAfter = time.Minute

// retirePools retires (an OutboxRetire record, carried out by the relay) every pool with tile
// consumers that no frame wanted has been dispatched to for Config.RetirePoolsAfter, as far
// as this coordinator's looks saw. The decision is made in a transaction, so a submission
// committed before it keeps its pool, and one after it finds the pool made anew by the relay,
// which retires in outbox order. A read-only look first spares the write when no pool is due.
func (c *Coordinator) retirePools(ctx context.Context) error {
	present, err := c.queue.TilePools(ctx)
	if err != nil || len(present) == 0 {
		clear(c.poolIdle)
		return err
	}
	now := c.now()
	due := func(id string) bool {
		since, ok := c.poolIdle[id]
		if !ok {
			since, c.poolIdle[id] = now, now
		}
		return c.cfg.RetirePoolsAfter < 0 || now.Sub(since) >= c.cfg.RetirePoolsAfter
	}
	idle := func(tx *coorddb.Tx) ([]string, error) {
		inUse, err := poolsInUse(tx)
		if err != nil {
			return nil, err
		}
		seen := map[string]bool{}
		var out []string
		for _, p := range present {
			id := p.ID()
			seen[id] = true
			if inUse[id] {
				delete(c.poolIdle, id)
			} else if due(id) {
				data, err := json.Marshal(p)
				if err != nil {
					return nil, err
				}
				out = append(out, string(data))
			}
		}
		for id := range c.poolIdle {
			if !seen[id] {
				delete(c.poolIdle, id) // retired, or gone otherwise: its grace starts anew
			}
		}
		return out, nil
	}
	var retire []string
	if err := c.db.View(ctx, func(tx *coorddb.Tx) (err error) {
		retire, err = idle(tx)
		return err
	}); err != nil || len(retire) == 0 {
		return err
	}
	err = c.db.Update(ctx, func(tx *coorddb.Tx) (err error) {
		if retire, err = idle(tx); err != nil || len(retire) == 0 {
			return err
		}
		return tx.AddOutbox(coorddb.OutboxRecord{Kind: coorddb.OutboxRetire, Pools: retire})
	})
	if err == nil && len(retire) > 0 {
		c.kickRelay()
	}
	return err
}

// retire carries out a retire record: each of its pools' tile consumers deleted and their
// subjects purged (queue.Queue.RetirePool).
func (c *Coordinator) retire(ctx context.Context, r coorddb.OutboxRecord) error {
	for _, raw := range r.Pools {
		var p queue.Pool
		if err := json.Unmarshal([]byte(raw), &p); err != nil || p.IsDefault() {
			c.log.Warn("dropping a retire record of a pool that is not one", "pool", raw)
			continue
		}
		err := c.queue.RetirePool(ctx, p)
		switch {
		case errors.Is(err, queue.ErrPoolBusy):
			c.log.Debug("pool not retired yet: a worker holds a tile of it", "pool", p.String())
			continue // the next look retires it
		case err != nil:
			return err
		}
		c.log.Info("pool retired: no frame wanted is dispatched there", "pool", p.String())
	}
	return nil
}

// poolsEvery is the least time between two looks for pools to retire: a frame completing or
// a job stopping asks for one (kickPools), the reconciler's period brings one anyway.
const poolsEvery = 2 * time.Second

// retireLoop looks for pools to retire at start, when kicked (kickPools) and every reconcile
// period, or more often when an idle pool's grace is shorter.
func (c *Coordinator) retireLoop(ctx context.Context) error {
	t := time.NewTicker(min(c.cfg.ReconcileEvery, max(c.cfg.RetirePoolsAfter, poolsEvery)))
	defer t.Stop()
	for {
		if err := c.retirePools(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn("looking for pools to retire", "err", err)
		}
		if !queue.Sleep(ctx, poolsEvery) {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-c.poolsKick:
		}
	}
}

// kickPools asks retireLoop to look for pools to retire.
func (c *Coordinator) kickPools() {
	select {
	case c.poolsKick <- struct{}{}:
	default:
	}
}
