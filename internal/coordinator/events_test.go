package coordinator

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/tilefarm/tilefarm/internal/farm"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/store"
	"github.com/tilefarm/tilefarm/tiles"
)

// eventJob submits one job of frames first-last at 64x32 in 32 px tiles (two tiles per frame)
// and returns its id and frame keys.
func eventJob(t *testing.T, h *harness, first, last int) (string, []string) {
	t.Helper()
	res := h.submit(t, smallRequest(t, first, last, 64, 32, 32))
	return res.Status.JobID, h.job(t, res.Status.JobID).FrameKeys
}

func tileEvent(id, typ string, tl *store.Tile) farm.Event {
	return farm.Event{ID: id, Type: typ, TileKey: tl.Key, FrameKey: tl.FrameKey, Attempt: "att-" + id, Worker: "w-" + id}
}

// assembleRecords returns the outbox records for assemble jobs.
func assembleRecords(t *testing.T, h *harness) []store.OutboxRecord {
	t.Helper()
	var out []store.OutboxRecord
	for _, r := range h.outbox(t) {
		if r.Subject == queue.SubjectAssemble {
			out = append(out, r)
		}
	}
	return out
}

func TestApplyTileEventsMoveStatesAndCounts(t *testing.T) {
	h := newHarness(t, Config{})
	jobID, fks := eventJob(t, h, 1, 1)
	f := h.frame(t, fks[0])
	if len(tileKeys(t, f)) != 2 {
		t.Fatalf("frame has %d tiles, want 2", len(tileKeys(t, f)))
	}
	t0 := h.tile(t, tileKeys(t, f)[0])

	changed := h.c.Changed()
	ev := tileEvent("s1", farm.EventTileStarted, t0)
	ev.SamplesRecovered = 5
	h.apply(t, ev)
	select {
	case <-changed:
	default:
		t.Error("applying an event did not signal Changed")
	}
	got := h.tile(t, t0.Key)
	if got.State != store.TileRendering || got.Attempts != 1 || got.Worker != "w-s1" || got.SamplesRecovered != 5 {
		t.Errorf("after tile.started: state %q attempts %d worker %q recovered %d", got.State, got.Attempts, got.Worker, got.SamplesRecovered)
	}
	if last := got.History[len(got.History)-1]; last.State != store.TileRendering || last.Attempt != "att-s1" || last.Worker != "w-s1" {
		t.Errorf("transition not recorded with attempt and worker: %+v", last)
	}
	if fr := h.frame(t, f.Key); fr.State != store.FrameRendering {
		t.Errorf("frame state %q after its first tile started, want rendering", fr.State)
	}
	st := h.status(t, jobID)
	if st.State != StateRendering || st.TileAttempts != 1 || st.SamplesRecovered != 5 {
		t.Errorf("job status %q attempts %d recovered %d", st.State, st.TileAttempts, st.SamplesRecovered)
	}

	// A redelivery is a new attempt with a new event id.
	h.apply(t, tileEvent("s2", farm.EventTileStarted, t0))
	if got := h.tile(t, t0.Key); got.Attempts != 2 || got.Worker != "w-s2" {
		t.Errorf("second attempt: attempts %d worker %q, want 2, w-s2", got.Attempts, got.Worker)
	}

	retry := tileEvent("r1", farm.EventTileFailed, t0)
	retry.Error = "storage unavailable"
	h.apply(t, retry)
	if got := h.tile(t, t0.Key); got.State != store.TileFailedRetryable || got.Error != "storage unavailable" {
		t.Errorf("retryable failure: state %q error %q", got.State, got.Error)
	}
	if fr := h.frame(t, f.Key); fr.State != store.FrameRendering {
		t.Errorf("retryable tile failure moved the frame to %q", fr.State)
	}

	h.apply(t, tileEvent("c1", farm.EventTileCompleted, t0))
	got = h.tile(t, t0.Key)
	if got.State != store.TileCompleted || got.Error != "" {
		t.Errorf("after tile.completed: state %q error %q", got.State, got.Error)
	}
	fr := h.frame(t, f.Key)
	if fr.TilesCompleted != 1 || fr.State != store.FrameRendering {
		t.Errorf("frame after 1 of 2 tiles: completed %d state %q", fr.TilesCompleted, fr.State)
	}
	if recs := assembleRecords(t, h); len(recs) != 0 {
		t.Errorf("assemble enqueued with a tile still missing: %v", recs)
	}
	if st := h.status(t, jobID); st.TilesCompleted != 1 || st.State != StateRendering {
		t.Errorf("job: tiles completed %d state %q", st.TilesCompleted, st.State)
	}
}

