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
	"github.com/tilefarm/tilefarm/internal/queue"
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

// watchWorkers keeps the directory current and gives up a job once every live worker of its
// pool has blocklisted it: its tiles would wait for a worker that takes them forever, and the
// artist would learn why only from a dead letter.
func (c *Coordinator) watchWorkers(ctx context.Context) error {
	t := time.NewTicker(workersEvery)
	defer t.Stop()
	for {
		ws, err := c.Workers(ctx)
		if err != nil && ctx.Err() == nil {
			c.log.Warn("reading the worker directory", "err", err)
		}
		for _, g := range everyoneBlocklisted(ws, c.poolOfJob(ctx)) {
			reason := fmt.Sprintf("every live worker of its pool (%s) blocklisted this job after failing its tiles repeatedly; fix the cause (see 'status' failures) and resubmit",
				strings.Join(g.workers, ", "))
			if err := c.giveUp(ctx, g.job, reason); err != nil && !errors.Is(err, api.ErrConflict) && !errors.Is(err, coorddb.ErrNotFound) {
				c.log.Warn("giving up a blocklisted job", "job_id", g.job, "err", err)
			} else if err == nil {
				c.log.Error("job failed: every live worker of its pool blocklisted it", "job_id", g.job)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// poolOfJob looks up a job's pool; false for a job not known (or not readable now).
func (c *Coordinator) poolOfJob(ctx context.Context) func(job string) (queue.Pool, bool) {
	return func(job string) (queue.Pool, bool) {
		var p queue.Pool
		err := c.db.View(ctx, func(tx *coorddb.Tx) error {
			j, err := tx.Job(job)
			if err == nil {
				p = jobPool(j)
			}
			return err
		})
		return p, err == nil
	}
}

// givenUp is a job every live worker of its pool blocklisted, and those workers.
type givenUp struct {
	job     string
	workers []string
}

// everyoneBlocklisted returns the jobs that every live worker of their pool (poolOf) has
// blocklisted, with those workers.
func everyoneBlocklisted(ws []api.Worker, poolOf func(job string) (queue.Pool, bool)) []givenUp {
	var jobs []string
	for _, w := range ws {
		jobs = append(jobs, w.Blocklisted...)
	}
	slices.Sort(jobs)
	var out []givenUp
	for _, job := range slices.Compact(jobs) {
		p, ok := poolOf(job)
		if !ok {
			continue
		}
		var members []string
		all := true
		for _, w := range ws {
			if p.Serves(capabilities(w)) {
				members = append(members, w.Name)
				all = all && slices.Contains(w.Blocklisted, job)
			}
		}
		if all && len(members) > 0 {
			out = append(out, givenUp{job, members})
		}
	}
	return out
}
