package store_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/store"
)

// Every transition of the tile state machine, one row each: from every state, every change,
// with an order before, equal to and after the tile's.
func TestNextTileStateTable(t *testing.T) {
	cur := store.StartedOrder(10, 2) // the order the tile last recorded
	older := store.StartedOrder(10, 1)
	newer := store.FailedOrder(10, 2)
	newerMsg := store.StartedOrder(11, 1)
	q, r, f, d, c := store.TileQueued, store.TileRendering, store.TileFailedRetryable, store.TileDeadLettered, store.TileCompleted
	type row struct {
		from    store.TileState
		change  store.TileChange
		order   store.Order
		want    store.TileState
		changed bool
	}
	rows := []row{
		// started: applies only after what the tile recorded.
		{q, store.TileStarted, newer, r, true},
		{q, store.TileStarted, cur, q, false},
		{q, store.TileStarted, older, q, false},
		{r, store.TileStarted, newerMsg, r, true},
		{f, store.TileStarted, store.StartedOrder(10, 3), r, true},
		{f, store.TileStarted, older, f, false},
		{d, store.TileStarted, newerMsg, r, true},
		{d, store.TileStarted, store.StartedOrder(10, 99), d, false}, // same message: the dead letter is its last word
		{c, store.TileStarted, newerMsg, c, true},                    // the order advances; the state stays
		{c, store.TileStarted, older, c, false},
		// failed
		{q, store.TileFailed, newer, f, true},
		{r, store.TileFailed, newer, f, true},
		{r, store.TileFailed, older, r, false},
		{f, store.TileFailed, store.FailedOrder(10, 3), f, true},
		{d, store.TileFailed, store.FailedOrder(10, 50), d, false},
		{c, store.TileFailed, newerMsg, c, true},
		// dead letter
		{q, store.TileDeadLetter, store.DeadLetterOrder(10), d, true},
		{r, store.TileDeadLetter, store.DeadLetterOrder(10), d, true},
		{r, store.TileDeadLetter, store.DeadLetterOrder(9), r, false}, // an older duplicate message died
		{f, store.TileDeadLetter, store.DeadLetterOrder(10), d, true},
		{c, store.TileDeadLetter, store.DeadLetterOrder(11), c, true},
		// done: from anything, in any order; completed is final
		{q, store.TileDone, store.Order{}, c, true},
		{r, store.TileDone, store.Order{}, c, true},
		{f, store.TileDone, store.Order{}, c, true},
		{d, store.TileDone, store.Order{}, c, true},
		{c, store.TileDone, store.Order{}, c, false},
		// requeued: only a dead-lettered tile
		{q, store.TileRequeued, store.Order{}, q, false},
		{r, store.TileRequeued, store.Order{}, r, false},
		{f, store.TileRequeued, store.Order{}, f, false},
		{d, store.TileRequeued, store.Order{}, q, true},
		{c, store.TileRequeued, store.Order{}, c, false},
		// lost: back to queued with no order, unless completed or dead-lettered
		{q, store.TileLost, store.Order{}, q, true}, // the order is forgotten
		{r, store.TileLost, store.Order{}, q, true},
		{f, store.TileLost, store.Order{}, q, true},
		{d, store.TileLost, store.Order{}, d, false},
		{c, store.TileLost, store.Order{}, c, false},
	}
	for _, row := range rows {
		t.Run(fmt.Sprintf("%s+%s@%d.%d", row.from, row.change, row.order.Seq, row.order.Rank), func(t *testing.T) {
			from := cur
			if row.from == d {
				from = store.DeadLetterOrder(10)
			}
			if row.from == c && row.change == store.TileDone {
				from = store.Order{}
			}
			got, ord, changed := store.NextTileState(row.from, from, row.change, row.order)
			if got != row.want || changed != row.changed {
				t.Fatalf("NextTileState(%s, %s) = %s, changed %v; want %s, changed %v", row.from, row.change, got, changed, row.want, row.changed)
			}
			switch {
			case !changed && ord != from:
				t.Errorf("an ignored change moved the order from %+v to %+v", from, ord)
			case changed && (row.change == store.TileDone || row.change == store.TileRequeued) && ord != from:
				t.Errorf("%s moved the order from %+v to %+v; it keeps it", row.change, from, ord)
			case changed && row.change != store.TileDone && row.change != store.TileRequeued && ord != row.order:
				t.Errorf("order after %s = %+v, want %+v", row.change, ord, row.order)
			}
		})
	}
}