func TestApplyEventTwiceChangesNothing(t *testing.T) {
	h := newHarness(t, Config{})
	jobID, fks := eventJob(t, h, 1, 1)
	f := h.frame(t, fks[0])
	t0, t1 := h.tile(t, tileKeys(t, f)[0]), h.tile(t, tileKeys(t, f)[1])

	type snapshot struct {
		tiles  [2]*store.Tile
		frame  *store.Frame
		status Status
		outbox int
	}
	snap := func() snapshot {
		return snapshot{[2]*store.Tile{h.tile(t, t0.Key), h.tile(t, t1.Key)}, h.frame(t, f.Key), h.status(t, jobID), len(h.outbox(t))}
	}
	same := func(a, b snapshot) bool {
		ja, _ := json.Marshal(a.tiles)
		jb, _ := json.Marshal(b.tiles)
		fa, _ := json.Marshal(a.frame)
		fb, _ := json.Marshal(b.frame)
		sa, _ := json.Marshal(a.status)
		sb, _ := json.Marshal(b.status)
		return string(ja) == string(jb) && string(fa) == string(fb) && string(sa) == string(sb) && a.outbox == b.outbox
	}
	events := []farm.Event{
		tileEvent("s1", farm.EventTileStarted, t0),
		tileEvent("c0", farm.EventTileCompleted, t0),
		tileEvent("s2", farm.EventTileStarted, t1),
		tileEvent("c1", farm.EventTileCompleted, t1), // last tile: enqueues assembly
		{ID: "fc", Type: farm.EventFrameCompleted, FrameKey: f.Key, Formats: []string{"png"}},
	}
	for _, ev := range events {
		h.apply(t, ev)
		before := snap()
		h.apply(t, ev)
		if after := snap(); !same(before, after) {
			t.Errorf("re-applying %s %s changed the projection:\nbefore %+v\nafter  %+v", ev.Type, ev.ID, before, after)
		}
	}
}

func TestLastTileCompletedEnqueuesOneAssembly(t *testing.T) {
	h := newHarness(t, Config{})
	jobID, fks := eventJob(t, h, 7, 8)
	// Frame 7's tiles complete; frame 8 stays queued.
	f := h.frame(t, fks[0])
	tilesOut := len(h.outbox(t))
	for i, tk := range tileKeys(t, f) {
		h.apply(t, tileEvent(fmt.Sprintf("c%d", i), farm.EventTileCompleted, h.tile(t, tk)))
	}
	// A second worker also finishing the last tile (another attempt) must not enqueue again.
	h.apply(t, tileEvent("dup", farm.EventTileCompleted, h.tile(t, tileKeys(t, f)[1])))

	fr := h.frame(t, f.Key)
	if fr.State != store.FrameAssembling || fr.TilesCompleted != len(tileKeys(t, fr)) {
		t.Errorf("frame after its last tile: state %q completed %d/%d, want assembling", fr.State, fr.TilesCompleted, len(tileKeys(t, fr)))
	}
	recs := assembleRecords(t, h)
	if len(recs) != 1 {
		t.Fatalf("%d assemble outbox records, want exactly 1", len(recs))
	}
	if got := len(h.outbox(t)); got != tilesOut+1 {
		t.Errorf("outbox has %d records, want %d tiles + 1 assembly", got, tilesOut)
	}
	r := recs[0]
	if r.MsgID != "assemble:"+f.Key {
		t.Errorf("assemble Msg-Id %q, want %q", r.MsgID, "assemble:"+f.Key)
	}
	var job farm.AssembleJob
	if err := json.Unmarshal(r.Data, &job); err != nil {
		t.Fatalf("decoding assemble job: %v", err)
	}
	j := h.job(t, jobID)
	if job.FrameKey != f.Key || job.Frame != 7 || job.JobID != jobID || job.SceneVersion != j.SceneVersion ||
		job.Settings != j.Settings || !slices.Equal(job.Formats, []string{"png"}) {
		t.Errorf("assemble job = %+v", job)
	}
	// The assembler derives exactly the frame's recorded tiles from the job.
	derived, err := tiles.FrameTiles(job.FrameKey, job.Settings.Width, job.Settings.Height, job.TileSize)
	if err != nil {
		t.Fatal(err)
	}
	keys := tileKeys(t, f)
	if len(derived) != len(keys) {
		t.Fatalf("assemble job derives %d tiles, want %d", len(derived), len(keys))
	}
	for i, ref := range derived {
		if ref.Key != keys[i] || ref.Rect != h.tile(t, ref.Key).Rect {
			t.Errorf("assemble tile %d = %+v, want %s with its rect", i, ref, keys[i])
		}
	}
	if st := h.status(t, jobID); st.State != StateRendering || ExitCode(st.State) != 3 {
		t.Errorf("job with one frame assembling and one queued: %q (exit %d), want rendering (3)", st.State, ExitCode(st.State))
	}
}

