package coorddb_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/coorddb"
)

// Every transition of the tile state machine, one row each: from every state, every change,
// with an order before, equal to and after the tile's.
func TestNextTileStateTable(t *testing.T) {
	cur := coorddb.StartedOrder(10, 2) // the order the tile last recorded
	older := coorddb.StartedOrder(10, 1)
	newer := coorddb.FailedOrder(10, 2)
	newerMsg := coorddb.StartedOrder(11, 1)
	q, r, f, d, c := coorddb.TileQueued, coorddb.TileRendering, coorddb.TileFailedRetryable, coorddb.TileDeadLettered, coorddb.TileCompleted
	type row struct {
		from    coorddb.TileState
		change  coorddb.TileChange
		order   coorddb.Order
		want    coorddb.TileState
		changed bool
	}
	rows := []row{
		// started: applies only after what the tile recorded.
		{q, coorddb.TileStarted, newer, r, true},
		{q, coorddb.TileStarted, cur, q, false},
		{q, coorddb.TileStarted, older, q, false},
		{r, coorddb.TileStarted, newerMsg, r, true},
		{f, coorddb.TileStarted, coorddb.StartedOrder(10, 3), r, true},
		{f, coorddb.TileStarted, older, f, false},
		{d, coorddb.TileStarted, newerMsg, r, true},
		{d, coorddb.TileStarted, coorddb.StartedOrder(10, 99), d, false}, // same message: the dead letter is its last word
		{c, coorddb.TileStarted, newerMsg, c, true},                      // the order advances; the state stays
		{c, coorddb.TileStarted, older, c, false},
		// failed
		{q, coorddb.TileFailed, newer, f, true},
		{r, coorddb.TileFailed, newer, f, true},
		{r, coorddb.TileFailed, older, r, false},
		{f, coorddb.TileFailed, coorddb.FailedOrder(10, 3), f, true},
		{d, coorddb.TileFailed, coorddb.FailedOrder(10, 50), d, false},
		{c, coorddb.TileFailed, newerMsg, c, true},
		// dead letter
		{q, coorddb.TileDeadLetter, coorddb.DeadLetterOrder(10), d, true},
		{r, coorddb.TileDeadLetter, coorddb.DeadLetterOrder(10), d, true},
		{r, coorddb.TileDeadLetter, coorddb.DeadLetterOrder(9), r, false}, // an older duplicate message died
		{f, coorddb.TileDeadLetter, coorddb.DeadLetterOrder(10), d, true},
		{c, coorddb.TileDeadLetter, coorddb.DeadLetterOrder(11), c, true},
		// done: from anything, in any order; completed is final
		{q, coorddb.TileDone, coorddb.Order{}, c, true},
		{r, coorddb.TileDone, coorddb.Order{}, c, true},
		{f, coorddb.TileDone, coorddb.Order{}, c, true},
		{d, coorddb.TileDone, coorddb.Order{}, c, true},
		{c, coorddb.TileDone, coorddb.Order{}, c, false},
		// requeued: only a dead-lettered tile
		{q, coorddb.TileRequeued, coorddb.Order{}, q, false},
		{r, coorddb.TileRequeued, coorddb.Order{}, r, false},
		{f, coorddb.TileRequeued, coorddb.Order{}, f, false},
		{d, coorddb.TileRequeued, coorddb.Order{}, q, true},
		{c, coorddb.TileRequeued, coorddb.Order{}, c, false},
		// lost: back to queued with no order, unless completed or dead-lettered
		{q, coorddb.TileLost, coorddb.Order{}, q, true}, // the order is forgotten
		{r, coorddb.TileLost, coorddb.Order{}, q, true},
		{f, coorddb.TileLost, coorddb.Order{}, q, true},
		{d, coorddb.TileLost, coorddb.Order{}, d, false},
		{c, coorddb.TileLost, coorddb.Order{}, c, false},
		// moved: back to queued at the later of the two orders, unless completed
		{q, coorddb.TileMoved, coorddb.DeadLetterOrder(12), q, true},
		{r, coorddb.TileMoved, coorddb.DeadLetterOrder(12), q, true},
		{f, coorddb.TileMoved, coorddb.DeadLetterOrder(12), q, true},
		{d, coorddb.TileMoved, coorddb.DeadLetterOrder(12), q, true},
		{c, coorddb.TileMoved, coorddb.DeadLetterOrder(12), c, false},
		// unproven: only a completed tile, back to queued keeping its order
		{q, coorddb.TileUnproven, coorddb.Order{}, q, false},
		{r, coorddb.TileUnproven, coorddb.Order{}, r, false},
		{f, coorddb.TileUnproven, coorddb.Order{}, f, false},
		{d, coorddb.TileUnproven, coorddb.Order{}, d, false},
		{c, coorddb.TileUnproven, coorddb.Order{}, q, true},
	}
	for _, row := range rows {
		t.Run(fmt.Sprintf("%s+%s@%d.%d", row.from, row.change, row.order.Seq, row.order.Rank), func(t *testing.T) {
			from := cur
			if row.from == d {
				from = coorddb.DeadLetterOrder(10)
			}
			if row.from == c && row.change == coorddb.TileDone {
				from = coorddb.Order{}
			}
			got, ord, changed := coorddb.NextTileState(row.from, from, row.change, row.order)
			if got != row.want || changed != row.changed {
				t.Fatalf("NextTileState(%s, %s) = %s, changed %v; want %s, changed %v", row.from, row.change, got, changed, row.want, row.changed)
			}
			switch {
			case !changed && ord != from:
				t.Errorf("an ignored change moved the order from %+v to %+v", from, ord)
			case changed && keepsOrder(row.change) && ord != from:
				t.Errorf("%s moved the order from %+v to %+v; it keeps it", row.change, from, ord)
			case changed && !keepsOrder(row.change) && ord != row.order:
				t.Errorf("order after %s = %+v, want %+v", row.change, ord, row.order)
			}
		})
	}
}

