package coordinator

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
)

// Estimated times left: rateMeter measures how fast a count grows (samples done for a job's ETA,
// tile completions for the drain rate admission uses), etaTracker turns it into each job's ETA.

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
