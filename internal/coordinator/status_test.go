package coordinator

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/failure"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/wire"
)

// fresh computes a job's status without the cache, as it was computed before there was one.
func (h *harness) fresh(t *testing.T, jobID string) api.Status {
	t.Helper()
	var st api.Status
	err := h.c.db.View(h.ctx, func(tx *coorddb.Tx) error {
		j, err := tx.Job(jobID)
		if err != nil {
			return err
		}
		st, err = jobStatus(tx, j, tx.Frame)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// sameStatus fails unless the status served equals the one computed without the cache, but
// for what observe adds from outside the store (the ETA, blocklisting workers).
func (h *harness) sameStatus(t *testing.T, when, jobID string) {
	t.Helper()
	served := h.status(t, jobID)
	served.ETASeconds, served.BlocklistedWorkers, served.WaitingFor = nil, nil, "" // observed, not stored
	got, err := json.Marshal(served)
	if err != nil {
		t.Fatal(err)
	}
	want, err := json.Marshal(h.fresh(t, jobID))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatalf("%s: status served\n%s\nwant, computed afresh,\n%s", when, got, want)
	}
}

// cached reports whether the status cache holds a status of job.
func (h *harness) cached(job string) bool {
	h.c.statuses.mu.Lock()
	defer h.c.statuses.mu.Unlock()
	_, ok := h.c.statuses.jobs[job]
	return ok
}

// The status cache serves what computing afresh would at every step of a job's life: a
// write to its frames is seen at once. A job with a failed frame reads tile tables and
// failures the cache's fingerprint does not cover, so it is never cached.
func TestStatusCacheServesWhatIsStored(t *testing.T) {
	h := newHarness(t, Config{})
	res, fk := h.submitFrame(t, 32, 16, 16)
	job := res.Status.JobID
	h.sameStatus(t, "submitted", job)
	h.sameStatus(t, "asked again", job)
	if !h.cached(job) {
		t.Fatal("a queued job's status was not cached")
	}
	f := h.frame(t, fk)
	h.apply(t, tileEvent(t, f, 0, wire.EventTileStarted, 1, 1))
	h.sameStatus(t, "tile 0 started", job)
	h.apply(t, tileEvent(t, f, 0, wire.EventTileCompleted, 1, 1))
	if st := h.status(t, job); st.TilesCompleted != 1 {
		t.Fatalf("after tile 0 completed the status says %d tiles completed", st.TilesCompleted)
	}
	h.sameStatus(t, "tile 0 completed", job)

	ev := tileEvent(t, f, 1, wire.EventTileFailed, 2, 1)
	ev.Terminal, ev.Code, ev.Error = true, failure.CodeTerminal, "unknown material"
	h.apply(t, ev)
	h.sameStatus(t, "tile 1 dead-lettered", job)
	if h.cached(job) {
		t.Fatal("a status with a failed frame was cached")
	}
	if n, err := h.c.Retry(h.ctx, job); err != nil || n != 1 {
		t.Fatalf("Retry = %d, %v", n, err)
	}
	h.sameStatus(t, "retried", job)
	h.completeTiles(t, fk)
	h.sameStatus(t, "every tile completed", job)
}

// BenchmarkJobStatuses measures what the event stream pays each time it looks: the status of
// every job of a farm that has rendered for a while (50 jobs of 24 frames, nothing changed
// since the last look), served from the status cache against computing each afresh, in the
// same run. Reported: cached/fresh, the fraction of the time the cache leaves.
func BenchmarkJobStatuses(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	h := buildHarness(b, ctx, Config{}, queue.DefaultConfig(), slog.New(slog.DiscardHandler))
	const jobs, frames = 50, 24
	for i := range jobs {
		if _, err := h.c.Submit(ctx, h.request(i*frames+1, (i+1)*frames, 192, 108, 64)); err != nil {
			b.Fatal(err)
		}
	}
	fresh := func() {
		err := h.c.db.View(ctx, func(tx *coorddb.Tx) error {
			all, err := tx.Jobs()
			if err != nil {
				return err
			}
			for _, j := range all {
				if _, err := jobStatus(tx, j, tx.Frame); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	cached := func() {
		if all, _, err := h.c.jobsWithFrames(ctx); err != nil || len(all) != jobs {
			b.Fatalf("%d statuses, %v", len(all), err)
		}
	}
	cached() // warm
	var tFresh, tCached time.Duration
	for b.Loop() {
		start := time.Now()
		fresh()
		tFresh += time.Since(start)
		start = time.Now()
		cached()
		tCached += time.Since(start)
	}
	b.ReportMetric(tCached.Seconds()/tFresh.Seconds(), "cached/fresh")
	b.ReportMetric(tFresh.Seconds()*1e3/float64(b.N), "fresh-ms")
	b.ReportMetric(tCached.Seconds()*1e3/float64(b.N), "cached-ms")
}
