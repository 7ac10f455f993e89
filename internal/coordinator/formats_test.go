package coordinator

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/tilefarm/tilefarm/internal/farm"
	"github.com/tilefarm/tilefarm/internal/store"
)

// A frame finished as PNG and then asked for as EXR by another job is assembled again for the
// new format, without rendering a tile; a frame.completed that lacks a format it owes does not
// complete it.
func TestExtraFormatOfCompletedFrameReassembles(t *testing.T) {
	h := newHarness(t, Config{})
	a := h.submit(t, smallRequest(t, 1, 1, 32, 32, 32))
	fk := h.job(t, a.Status.JobID).FrameKeys[0]
	for i, tk := range tileKeys(t, h.frame(t, fk)) {
		h.apply(t, tileEvent(fmt.Sprintf("c%d", i), farm.EventTileCompleted, h.tile(t, tk)))
	}
	h.apply(t, farm.Event{ID: "png-done", Type: farm.EventFrameCompleted, FrameKey: fk, Formats: []string{"png"}})
	if f := h.frame(t, fk); f.State != store.FrameCompleted {
		t.Fatalf("png frame: %s", f.State)
	}
	before := len(assembleRecords(t, h))

	req := smallRequest(t, 1, 1, 32, 32, 32)
	req.Formats = []string{"exr"}
	b := h.submit(t, req)
	if b.Status.JobID == a.Status.JobID || b.Status.State != StateRendering {
		t.Fatalf("exr job %s state %s, want a new job in progress", b.Status.JobID, b.Status.State)
	}
	f := h.frame(t, fk)
	if f.State != store.FrameAssembling || !slices.Equal(f.Formats, []string{"exr", "png"}) {
		t.Fatalf("shared frame after the exr request: %s %v", f.State, f.Formats)
	}
	recs := assembleRecords(t, h)
	if len(recs) != before+1 {
		t.Fatalf("%d assemble records, want %d", len(recs), before+1)
	}
	var job farm.AssembleJob
	if err := json.Unmarshal(recs[len(recs)-1].Data, &job); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(job.Formats, []string{"exr", "png"}) || recs[len(recs)-1].MsgID == "assemble:"+fk {
		t.Fatalf("re-assembly %s asks for %v", recs[len(recs)-1].MsgID, job.Formats)
	}

	// A stale png-only completion does not complete the frame: it is assembled again.
	h.apply(t, farm.Event{ID: "stale", Type: farm.EventFrameCompleted, FrameKey: fk, Formats: []string{"png"}})
	if f := h.frame(t, fk); f.State != store.FrameAssembling {
		t.Fatalf("frame completed without its exr: %s", f.State)
	}
	if n := len(assembleRecords(t, h)); n != before+2 {
		t.Fatalf("%d assemble records after a stale completion, want %d", n, before+2)
	}
	h.apply(t, farm.Event{ID: "exr-done", Type: farm.EventFrameCompleted, FrameKey: fk, Formats: []string{"exr", "png"}})
	if st := h.status(t, b.Status.JobID); st.State != StateCompleted || h.status(t, a.Status.JobID).State != StateCompleted {
		t.Fatalf("jobs after the exr assembly: %s / %s", st.State, h.status(t, a.Status.JobID).State)
	}
}

