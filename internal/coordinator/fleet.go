package coordinator

import (
	"context"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
)

// The fleet as the monitor's workers page draws it (docs/web.md, "Workers"): each worker's
// busy slots over the last fleetWindow, one sample per heartbeat the directory's watch
// delivers, and its recent failures, from the failures the coordinator records. Display data
// in memory only, never state: the samples start again with the process, the failures are
// read once from the database's failure records and then follow the events.
const (
	fleetWindow       = 10 * time.Minute
	maxWorkerFailures = 5
)

// fleetHistory holds each worker's samples and recent failures, by worker name.
type fleetHistory struct {
	mu       sync.Mutex
	busy     map[string][]api.BusySample // oldest first
	failures map[string][]api.WorkerFailure
	seeded   bool // failures were read from the database
}

func newFleetHistory() *fleetHistory {
	return &fleetHistory{busy: map[string][]api.BusySample{}, failures: map[string][]api.WorkerFailure{}}
}

// beat records a heartbeat of w, counted from at. A beat not after the worker's last one (the
// watch's replay of what the bucket held) adds nothing.
func (h *fleetHistory) beat(w api.Worker, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.busy[w.Name]
	if n := len(s); n > 0 && !at.After(s[n-1].Time) {
		return
	}
	busy := math.Round(max(0, min(w.BusySlots, float64(w.Slots)))*100) / 100
	s = append(s, api.BusySample{Time: at.UTC(), Busy: busy})
	h.busy[w.Name] = dropBefore(s, at.Add(-fleetWindow))
}

// dropBefore drops the samples older than t.
func dropBefore(s []api.BusySample, t time.Time) []api.BusySample {
	i := 0
	for i < len(s) && s[i].Time.Before(t) {
		i++
	}
	return s[i:]
}

// workerFailure is a failure the projection recorded, by its worker.
type workerFailure struct {
	worker string
	f      api.WorkerFailure
}

// failed adds failures of workers, each worker keeping its newest maxWorkerFailures.
func (h *fleetHistory) failed(fs []workerFailure) {
	if len(fs) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, f := range fs {
		h.failures[f.worker] = newest(append(h.failures[f.worker], f.f))
	}
}

// newest sorts failures by time and keeps the newest maxWorkerFailures.
func newest(fs []api.WorkerFailure) []api.WorkerFailure {
	slices.SortStableFunc(fs, func(a, b api.WorkerFailure) int { return a.Time.Compare(b.Time) })
	return fs[max(0, len(fs)-maxWorkerFailures):]
}

// detail adds to each live worker of ws its samples of the last fleetWindow and its recent
// failures, and forgets the workers neither live nor heard of within the window: a worker
// may fail tiles before its first heartbeat (it probes its renderers first), so its failures
// are kept for the window whether it is listed yet or not.
func (h *fleetHistory) detail(ws []api.Worker, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	live := map[string]bool{}
	for i := range ws {
		w := &ws[i]
		live[w.Name] = true
		w.History = slices.Clone(dropBefore(h.busy[w.Name], now.Add(-fleetWindow)))
		w.RecentFailures = slices.Clone(h.failures[w.Name])
	}
	for name, s := range h.busy {
		if s = dropBefore(s, now.Add(-fleetWindow)); !live[name] && len(s) == 0 {
			delete(h.busy, name)
		}
	}
	for name, fs := range h.failures {
		if _, sampled := h.busy[name]; !live[name] && !sampled && (len(fs) == 0 || fs[len(fs)-1].Time.Before(now.Add(-fleetWindow))) {
			delete(h.failures, name)
		}
	}
}

// seedFleetFailures reads the recent failures of every worker from the database's failure
// records, once, and merges them with those the events added meanwhile (an event applied while
// the records were read may be in both, or in the events' alone).
func (c *Coordinator) seedFleetFailures(ctx context.Context) error {
	c.fleet.mu.Lock()
	seeded := c.fleet.seeded
	c.fleet.mu.Unlock()
	if seeded {
		return nil
	}
	byWorker := map[string][]api.WorkerFailure{}
	err := c.db.View(ctx, func(tx *coorddb.Tx) error {
		frames := map[string]*coorddb.Frame{}
		return tx.EachFailure(func(fk string, tile int, list []coorddb.Failure) error {
			f, ok := frames[fk]
			if !ok {
				f, _ = tx.Frame(fk) // a frame gone: its failures name no job
				frames[fk] = f
			}
			if f == nil {
				return nil
			}
			for _, fl := range list {
				if fl.Worker != "" {
					byWorker[fl.Worker] = newest(append(byWorker[fl.Worker], workerFailureOf(f, tile, fl)))
				}
			}
			return nil
		})
	})
	if err != nil {
		return err
	}
	c.fleet.mu.Lock()
	defer c.fleet.mu.Unlock()
	if c.fleet.seeded {
		return nil
	}
	for worker, seen := range c.fleet.failures {
		for _, f := range seen {
			if !slices.ContainsFunc(byWorker[worker], sameFailure(f)) {
				byWorker[worker] = append(byWorker[worker], f)
			}
		}
		byWorker[worker] = newest(byWorker[worker])
	}
	c.fleet.failures, c.fleet.seeded = byWorker, true
	return nil
}

// sameFailure reports whether a failure is f: the same tile's, at the same time.
func sameFailure(f api.WorkerFailure) func(api.WorkerFailure) bool {
	return func(g api.WorkerFailure) bool {
		return f.Frame == g.Frame && f.Tile == g.Tile && f.JobID == g.JobID && f.Time.Equal(g.Time)
	}
}

// workerFailureOf is failure fl of tile of frame f as the workers page shows it.
func workerFailureOf(f *coorddb.Frame, tile int, fl coorddb.Failure) api.WorkerFailure {
	job := ""
	if n := len(f.JobIDs); n > 0 {
		job = f.JobIDs[n-1]
	}
	return api.WorkerFailure{JobID: job, Frame: f.Frame, Tile: tile, Class: fl.Code, Error: fl.Error, DeadLettered: fl.DeadLettered, Time: fl.Time}
}

// WorkersDetail is Workers with each worker's busy slots over the last minutes and its recent
// failures (GET /v1/workers?detail=1).
func (c *Coordinator) WorkersDetail(ctx context.Context) ([]api.Worker, error) {
	ws, err := c.Workers(ctx)
	if err != nil {
		return nil, err
	}
	ws = slices.Clone(ws) // the directory keeps ws: its copy gets no history
	if err := c.seedFleetFailures(ctx); err != nil {
		return nil, err
	}
	c.fleet.detail(ws, c.now())
	return ws, nil
}
