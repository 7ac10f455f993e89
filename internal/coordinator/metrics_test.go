package coordinator

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/internal/wire"
)

// Submissions are counted by their answer: a new job, the same submission again, and the same
// idempotency key with another payload.
func TestSubmissionsCounted(t *testing.T) {
	h := newHarness(t, Config{})
	req := h.request(1, 1, 64, 64, 32)
	req.IdempotencyKey = "shot-1"
	first := h.submit(t, req)
	again := h.submit(t, req)
	if !first.Created || again.Created || again.Status.JobID != first.Status.JobID {
		t.Fatalf("submit twice: created %v then %v, jobs %s and %s", first.Created, again.Created, first.Status.JobID, again.Status.JobID)
	}
	other := req
	other.Last = 2
	if _, err := h.c.Submit(h.ctx, other); !errors.Is(err, api.ErrConflict) {
		t.Fatalf("same key, other payload: %v, want ErrConflict", err)
	}
	for result, want := range map[string]float64{metrics.SubmissionCreated: 1, metrics.SubmissionExisting: 1,
		metrics.SubmissionConflict: 1, metrics.SubmissionBusy: 0} {
		if got := testutil.ToFloat64(h.m.Submissions.WithLabelValues(result)); got != want {
			t.Errorf("submissions{result=%q} = %v, want %v", result, got, want)
		}
	}
}

// A dead letter is counted once however often it reaches the coordinator (the worker's
// terminal failure event, its redelivery), and a frame once when it
// completes, not again on a repeated frame.assembled.
func TestDeadLettersAndFramesCountedOnce(t *testing.T) {
	h := newHarness(t, Config{})
	res := h.submit(t, h.request(1, 3, 64, 64, 32))
	h.relay(t)
	j := h.job(t, res.Status.JobID)
	f1, f2, f3 := h.frame(t, j.FrameKey(1)), h.frame(t, j.FrameKey(2)), h.frame(t, j.FrameKey(3))

	dead := tileEvent(t, f1, 0, wire.EventTileFailed, 7, 3)
	dead.Terminal, dead.Error = true, "panic: injected"
	h.apply(t, dead)
	h.apply(t, dead) // redelivered
	if got := testutil.ToFloat64(h.m.DeadLetters.WithLabelValues(metrics.DeadLetterTile)); got != 1 {
		t.Fatalf("tile dead letters = %v, want 1", got)
	}

	h.completeTiles(t, f2.Key)
	done := wire.Event{ID: "assembled", Type: wire.EventFrameAssembled, FrameKey: f2.Key, Formats: []string{"png"}}
	h.apply(t, done)
	h.apply(t, done)
	if got := testutil.ToFloat64(h.m.FramesCompleted); got != 1 {
		t.Fatalf("frames completed = %v, want 1", got)
	}

	// Frame 3's tiles complete and its assembly is dead-lettered: counted once. A dead
	// assembly of frame 2, whose outputs are promoted, changes nothing and is not counted.
	h.completeTiles(t, f3.Key)
	failed := wire.Event{ID: "assembly-failed", Type: wire.EventFrameFailed, FrameKey: f3.Key, Formats: []string{"png"}, Terminal: true, Error: "encoding png: boom"}
	h.apply(t, failed)
	h.apply(t, failed)
	late := failed
	late.FrameKey = f2.Key
	h.apply(t, late)
	if got := testutil.ToFloat64(h.m.DeadLetters.WithLabelValues(metrics.DeadLetterAssembly)); got != 1 {
		t.Fatalf("assembly dead letters = %v, want 1", got)
	}
	if got := testutil.ToFloat64(h.m.FramesCompleted); got != 1 {
		t.Fatalf("frames completed after a failed frame = %v, want still 1", got)
	}
}

// Applied events are counted by type once their transaction commits; an event of a type no
// worker publishes adds no series.
func TestEventsAppliedCountedByType(t *testing.T) {
	h := newHarness(t, Config{})
	res := h.submit(t, h.request(1, 1, 64, 64, 32))
	h.relay(t)
	f := h.frame(t, h.job(t, res.Status.JobID).FrameKey(1))
	h.apply(t, tileEvent(t, f, 0, wire.EventTileStarted, 7, 1))
	h.apply(t, tileEvent(t, f, 0, wire.EventTileFailed, 7, 1))
	h.apply(t, tileEvent(t, f, 0, wire.EventTileStarted, 7, 2))
	h.apply(t, wire.Event{ID: "forged", Type: "tile.forged", FrameKey: f.Key})
	for typ, want := range map[string]float64{wire.EventTileStarted: 2, wire.EventTileFailed: 1, wire.EventTileCompleted: 0} {
		if got := testutil.ToFloat64(h.m.EventsApplied.WithLabelValues(typ)); got != want {
			t.Errorf("events applied{type=%q} = %v, want %v", typ, got, want)
		}
	}
	if n := testutil.CollectAndCount(h.m.EventsApplied); n != len(wire.EventTypes) {
		t.Errorf("events applied has %d series, want %d (one per event type, none for a forged one)", n, len(wire.EventTypes))
	}
}