func TestFrameCompletedCompletesFrameAndJob(t *testing.T) {
	h := newHarness(t, Config{})
	jobID, fks := eventJob(t, h, 1, 2)
	for n, fk := range fks {
		for i, tk := range tileKeys(t, h.frame(t, fk)) {
			h.apply(t, tileEvent(fmt.Sprintf("c%d-%d", n, i), farm.EventTileCompleted, h.tile(t, tk)))
		}
	}
	h.apply(t, farm.Event{ID: "fc0", Type: farm.EventFrameCompleted, FrameKey: fks[0], Formats: []string{"png"}})
	if fr := h.frame(t, fks[0]); fr.State != store.FrameCompleted || fr.Error != "" {
		t.Errorf("frame after frame.completed: %q %q", fr.State, fr.Error)
	}
	if st := h.status(t, jobID); st.State != StateRendering || st.FramesCompleted != 1 {
		t.Errorf("job with 1 of 2 frames done: %q, %d completed", st.State, st.FramesCompleted)
	}
	h.apply(t, farm.Event{ID: "fc1", Type: farm.EventFrameCompleted, FrameKey: fks[1], Formats: []string{"png"}})
	st := h.status(t, jobID)
	if st.State != "completed" || ExitCode(st.State) != 0 {
		t.Errorf("job state %q (exit %d), want completed (0)", st.State, ExitCode(st.State))
	}
	if st.FramesCompleted != 2 || st.TilesCompleted != st.TilesTotal || st.FramesFailed != 0 || len(st.Failures) != 0 {
		t.Errorf("completed job status %+v", st)
	}
	// A frame.failed for a completed frame changes nothing.
	h.apply(t, farm.Event{ID: "ff", Type: farm.EventFrameFailed, FrameKey: fks[0], Terminal: true, Error: "late"})
	if fr := h.frame(t, fks[0]); fr.State != store.FrameCompleted {
		t.Errorf("late frame.failed moved a completed frame to %q", fr.State)
	}
}

func TestTerminalTileFailureFailsFrameAndNamesTile(t *testing.T) {
	h := newHarness(t, Config{})
	jobID, fks := eventJob(t, h, 1, 1)
	f := h.frame(t, fks[0])
	bad, good := h.tile(t, tileKeys(t, f)[1]), h.tile(t, tileKeys(t, f)[0])

	ev := tileEvent("dead", farm.EventTileFailed, bad)
	ev.Terminal, ev.Error = true, "panic: poisoned triangle"
	h.apply(t, ev)
	if got := h.tile(t, bad.Key); got.State != store.TileDeadLettered || got.Error != "panic: poisoned triangle" {
		t.Errorf("tile after terminal failure: %q %q", got.State, got.Error)
	}
	fr := h.frame(t, f.Key)
	if fr.State != store.FrameFailed {
		t.Fatalf("frame state %q after a dead-lettered tile, want failed", fr.State)
	}
	rect := fmt.Sprintf("(%d,%d)-(%d,%d)", bad.Rect.X0, bad.Rect.Y0, bad.Rect.X1, bad.Rect.Y1)
	for _, want := range []string{bad.Key[:12], rect, "poisoned triangle"} {
		if !strings.Contains(fr.Error, want) {
			t.Errorf("frame error %q does not contain %q", fr.Error, want)
		}
	}
	st := h.status(t, jobID)
	if st.State != StateFailed || ExitCode(st.State) != 1 || st.FramesFailed != 1 || st.TilesFailed != 1 {
		t.Errorf("job: state %q (exit %d) frames failed %d tiles failed %d", st.State, ExitCode(st.State), st.FramesFailed, st.TilesFailed)
	}
	if len(st.Failures) != 1 || !strings.Contains(st.Failures[0], "frame 1") || !strings.Contains(st.Failures[0], bad.Key[:12]) {
		t.Errorf("failures %q should name frame 1 and the tile", st.Failures)
	}

	// The other tile finishing does not resurrect the frame or assemble half a frame.
	h.apply(t, tileEvent("ok", farm.EventTileCompleted, good))
	if fr := h.frame(t, f.Key); fr.State != store.FrameFailed {
		t.Errorf("frame state %q after the remaining tile completed, want still failed", fr.State)
	}
	if recs := assembleRecords(t, h); len(recs) != 0 {
		t.Errorf("assembly enqueued for a failed frame: %v", recs)
	}
}