// keepsOrder reports whether a change keeps the order the tile recorded.
func keepsOrder(ch coorddb.TileChange) bool {
	return ch == coorddb.TileDone || ch == coorddb.TileRequeued || ch == coorddb.TileUnproven
}

// After a tile's message was lost, the events of the message dispatched again apply even when
// the stream's sequence went back (it lost its unsynced tail, or was made anew).
func TestLostTileTakesEventsOfALowerSequence(t *testing.T) {
	s, o, _ := coorddb.NextTileState(coorddb.TileQueued, coorddb.Order{}, coorddb.TileStarted, coorddb.StartedOrder(100, 1))
	s, o, _ = coorddb.NextTileState(s, o, coorddb.TileLost, coorddb.Order{})
	if s != coorddb.TileQueued || o != (coorddb.Order{}) {
		t.Fatalf("lost tile is %s at %+v, want queued with no order", s, o)
	}
	if s2, _, changed := coorddb.NextTileState(s, o, coorddb.TileStarted, coorddb.StartedOrder(96, 1)); !changed || s2 != coorddb.TileRendering {
		t.Fatalf("the start of the new message at a lower sequence: %s, changed %v", s2, changed)
	}
	if s2, _, changed := coorddb.NextTileState(s, o, coorddb.TileDeadLetter, coorddb.DeadLetterOrder(96)); !changed || s2 != coorddb.TileDeadLettered {
		t.Fatalf("the dead letter of the new message at a lower sequence: %s, changed %v", s2, changed)
	}
}

