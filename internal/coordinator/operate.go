package coordinator

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/wire"
)

// Operating a farm (docs/design.md, "Operating"): cancelling and reprioritizing jobs, the live
// workers and their blocklists, estimated times left and backpressure.

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
		j, err := p.tx.Job(jobID)
		if err != nil {
			return err
		}
		st, err := jobStatus(p.tx, j, p.tx.Frame)
		if err != nil {
			return err
		}
		if st.State == api.JobCompleted || st.State == api.JobFailed {
			return fmt.Errorf("%w: job %s already %s", api.ErrConflict, jobID, st.State)
		}
		mark(j)
		if err := p.tx.PutJob(j); err != nil {
			return err
		}
		for n := j.First; n <= j.Last; n++ {
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
	if err := c.queue.Dropped.Remove(ctx, e.f.Key); err != nil {
		return err
	}
	e.f.Dropped = false
	_, err := p.redispatch(e.f.Key, j, func(s coorddb.TileState) bool { return s != coorddb.TileCompleted }, coorddb.TileRequeued)
	return err
}

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
		for n := j.First; n <= j.Last; n++ {
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

// workerDirectory is the newest list of live workers, refreshed by watchWorkers.
type workerDirectory struct {
	mu      sync.Mutex
	workers []api.Worker
}

func (d *workerDirectory) set(ws []api.Worker) {
	d.mu.Lock()
	d.workers = ws
	d.mu.Unlock()
}

func (d *workerDirectory) list() []api.Worker {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.workers)
}

// blocklisting returns the live workers that blocklisted jobID.
func (d *workerDirectory) blocklisting(jobID string) []string {
	var out []string
	for _, w := range d.list() {
		if slices.Contains(w.Blocklisted, jobID) {
			out = append(out, w.Name)
		}
	}
	return out
}

// Workers lists the live workers from their heartbeats.
func (c *Coordinator) Workers(ctx context.Context) ([]api.Worker, error) {
	ws, err := c.queue.Workers.List(ctx)
	if err != nil {
		return nil, err
	}
	c.directory.set(ws)
	c.m.WorkersLive.Set(float64(len(ws)))
	return ws, nil
}

// workersEvery is how often the coordinator reads the worker directory.
const workersEvery = 2 * time.Second

// watchWorkers keeps the directory current and gives up a job once every live worker has
// blocklisted it: its tiles would bounce between workers that refuse them until their
// deliveries ran out, and the artist would learn why only from a dead letter.
func (c *Coordinator) watchWorkers(ctx context.Context) error {
	t := time.NewTicker(workersEvery)
	defer t.Stop()
	for {
		ws, err := c.Workers(ctx)
		if err != nil && ctx.Err() == nil {
			c.log.Warn("reading the worker directory", "err", err)
		}
		for _, job := range everyoneBlocklisted(ws) {
			reason := fmt.Sprintf("every live worker (%s) blocklisted this job after failing its tiles repeatedly; fix the cause (see 'status' failures) and resubmit",
				strings.Join(namesOf(ws), ", "))
			if err := c.giveUp(ctx, job, reason); err != nil && !errors.Is(err, api.ErrConflict) && !errors.Is(err, coorddb.ErrNotFound) {
				c.log.Warn("giving up a blocklisted job", "job_id", job, "err", err)
			} else if err == nil {
				c.log.Error("job failed: every live worker blocklisted it", "job_id", job)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// everyoneBlocklisted returns the jobs every one of ws has blocklisted.
func everyoneBlocklisted(ws []api.Worker) []string {
	if len(ws) == 0 {
		return nil
	}
	var out []string
	for _, job := range ws[0].Blocklisted {
		all := true
		for _, w := range ws[1:] {
			all = all && slices.Contains(w.Blocklisted, job)
		}
		if all {
			out = append(out, job)
		}
	}
	return out
}

func namesOf(ws []api.Worker) []string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = w.Name
	}
	return out
}

// rateMeter measures how fast a cumulative count grows: the slope from the oldest observation
// within a window to the newest. Observations come from periodic sampling and from status
// requests; it keeps the newest few.
type rateMeter struct {
	t []time.Time
	v []float64
}

const (
	rateKeep    = 64
	rateWindow  = time.Minute
	rateMinSpan = 3 * time.Second // a shorter span says more about noise than about speed
)

func (m *rateMeter) observe(t time.Time, v float64) {
	if n := len(m.t); n > 0 && !t.After(m.t[n-1]) {
		return
	}
	m.t, m.v = append(m.t, t), append(m.v, v)
	if len(m.t) > rateKeep {
		m.t, m.v = m.t[1:], m.v[1:]
	}
}

// rate is units per second over the window ending at the newest observation.
func (m *rateMeter) rate() (float64, bool) {
	n := len(m.t)
	if n < 2 {
		return 0, false
	}
	last := m.t[n-1]
	i := 0
	for i < n-1 && last.Sub(m.t[i]) > rateWindow {
		i++
	}
	span := last.Sub(m.t[i])
	if span < rateMinSpan {
		return 0, false
	}
	return (m.v[n-1] - m.v[i]) / span.Seconds(), true
}

// etaTracker estimates each unfinished job's time left from how fast its samples are done.
type etaTracker struct {
	mu   sync.Mutex
	jobs map[string]*rateMeter
}

func newETATracker() *etaTracker { return &etaTracker{jobs: map[string]*rateMeter{}} }

// observe records a status and fills in its ETA: the samples left over the measured samples
// per second, or nothing while that is not known (too early, or nothing moving).
func (e *etaTracker) observe(now time.Time, st *api.Status) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if st.State != api.JobQueued && st.State != api.JobRendering {
		delete(e.jobs, st.JobID)
		return
	}
	m := e.jobs[st.JobID]
	if m == nil {
		m = &rateMeter{}
		e.jobs[st.JobID] = m
	}
	m.observe(now, float64(st.SamplesDone))
	if r, ok := m.rate(); ok && r > 0 {
		eta := math.Ceil(float64(st.SamplesTotal-st.SamplesDone) / r)
		st.ETASeconds = &eta
	}
}

// tracked are the jobs being measured, for the sampler.
func (e *etaTracker) tracked() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]string, 0, len(e.jobs))
	for id := range e.jobs {
		out = append(out, id)
	}
	return out
}

// sampleETAs observes every tracked job, so its rate is measured whether or not anyone asks.
func (c *Coordinator) sampleETAs(ctx context.Context) {
	for _, id := range c.eta.tracked() {
		if _, err := c.Status(ctx, id); errors.Is(err, coorddb.ErrNotFound) {
			c.eta.observe(c.now(), &api.Status{JobID: id, State: api.JobCompleted}) // forget it
		}
	}
}

// pendingTiles counts the tiles not completed of the frames a live job waits for: neither
// dropped nor failed, and not completed. It reads only unfinished frames (coorddb.OpenFrames),
// so a submission's admission costs what is in the queue, not the farm's history.
func (c *Coordinator) pendingTiles(ctx context.Context) (int, error) {
	pending := 0
	err := c.db.View(ctx, func(tx *coorddb.Tx) error {
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
		return err
	})
	return pending, err
}

// admit refuses a submission of adding tiles that would take the pending tiles over the
// configured limit, with when to retry: the excess over the measured drain rate.
func (c *Coordinator) admit(ctx context.Context, adding int) error {
	limit := c.cfg.MaxPendingTiles
	if limit <= 0 {
		return nil
	}
	if adding > limit {
		return badInput("the job has %d tiles, more than the farm's limit of %d pending tiles: split it into smaller jobs", adding, limit)
	}
	pending, err := c.pendingTiles(ctx)
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