// TestRequeuedDeadLetterCanCompleteFrame: DESIGN.md lets operators requeue dead letters once
// the cause is fixed. The requeued tile renders and completes; its frame must then be assembled
// instead of staying failed forever with every tile done.
func TestRequeuedDeadLetterCanCompleteFrame(t *testing.T) {
	h := newHarness(t, Config{})
	jobID, fks := eventJob(t, h, 1, 1)
	f := h.frame(t, fks[0])
	bad, good := h.tile(t, tileKeys(t, f)[0]), h.tile(t, tileKeys(t, f)[1])
	dead := tileEvent("dead-letter:17", farm.EventTileFailed, bad)
	dead.Terminal, dead.Error = true, "dead-lettered after 5 deliveries"
	h.apply(t, dead)
	h.apply(t, tileEvent("ok", farm.EventTileCompleted, good))
	if st := h.status(t, jobID); st.State != StateFailed {
		t.Fatalf("job %q before requeue, want failed", st.State)
	}
	// `coordinator dlq requeue`: the tile is delivered again, renders and completes.
	h.apply(t, tileEvent("again-start", farm.EventTileStarted, bad))
	h.apply(t, tileEvent("again-done", farm.EventTileCompleted, bad))
	fr := h.frame(t, f.Key)
	if fr.TilesCompleted != len(tileKeys(t, fr)) {
		t.Fatalf("frame has %d/%d tiles completed", fr.TilesCompleted, len(tileKeys(t, fr)))
	}
	if fr.State != store.FrameAssembling {
		t.Errorf("frame with every tile completed after a requeue is %q (%s), want assembling", fr.State, fr.Error)
	}
	if recs := assembleRecords(t, h); len(recs) != 1 {
		t.Errorf("%d assemble records after the requeued tile completed, want 1", len(recs))
	}
}

func TestFrameFailedEvent(t *testing.T) {
	h := newHarness(t, Config{})
	jobID, fks := eventJob(t, h, 1, 1)
	h.apply(t, farm.Event{ID: "soft", Type: farm.EventFrameFailed, FrameKey: fks[0], Error: "store down"})
	if fr := h.frame(t, fks[0]); fr.State != store.FrameQueued {
		t.Errorf("non-terminal frame.failed moved the frame to %q", fr.State)
	}
	h.apply(t, farm.Event{ID: "hard", Type: farm.EventFrameFailed, FrameKey: fks[0], Terminal: true, Error: "manifest conflict"})
	fr := h.frame(t, fks[0])
	if fr.State != store.FrameFailed || !strings.Contains(fr.Error, "manifest conflict") {
		t.Errorf("terminal frame.failed: %q %q", fr.State, fr.Error)
	}
	if st := h.status(t, jobID); st.State != StateFailed {
		t.Errorf("job %q, want failed", st.State)
	}
}