// After a requeue, events about the dead message stay stale and the new message's apply.
func TestRequeueKeepsOldMessageStale(t *testing.T) {
	s, o, _ := coorddb.NextTileState(coorddb.TileRendering, coorddb.StartedOrder(5, 3), coorddb.TileDeadLetter, coorddb.DeadLetterOrder(5))
	s, o, _ = coorddb.NextTileState(s, o, coorddb.TileRequeued, coorddb.Order{})
	if s != coorddb.TileQueued {
		t.Fatalf("requeued tile is %s", s)
	}
	if s2, _, changed := coorddb.NextTileState(s, o, coorddb.TileStarted, coorddb.StartedOrder(5, 2)); changed {
		t.Fatalf("a late start of the dead message moved the requeued tile to %s", s2)
	}
	if s2, _, changed := coorddb.NextTileState(s, o, coorddb.TileStarted, coorddb.StartedOrder(6, 1)); !changed || s2 != coorddb.TileRendering {
		t.Fatalf("the requeued message's start: %s, changed %v", s2, changed)
	}
}

func TestOrderAfter(t *testing.T) {
	for _, c := range []struct {
		a, b coorddb.Order
		want bool
	}{
		{coorddb.StartedOrder(1, 2), coorddb.StartedOrder(1, 1), true},
		{coorddb.FailedOrder(1, 1), coorddb.StartedOrder(1, 1), true},
		{coorddb.StartedOrder(1, 2), coorddb.FailedOrder(1, 1), true},
		{coorddb.StartedOrder(1, 1), coorddb.FailedOrder(1, 1), false},
		{coorddb.StartedOrder(2, 1), coorddb.DeadLetterOrder(1), true},
		{coorddb.DeadLetterOrder(1), coorddb.FailedOrder(1, 1<<40), true},
		{coorddb.StartedOrder(1, 1), coorddb.StartedOrder(1, 1), false},
	} {
		if got := c.a.After(c.b); got != c.want {
			t.Errorf("%+v.After(%+v) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

// A frame's state is derived from its counters, per job formats.
func TestFrameStateFor(t *testing.T) {
	base := func() *coorddb.Frame {
		return &coorddb.Frame{TilesTotal: 4, Formats: []string{"exr", "png"}}
	}
	for _, c := range []struct {
		name    string
		mod     func(f *coorddb.Frame)
		formats []string
		want    coorddb.FrameState
	}{
		{"new", func(f *coorddb.Frame) {}, nil, coorddb.FrameQueued},
		{"attempt started", func(f *coorddb.Frame) { f.TileAttempts = 1 }, nil, coorddb.FrameRendering},
		{"tile done without a start event", func(f *coorddb.Frame) { f.TilesCompleted = 1 }, nil, coorddb.FrameRendering},
		{"all tiles done", func(f *coorddb.Frame) { f.TilesCompleted = 4 }, nil, coorddb.FrameAssembling},
		{"dead-lettered tile", func(f *coorddb.Frame) { f.TileAttempts, f.TilesFailed = 3, 1 }, nil, coorddb.FrameFailed},
		{"assembly failed", func(f *coorddb.Frame) { f.TilesCompleted, f.AssemblyError = 4, "x" }, nil, coorddb.FrameFailed},
		{"one of two formats", func(f *coorddb.Frame) { f.TilesCompleted, f.Done = 4, []string{"png"} }, nil, coorddb.FrameAssembling},
		{"one of two formats, seen by the png job", func(f *coorddb.Frame) { f.TilesCompleted, f.Done = 4, []string{"png"} }, []string{"png"}, coorddb.FrameCompleted},
		{"both formats", func(f *coorddb.Frame) { f.TilesCompleted, f.Done = 4, []string{"exr", "png"} }, nil, coorddb.FrameCompleted},
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
	f := &coorddb.Frame{TilesTotal: 2, TilesCompleted: 1, Formats: []string{"png"}}
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
	f := &coorddb.Frame{TilesTotal: 2, Formats: []string{"png"}}
	now := time.Now()
	if !f.Settle("", now) || f.State != coorddb.FrameQueued {
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
	c, f, r, q, a := coorddb.FrameCompleted, coorddb.FrameFailed, coorddb.FrameRendering, coorddb.FrameQueued, coorddb.FrameAssembling
	w, b := coorddb.FrameWaiting, coorddb.FrameBlocked
	for _, row := range []struct {
		frames []coorddb.FrameState
		want   coorddb.JobState
	}{
		{[]coorddb.FrameState{q, q}, coorddb.JobQueued},
		{[]coorddb.FrameState{q, r}, coorddb.JobRendering},
		{[]coorddb.FrameState{c, a}, coorddb.JobRendering},
		{[]coorddb.FrameState{c, c}, coorddb.JobCompleted},
		{[]coorddb.FrameState{c, f}, coorddb.JobFailed},
		{[]coorddb.FrameState{f, r}, coorddb.JobRendering}, // not failed before every frame settled
		// A job that waits for other jobs (docs/design.md, "Jobs that wait for jobs").
		{[]coorddb.FrameState{w, w}, coorddb.JobWaiting},
		{[]coorddb.FrameState{c, w}, coorddb.JobWaiting},   // a frame another job rendered: still waiting for the rest
		{[]coorddb.FrameState{f, w}, coorddb.JobWaiting},   // not failed before every frame settled
		{[]coorddb.FrameState{q, w}, coorddb.JobQueued},    // a frame released, not started
		{[]coorddb.FrameState{r, w}, coorddb.JobRendering}, // a frame released and rendering
		{[]coorddb.FrameState{b, b}, coorddb.JobBlocked},
		{[]coorddb.FrameState{c, b}, coorddb.JobBlocked},
		{[]coorddb.FrameState{b, w}, coorddb.JobWaiting},   // blocked only once nothing else may still come
		{[]coorddb.FrameState{b, r}, coorddb.JobRendering}, // its released frames render on
		{[]coorddb.FrameState{b, q}, coorddb.JobQueued},
		{[]coorddb.FrameState{f, b}, coorddb.JobFailed}, // its own failure first
		{[]coorddb.FrameState{c, c, b}, coorddb.JobBlocked},
	} {
		if got := coorddb.DeriveJobState(row.frames); got != row.want {
			t.Errorf("DeriveJobState(%v) = %s, want %s", row.frames, got, row.want)
		}
	}
}

// Property: a cancelled job stays cancelled whatever its frames do afterwards for other jobs,
// and a job the farm gave up on stays failed unless its frames completed after all.
func TestJobStateCancelledAndGivenUp(t *testing.T) {
	c, r, q := coorddb.FrameCompleted, coorddb.FrameRendering, coorddb.FrameQueued
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for _, row := range []struct {
		name   string
		job    coorddb.Job
		frames []coorddb.FrameState
		want   coorddb.JobState
	}{
		{"live", coorddb.Job{}, []coorddb.FrameState{q, r}, coorddb.JobRendering},
		{"cancelled while queued", coorddb.Job{Cancelled: at}, []coorddb.FrameState{q, q}, coorddb.JobCancelled},
		{"cancelled while rendering", coorddb.Job{Cancelled: at}, []coorddb.FrameState{c, r}, coorddb.JobCancelled},
		{"cancelled, frames completed for another job", coorddb.Job{Cancelled: at}, []coorddb.FrameState{c, c}, coorddb.JobCancelled},
		{"given up, frames completed after all", coorddb.Job{Failed: "x"}, []coorddb.FrameState{c, c}, coorddb.JobCompleted},
		{"given up", coorddb.Job{Failed: "every worker blocklisted it"}, []coorddb.FrameState{r, q}, coorddb.JobFailed},
		{"given up and cancelled", coorddb.Job{Failed: "x", Cancelled: at}, []coorddb.FrameState{r}, coorddb.JobCancelled},
		{"cancelled while waiting", coorddb.Job{Cancelled: at}, []coorddb.FrameState{coorddb.FrameWaiting}, coorddb.JobCancelled},
		{"cancelled while blocked", coorddb.Job{Cancelled: at}, []coorddb.FrameState{coorddb.FrameBlocked}, coorddb.JobCancelled},
		{"given up while waiting", coorddb.Job{Failed: "x"}, []coorddb.FrameState{coorddb.FrameWaiting}, coorddb.JobFailed},
	} {
		if got := row.job.State(row.frames); got != row.want {
			t.Errorf("%s: State(%v) = %s, want %s", row.name, row.frames, got, row.want)
		}
	}
}

// Every dependency transition, one row each: what waiting for a whole job in each state, or
// for one frame in each state, means; how two dependencies combine; and how a frame of a job
// that waits shows.
func TestDependencyStateTable(t *testing.T) {
	sat, wait, blk := coorddb.DepSatisfied, coorddb.DepWaiting, coorddb.DepBlocked
	for _, row := range []struct {
		job  coorddb.JobState
		want coorddb.DepState
	}{
		{coorddb.JobQueued, wait},
		{coorddb.JobRendering, wait},
		{coorddb.JobWaiting, wait},
		{coorddb.JobCompleted, sat},
		{coorddb.JobFailed, blk},    // until it is retried
		{coorddb.JobCancelled, blk}, // for good: cancel the job that waits, or submit it after another
		{coorddb.JobBlocked, blk},   // a chain blocks as a whole
	} {
		if got := coorddb.DepOnJob(row.job); got != row.want {
			t.Errorf("DepOnJob(%s) = %s, want %s", row.job, got, row.want)
		}
	}
	for _, row := range []struct {
		frame coorddb.FrameState
		want  coorddb.DepState
	}{
		{coorddb.FrameQueued, wait},
		{coorddb.FrameRendering, wait},
		{coorddb.FrameAssembling, wait},
		{coorddb.FrameWaiting, wait},
		{coorddb.FrameCompleted, sat},
		{coorddb.FrameFailed, blk},
		{coorddb.FrameBlocked, blk},
	} {
		if got := coorddb.DepOnFrame(row.frame); got != row.want {
			t.Errorf("DepOnFrame(%s) = %s, want %s", row.frame, got, row.want)
		}
	}
	for _, row := range []struct{ a, b, want coorddb.DepState }{
		{sat, sat, sat}, {sat, wait, wait}, {wait, sat, wait}, {wait, wait, wait},
		{sat, blk, blk}, {blk, wait, blk}, {wait, blk, blk}, {blk, blk, blk},
	} {
		if got := row.a.And(row.b); got != row.want {
			t.Errorf("%s.And(%s) = %s, want %s", row.a, row.b, got, row.want)
		}
	}
	for _, row := range []struct {
		frame coorddb.FrameState
		dep   coorddb.DepState
		want  coorddb.FrameState
	}{
		{coorddb.FrameQueued, sat, coorddb.FrameQueued},
		{coorddb.FrameRendering, sat, coorddb.FrameRendering},
		{coorddb.FrameFailed, sat, coorddb.FrameFailed},
		{coorddb.FrameQueued, wait, coorddb.FrameWaiting},
		{coorddb.FrameRendering, wait, coorddb.FrameWaiting}, // shared, rendering for another job: this one still waits
		{coorddb.FrameFailed, wait, coorddb.FrameWaiting},    // retried when the job may start it
		{coorddb.FrameQueued, blk, coorddb.FrameBlocked},
		{coorddb.FrameAssembling, blk, coorddb.FrameBlocked},
		{coorddb.FrameCompleted, wait, coorddb.FrameCompleted}, // another job rendered it: done
		{coorddb.FrameCompleted, blk, coorddb.FrameCompleted},
	} {
		if got := row.frame.Behind(row.dep); got != row.want {
			t.Errorf("%s.Behind(%s) = %s, want %s", row.frame, row.dep, got, row.want)
		}
	}
}

func TestStatesMarshalAsNames(t *testing.T) {
	raw, err := json.Marshal(struct {
		T coorddb.TileState
		F coorddb.FrameState
		J coorddb.JobState
		W coorddb.FrameState
		B coorddb.JobState
	}{coorddb.TileDeadLettered, coorddb.FrameAssembling, coorddb.JobFailed, coorddb.FrameWaiting, coorddb.JobBlocked})
	if err != nil {
		t.Fatal(err)
	}
	if string(raw) != `{"T":"dead_lettered","F":"assembling","J":"failed","W":"waiting","B":"blocked"}` {
		t.Fatalf("states marshal as %s", raw)
	}
	var back struct{ F coorddb.FrameState }
	if err := json.Unmarshal([]byte(`{"F":"completed"}`), &back); err != nil || back.F != coorddb.FrameCompleted {
		t.Fatalf("unmarshal = %v, %v", back.F, err)
	}
}

func TestTileTableRoundTrip(t *testing.T) {
	tt := coorddb.NewTileTable(3)
	tt.Set(2, coorddb.TileDeadLettered, coorddb.DeadLetterOrder(1<<40))
	tt.Set(0, coorddb.TileRendering, coorddb.StartedOrder(7, 3))
	s, o := tt.Get(2)
	if s != coorddb.TileDeadLettered || o != coorddb.DeadLetterOrder(1<<40) {
		t.Fatalf("tile 2 = %s %+v", s, o)
	}
	if s, o := tt.Get(1); s != coorddb.TileQueued || o != (coorddb.Order{}) {
		t.Fatalf("untouched tile 1 = %s %+v", s, o)
	}
	if tt.Count(coorddb.TileQueued) != 1 || tt.Len() != 3 {
		t.Fatalf("count queued %d, len %d", tt.Count(coorddb.TileQueued), tt.Len())
	}
}

// Property: a job's preview frames are First, First+Preview, ... and Last, among its own frames
// (its frame step kept), dispatched before the rest, each frame once.
func TestJobPreviewFramesAndDispatchOrder(t *testing.T) {
	for _, c := range []struct {
		first, last, step, preview int
		want                       []int
	}{
		{1, 24, 0, 8, []int{1, 9, 17, 24}},
		{1, 24, 0, 0, nil},
		{1, 23, 2, 4, []int{1, 5, 9, 13, 17, 21, 23}},
		{5, 5, 0, 3, []int{5}},
	} {
		j := &coorddb.Job{First: c.first, Last: c.last, Step: c.step, Preview: c.preview}
		if got := j.PreviewFrames(); !slices.Equal(got, c.want) {
			t.Errorf("%+v: preview frames %v, want %v", c, got, c.want)
		}
		order := slices.Collect(j.DispatchOrder())
		all := slices.Collect(j.FrameNumbers())
		if !slices.Equal(order[:len(c.want)], c.want) || len(order) != len(all) {
			t.Errorf("%+v: dispatch order %v: want the preview first, then the rest", c, order)
		}
		slices.Sort(order)
		if !slices.Equal(order, all) {
			t.Errorf("%+v: dispatch order holds %v, want each of %v once", c, order, all)
		}
	}
}

// Property: once a tile has moved to a new copy (reprioritize, revive), every event of a copy
// published before the move is stale, its dead letter included, and the new copy's are news.
func TestMovedTileIgnoresItsOldCopies(t *testing.T) {
	s, o, _ := coorddb.NextTileState(coorddb.TileQueued, coorddb.Order{}, coorddb.TileStarted, coorddb.StartedOrder(10, 1))
	s, o, _ = coorddb.NextTileState(s, o, coorddb.TileMoved, coorddb.DeadLetterOrder(12)) // the stream held up to 12
	if s != coorddb.TileQueued || o != coorddb.DeadLetterOrder(12) {
		t.Fatalf("moved tile is %s at %+v, want queued at the move's order", s, o)
	}
	for _, old := range []struct {
		ch  coorddb.TileChange
		ord coorddb.Order
	}{{coorddb.TileDeadLetter, coorddb.DeadLetterOrder(10)}, {coorddb.TileStarted, coorddb.StartedOrder(10, 20)}, {coorddb.TileFailed, coorddb.FailedOrder(12, 3)}} {
		if s2, _, changed := coorddb.NextTileState(s, o, old.ch, old.ord); changed || s2 != coorddb.TileQueued {
			t.Fatalf("%s of an old copy at %+v moved the tile to %s", old.ch, old.ord, s2)
		}
	}
	if s2, _, changed := coorddb.NextTileState(s, o, coorddb.TileStarted, coorddb.StartedOrder(13, 1)); !changed || s2 != coorddb.TileRendering {
		t.Fatalf("the new copy's start: %s, changed %v", s2, changed)
	}
	// A move never takes a tile's order back.
	if _, o2, _ := coorddb.NextTileState(coorddb.TileRendering, coorddb.StartedOrder(20, 1), coorddb.TileMoved, coorddb.DeadLetterOrder(12)); o2 != coorddb.StartedOrder(20, 1) {
		t.Fatalf("a move took the order back to %+v", o2)
	}
}

// Every transition of the movie state machine, one row each: from every state, every change.
func TestNextMovieStateTable(t *testing.T) {
	n, p, r, f := coorddb.MovieNone, coorddb.MoviePending, coorddb.MovieReady, coorddb.MovieFailed
	rows := []struct {
		from    coorddb.MovieState
		change  coorddb.MovieChange
		want    coorddb.MovieState
		changed bool
	}{
		// requested: asked for once, when the job completes.
		{n, coorddb.MovieRequested, p, true},
		{p, coorddb.MovieRequested, p, false},
		{r, coorddb.MovieRequested, r, false},
		{f, coorddb.MovieRequested, f, false}, // a failed movie waits for its requeue
		// done: its manifest was found; final.
		{n, coorddb.MovieDone, r, true},
		{p, coorddb.MovieDone, r, true},
		{r, coorddb.MovieDone, r, false},
		{f, coorddb.MovieDone, r, true}, // promoted after all: nothing promoted is failed
		// dead letter: fails only a pending movie.
		{n, coorddb.MovieDeadLetter, n, false},
		{p, coorddb.MovieDeadLetter, f, true},
		{r, coorddb.MovieDeadLetter, r, false},
		{f, coorddb.MovieDeadLetter, f, false},
		// requeued: a failed movie is pending again.
		{n, coorddb.MovieRequeued, n, false},
		{p, coorddb.MovieRequeued, p, false},
		{r, coorddb.MovieRequeued, r, false},
		{f, coorddb.MovieRequeued, p, true},
	}
	for _, row := range rows {
		got, changed := coorddb.NextMovieState(row.from, row.change)
		if got != row.want || changed != row.changed {
			t.Errorf("%s + change %d = %s (changed %v), want %s (changed %v)", row.from, row.change, got, changed, row.want, row.changed)
		}
	}
}

// A job's movie state reads as its name in the job record, and a job of an older coordinator,
// which has none, reads as none.
func TestMovieStateInTheJobRecord(t *testing.T) {
	j := coorddb.Job{ID: "job-1", Movie: coorddb.MovieFailed, MovieError: "no ffmpeg"}
	raw, err := json.Marshal(j)
	if err != nil {
		t.Fatal(err)
	}
	var back coorddb.Job
	if err := json.Unmarshal(raw, &back); err != nil || back.Movie != coorddb.MovieFailed || back.MovieError != "no ffmpeg" {
		t.Fatalf("job %s read back as %+v (%v)", raw, back, err)
	}
	var old coorddb.Job
	if err := json.Unmarshal([]byte(`{"id":"job-2"}`), &old); err != nil || old.Movie != coorddb.MovieNone || old.NoMovie {
		t.Fatalf("a job without a movie field read as %+v (%v)", old, err)
	}
	if err := json.Unmarshal([]byte(`{"movie":"exploded"}`), &old); err == nil {
		t.Fatal("an unknown movie state was accepted")
	}
}
