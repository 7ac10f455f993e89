package coordinator

import (
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
)

// Property: the ETA is the samples left over the samples per second measured over the last
// minute; unknown until the observations span a few seconds, and gone once the job ended.
func TestETAFromMeasuredRate(t *testing.T) {
	e := newETATracker()
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	st := func(done int64, state api.JobState) *api.Status {
		return &api.Status{JobID: "j", State: state, SamplesTotal: 1000, SamplesDone: done}
	}
	s := st(0, api.JobRendering)
	e.observe(t0, s)
	if s.ETASeconds != nil {
		t.Fatalf("ETA %v from one observation", *s.ETASeconds)
	}
	s = st(10, api.JobRendering)
	e.observe(t0.Add(time.Second), s)
	if s.ETASeconds != nil {
		t.Fatalf("ETA %v from a 1 s span", *s.ETASeconds)
	}
	s = st(100, api.JobRendering) // 100 samples in 10 s: 10 a second, 900 left
	e.observe(t0.Add(10*time.Second), s)
	if s.ETASeconds == nil || *s.ETASeconds != 90 {
		t.Fatalf("ETA = %v, want 90 s", s.ETASeconds)
	}
	// Only the last minute counts: a job that sped up is estimated by its new speed.
	s = st(700, api.JobRendering) // 600 samples between 10 s and 70 s
	e.observe(t0.Add(70*time.Second), s)
	if s.ETASeconds == nil || *s.ETASeconds != 30 {
		t.Fatalf("ETA after speeding up = %v, want 30 s (600 samples in the last 60 s)", s.ETASeconds)
	}
	s = st(700, api.JobRendering) // nothing moved for a while: no rate, no ETA
	e.observe(t0.Add(200*time.Second), s)
	if s.ETASeconds != nil {
		t.Fatalf("ETA %v for a job that stopped moving", *s.ETASeconds)
	}
	e.observe(t0.Add(201*time.Second), st(1000, api.JobCompleted))
	if len(e.tracked()) != 0 {
		t.Fatalf("a finished job is still tracked: %v", e.tracked())
	}
}