// After a tile's message was lost, the events of the message dispatched again apply even when
// the stream's sequence went back (it lost its unsynced tail, or was made anew).
func TestLostTileTakesEventsOfALowerSequence(t *testing.T) {
	s, o, _ := store.NextTileState(store.TileQueued, store.Order{}, store.TileStarted, store.StartedOrder(100, 1))
	s, o, _ = store.NextTileState(s, o, store.TileLost, store.Order{})
	if s != store.TileQueued || o != (store.Order{}) {
		t.Fatalf("lost tile is %s at %+v, want queued with no order", s, o)
	}
	if s2, _, changed := store.NextTileState(s, o, store.TileStarted, store.StartedOrder(96, 1)); !changed || s2 != store.TileRendering {
		t.Fatalf("the start of the new message at a lower sequence: %s, changed %v", s2, changed)
	}
	if s2, _, changed := store.NextTileState(s, o, store.TileDeadLetter, store.DeadLetterOrder(96)); !changed || s2 != store.TileDeadLettered {
		t.Fatalf("the dead letter of the new message at a lower sequence: %s, changed %v", s2, changed)
	}
}

// After a requeue, events about the dead message stay stale and the new message's apply.
func TestRequeueKeepsOldMessageStale(t *testing.T) {
	s, o, _ := store.NextTileState(store.TileRendering, store.StartedOrder(5, 3), store.TileDeadLetter, store.DeadLetterOrder(5))
	s, o, _ = store.NextTileState(s, o, store.TileRequeued, store.Order{})
	if s != store.TileQueued {
		t.Fatalf("requeued tile is %s", s)
	}
	if s2, _, changed := store.NextTileState(s, o, store.TileStarted, store.StartedOrder(5, 2)); changed {
		t.Fatalf("a late start of the dead message moved the requeued tile to %s", s2)
	}
	if s2, _, changed := store.NextTileState(s, o, store.TileStarted, store.StartedOrder(6, 1)); !changed || s2 != store.TileRendering {
		t.Fatalf("the requeued message's start: %s, changed %v", s2, changed)
	}
}