func TestJobStateAndExitCode(t *testing.T) {
	h := newHarness(t, Config{})
	jobID, fks := eventJob(t, h, 1, 2)
	check := func(step, state string, code int) {
		t.Helper()
		st := h.status(t, jobID)
		if st.State != state || ExitCode(st.State) != code {
			t.Errorf("%s: state %q exit %d, want %q %d", step, st.State, ExitCode(st.State), state, code)
		}
	}
	check("submitted", "queued", 42)
	f0 := h.frame(t, fks[0])
	h.apply(t, tileEvent("s", farm.EventTileStarted, h.tile(t, tileKeys(t, f0)[0])))
	check("one tile started", "rendering", 3)
	for n, fk := range fks {
		for i, tk := range tileKeys(t, h.frame(t, fk)) {
			h.apply(t, tileEvent(fmt.Sprintf("c%d%d", n, i), farm.EventTileCompleted, h.tile(t, tk)))
		}
	}
	check("all tiles, frames assembling", "rendering", 3)
	h.apply(t, farm.Event{ID: "f0", Type: farm.EventFrameCompleted, FrameKey: fks[0], Formats: []string{"png"}})
	h.apply(t, farm.Event{ID: "f1", Type: farm.EventFrameCompleted, FrameKey: fks[1], Formats: []string{"png"}})
	check("all frames", "completed", 0)

	// A second job: one frame completed, the other fails -> failed (1).
	h2 := newHarness(t, Config{})
	jobID, fks = eventJob(t, h2, 1, 2)
	h = h2
	h.apply(t, farm.Event{ID: "f0", Type: farm.EventFrameCompleted, FrameKey: fks[0], Formats: []string{"png"}})
	check("one frame completed", "rendering", 3)
	h.apply(t, farm.Event{ID: "x", Type: farm.EventFrameFailed, FrameKey: fks[1], Terminal: true, Error: "boom"})
	check("one completed, one failed", "failed", 1)

	for state, code := range map[string]int{StateQueued: 42, StateRendering: 3, StateCompleted: 0, StateFailed: 1, StateCancelled: 1, "bogus": 1} {
		if got := ExitCode(state); got != code {
			t.Errorf("ExitCode(%q) = %d, want %d", state, got, code)
		}
	}
}

func TestLateEventsForCompletedTileChangeNothing(t *testing.T) {
	h := newHarness(t, Config{})
	_, fks := eventJob(t, h, 1, 1)
	f := h.frame(t, fks[0])
	tl := h.tile(t, tileKeys(t, f)[0])
	h.apply(t, tileEvent("s1", farm.EventTileStarted, tl))
	h.apply(t, tileEvent("c1", farm.EventTileCompleted, tl))
	before := h.tile(t, tl.Key)
	frameBefore := h.frame(t, f.Key)

	late := []farm.Event{
		tileEvent("late-start", farm.EventTileStarted, tl),
		tileEvent("late-retry", farm.EventTileFailed, tl),
		tileEvent("late-complete", farm.EventTileCompleted, tl),
	}
	late[1].Error = "zombie lost its lease"
	dead := tileEvent("late-dead", farm.EventTileFailed, tl)
	dead.Terminal, dead.Error = true, "dead-lettered after 5 deliveries"
	late = append(late, dead)
	for _, ev := range late {
		h.apply(t, ev)
	}
	after := h.tile(t, tl.Key)
	if after.State != store.TileCompleted || after.Attempts != before.Attempts || after.Worker != before.Worker ||
		len(after.History) != len(before.History) || after.Error != "" {
		t.Errorf("late events changed a completed tile:\nbefore %+v\nafter  %+v", before, after)
	}
	frameAfter := h.frame(t, f.Key)
	if frameAfter.State != frameBefore.State || frameAfter.TilesCompleted != frameBefore.TilesCompleted || len(frameAfter.History) != len(frameBefore.History) {
		t.Errorf("late events changed the frame:\nbefore %+v\nafter  %+v", frameBefore, frameAfter)
	}
}

func TestEventForUnknownTileOrFrameIsIgnored(t *testing.T) {
	h := newHarness(t, Config{})
	jobID, _ := eventJob(t, h, 1, 1)
	before := h.status(t, jobID)
	h.apply(t, farm.Event{ID: "u1", Type: farm.EventTileCompleted, TileKey: "no-such-tile", FrameKey: "no-such-frame"})
	h.apply(t, farm.Event{ID: "u2", Type: farm.EventFrameCompleted, FrameKey: "no-such-frame", Formats: []string{"png"}})
	h.apply(t, farm.Event{ID: "u3", Type: "tile.exploded", TileKey: "x"})
	after := h.status(t, jobID)
	b, _ := json.Marshal(before)
	a, _ := json.Marshal(after)
	if string(a) != string(b) {
		t.Errorf("events for unknown tiles changed job status:\n%s\n%s", b, a)
	}
}