// A new job asking for a frame that failed on a dead-lettered tile retries that tile (under a
// new dedup id) and reuses the completed ones.
func TestNewJobRetriesFailedFrame(t *testing.T) {
	h := newHarness(t, Config{})
	a := h.submit(t, smallRequest(t, 1, 1, 64, 32, 32))
	fk := h.job(t, a.Status.JobID).FrameKeys[0]
	keys := tileKeys(t, h.frame(t, fk))
	h.apply(t, tileEvent("ok", farm.EventTileCompleted, h.tile(t, keys[0])))
	bad := tileEvent("bad", farm.EventTileFailed, h.tile(t, keys[1]))
	bad.Terminal, bad.Error = true, "poison"
	h.apply(t, bad)
	if st := h.status(t, a.Status.JobID); st.State != StateFailed || st.TilesFailed != 1 {
		t.Fatalf("first job: %+v", st)
	}
	before := len(h.outbox(t))

	req := smallRequest(t, 1, 1, 64, 32, 32)
	req.IdempotencyKey = "second-try"
	b := h.submit(t, req)
	if b.Status.State != StateRendering || b.Status.TilesFailed != 0 || b.Status.TilesCompleted != 1 {
		t.Fatalf("retrying job: %+v", b.Status)
	}
	recs := h.outbox(t)[before:]
	if len(recs) != 1 || recs[0].MsgID != keys[1]+":retry:"+b.Status.JobID {
		t.Fatalf("retry outbox records %+v, want one for tile %s", recs, keys[1])
	}
	if tl := h.tile(t, keys[1]); tl.State != store.TileQueued {
		t.Fatalf("retried tile is %s", tl.State)
	}
	h.apply(t, tileEvent("ok2", farm.EventTileCompleted, h.tile(t, keys[1])))
	h.apply(t, farm.Event{ID: "fc", Type: farm.EventFrameCompleted, FrameKey: fk, Formats: []string{"png"}})
	if st := h.status(t, b.Status.JobID); st.State != StateCompleted {
		t.Fatalf("retried job: %s", st.State)
	}
}

// An assembly that was dead-lettered and then requeued by an operator completes its frame.
func TestRequeuedAssemblyCompletesFailedFrame(t *testing.T) {
	h := newHarness(t, Config{})
	a := h.submit(t, smallRequest(t, 1, 1, 32, 32, 32))
	fk := h.job(t, a.Status.JobID).FrameKeys[0]
	for i, tk := range tileKeys(t, h.frame(t, fk)) {
		h.apply(t, tileEvent(fmt.Sprintf("c%d", i), farm.EventTileCompleted, h.tile(t, tk)))
	}
	h.apply(t, farm.Event{ID: "ff", Type: farm.EventFrameFailed, FrameKey: fk, Terminal: true, Error: "disk full"})
	if st := h.status(t, a.Status.JobID); st.State != StateFailed {
		t.Fatalf("job after a failed assembly: %s", st.State)
	}
	h.apply(t, farm.Event{ID: "fc", Type: farm.EventFrameCompleted, FrameKey: fk, Formats: []string{"png"}})
	if st := h.status(t, a.Status.JobID); st.State != StateCompleted {
		t.Fatalf("job after the requeued assembly: %s", st.State)
	}
}

// Retry re-queues the unfinished tiles of a job's failed frames under fresh dedup ids.
func TestRetryRequeuesFailedFrames(t *testing.T) {
	h := newHarness(t, Config{})
	a := h.submit(t, smallRequest(t, 1, 2, 64, 32, 32))
	fks := h.job(t, a.Status.JobID).FrameKeys
	keys := tileKeys(t, h.frame(t, fks[0]))
	bad := tileEvent("bad", farm.EventTileFailed, h.tile(t, keys[0]))
	bad.Terminal, bad.Error = true, "poison"
	h.apply(t, bad)
	before := len(h.outbox(t))
	n, err := h.c.Retry(h.ctx, a.Status.JobID)
	if err != nil || n != 1 {
		t.Fatalf("Retry = %d, %v; want 1 failed frame retried", n, err)
	}
	recs := h.outbox(t)[before:]
	// Only the dead-lettered tile goes out again; the other still has its message queued.
	if len(recs) != 1 || !strings.HasPrefix(recs[0].MsgID, keys[0]+":retry:") {
		t.Fatalf("retry records %+v, want one fresh message for %s", recs, keys[0])
	}
	if f := h.frame(t, fks[0]); f.State != store.FrameRendering || f.TilesFailed != 0 {
		t.Fatalf("frame after Retry: %s, %d failed", f.State, f.TilesFailed)
	}
	if n, _ := h.c.Retry(h.ctx, a.Status.JobID); n != 0 {
		t.Fatalf("second Retry retried %d frames, want 0", n)
	}
}