func TestOrderAfter(t *testing.T) {
	for _, c := range []struct {
		a, b store.Order
		want bool
	}{
		{store.StartedOrder(1, 2), store.StartedOrder(1, 1), true},
		{store.FailedOrder(1, 1), store.StartedOrder(1, 1), true},
		{store.StartedOrder(1, 2), store.FailedOrder(1, 1), true},
		{store.StartedOrder(1, 1), store.FailedOrder(1, 1), false},
		{store.StartedOrder(2, 1), store.DeadLetterOrder(1), true},
		{store.DeadLetterOrder(1), store.FailedOrder(1, 1<<40), true},
		{store.StartedOrder(1, 1), store.StartedOrder(1, 1), false},
	} {
		if got := c.a.After(c.b); got != c.want {
			t.Errorf("%+v.After(%+v) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

// A frame's state is derived from its counters, per job formats.
func TestFrameStateFor(t *testing.T) {
	base := func() *store.Frame {
		return &store.Frame{TilesTotal: 4, Formats: []string{"exr", "png"}}
	}
	for _, c := range []struct {
		name    string
		mod     func(f *store.Frame)
		formats []string
		want    store.FrameState
	}{
		{"new", func(f *store.Frame) {}, nil, store.FrameQueued},
		{"attempt started", func(f *store.Frame) { f.TileAttempts = 1 }, nil, store.FrameRendering},
		{"tile done without a start event", func(f *store.Frame) { f.TilesCompleted = 1 }, nil, store.FrameRendering},
		{"all tiles done", func(f *store.Frame) { f.TilesCompleted = 4 }, nil, store.FrameAssembling},
		{"dead-lettered tile", func(f *store.Frame) { f.TileAttempts, f.TilesFailed = 3, 1 }, nil, store.FrameFailed},
		{"assembly failed", func(f *store.Frame) { f.TilesCompleted, f.AssemblyError = 4, "x" }, nil, store.FrameFailed},
		{"one of two formats", func(f *store.Frame) { f.TilesCompleted, f.Done = 4, []string{"png"} }, nil, store.FrameAssembling},
		{"one of two formats, seen by the png job", func(f *store.Frame) { f.TilesCompleted, f.Done = 4, []string{"png"} }, []string{"png"}, store.FrameCompleted},
		{"both formats", func(f *store.Frame) { f.TilesCompleted, f.Done = 4, []string{"exr", "png"} }, nil, store.FrameCompleted},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := base()
			c.mod(f)
			formats := c.formats
			if formats == nil {
				formats = f.Formats
			}
			if got := f.StateFor(formats); got != c.want {
				t.Fatalf("StateFor(%v) = %s, want %s", formats, got, c.want)
			}
		})
	}
}

func TestFrameNeedsAssembly(t *testing.T) {
	f := &store.Frame{TilesTotal: 2, TilesCompleted: 1, Formats: []string{"png"}}
	if f.NeedsAssembly() {
		t.Fatal("assembly asked for with a tile missing")
	}
	f.TilesCompleted = 2
	if !f.NeedsAssembly() {
		t.Fatal("no assembly asked for once every tile is done")
	}
	f.AssemblyRequested = []string{"png"}
	if f.NeedsAssembly() {
		t.Fatal("a second assembly asked for while one is pending")
	}
	f.Formats = []string{"exr", "png"}
	if !f.NeedsAssembly() {
		t.Fatal("a new format does not ask for another assembly")
	}
	f.AssemblyRequested, f.Done = []string{"exr", "png"}, []string{"exr", "png"}
	if f.NeedsAssembly() {
		t.Fatal("assembly asked for a frame with every format done")
	}
}

func TestFrameSettleRecordsTransitionsBounded(t *testing.T) {
	f := &store.Frame{TilesTotal: 2, Formats: []string{"png"}}
	now := time.Now()
	if !f.Settle("", now) || f.State != store.FrameQueued {
		t.Fatalf("first settle: state %s, history %d", f.State, len(f.History))
	}
	if f.Settle("", now) {
		t.Fatal("settling an unchanged frame recorded a transition")
	}
	for i := range 40 {
		f.TilesFailed = i % 2
		f.TileAttempts = 1
		f.Settle("boom", now)
	}
	if len(f.History) > 16 {
		t.Fatalf("history grew to %d transitions", len(f.History))
	}
}

func TestDeriveJobState(t *testing.T) {
	c, f, r, q, a := store.FrameCompleted, store.FrameFailed, store.FrameRendering, store.FrameQueued, store.FrameAssembling
	for _, row := range []struct {
		frames []store.FrameState
		want   store.JobState
	}{
		{[]store.FrameState{q, q}, store.JobQueued},
		{[]store.FrameState{q, r}, store.JobRendering},
		{[]store.FrameState{c, a}, store.JobRendering},
		{[]store.FrameState{c, c}, store.JobCompleted},
		{[]store.FrameState{c, f}, store.JobFailed},
		{[]store.FrameState{f, r}, store.JobRendering}, // not failed before every frame settled
	} {
		if got := store.DeriveJobState(row.frames); got != row.want {
			t.Errorf("DeriveJobState(%v) = %s, want %s", row.frames, got, row.want)
		}
	}
}

// Property: a cancelled job stays cancelled whatever its frames do afterwards for other jobs,
// and a job the farm gave up on stays failed unless its frames completed after all.
func TestJobStateCancelledAndGivenUp(t *testing.T) {
	c, r, q := store.FrameCompleted, store.FrameRendering, store.FrameQueued
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for _, row := range []struct {
		name   string
		job    store.Job
		frames []store.FrameState
		want   store.JobState
	}{
		{"live", store.Job{}, []store.FrameState{q, r}, store.JobRendering},
		{"cancelled while queued", store.Job{Cancelled: at}, []store.FrameState{q, q}, store.JobCancelled},
		{"cancelled while rendering", store.Job{Cancelled: at}, []store.FrameState{c, r}, store.JobCancelled},
		{"cancelled, frames completed for another job", store.Job{Cancelled: at}, []store.FrameState{c, c}, store.JobCancelled},
		{"given up, frames completed after all", store.Job{Failed: "x"}, []store.FrameState{c, c}, store.JobCompleted},
		{"given up", store.Job{Failed: "every worker blocklisted it"}, []store.FrameState{r, q}, store.JobFailed},
		{"given up and cancelled", store.Job{Failed: "x", Cancelled: at}, []store.FrameState{r}, store.JobCancelled},
	} {
		if got := row.job.State(row.frames); got != row.want {
			t.Errorf("%s: State(%v) = %s, want %s", row.name, row.frames, got, row.want)
		}
	}
}

func TestStatesMarshalAsNames(t *testing.T) {
	raw, err := json.Marshal(struct {
		T store.TileState
		F store.FrameState
		J store.JobState
	}{store.TileDeadLettered, store.FrameAssembling, store.JobFailed})
	if err != nil {
		t.Fatal(err)
	}
	if string(raw) != `{"T":"dead_lettered","F":"assembling","J":"failed"}` {
		t.Fatalf("states marshal as %s", raw)
	}
	var back struct{ F store.FrameState }
	if err := json.Unmarshal([]byte(`{"F":"completed"}`), &back); err != nil || back.F != store.FrameCompleted {
		t.Fatalf("unmarshal = %v, %v", back.F, err)
	}
}

func TestTileTableRoundTrip(t *testing.T) {
	tt := store.NewTileTable(3)
	tt.Set(2, store.TileDeadLettered, store.DeadLetterOrder(1<<40))
	tt.Set(0, store.TileRendering, store.StartedOrder(7, 3))
	s, o := tt.Get(2)
	if s != store.TileDeadLettered || o != store.DeadLetterOrder(1<<40) {
		t.Fatalf("tile 2 = %s %+v", s, o)
	}
	if s, o := tt.Get(1); s != store.TileQueued || o != (store.Order{}) {
		t.Fatalf("untouched tile 1 = %s %+v", s, o)
	}
	if tt.Count(store.TileQueued) != 1 || tt.Len() != 3 {
		t.Fatalf("count queued %d, len %d", tt.Count(store.TileQueued), tt.Len())
	}
}
