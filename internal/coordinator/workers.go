package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
)

// The live workers: the directory read from their heartbeats, and giving up a job every one of
// them blocklisted.

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
