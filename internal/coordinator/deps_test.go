package coordinator

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/failure"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/wire"
)

// Tests of jobs that wait for jobs (docs/design.md, "Jobs that wait for jobs").

// completeFrame renders frame fk in full, as workers would: every tile promoted and
// completed, its png promoted and frame.assembled applied.
func (h *harness) completeFrame(t *testing.T, fk string) {
	t.Helper()
	h.completeTiles(t, fk)
	h.promoteFormat(t, fk, "png")
	h.apply(t, wire.Event{ID: "assembled:" + fk, Type: wire.EventFrameAssembled, FrameKey: fk, Formats: []string{"png"}})
}

// dispatched returns the frames of job jobID that have a tile record in the outbox, and
// publishes the outbox, so the next call sees only what was dispatched since.
func (h *harness) dispatched(t *testing.T, jobID string) []int {
	t.Helper()
	return h.dispatchedBy(t)[jobID]
}

// dispatchedBy returns, by job, the frames that have a tile record in the outbox, and
// publishes the outbox. Each record must dispatch every tile of a new frame at its job's
// priority.
func (h *harness) dispatchedBy(t *testing.T) map[string][]int {
	t.Helper()
	out := map[string][]int{}
	for _, r := range h.outbox(t) {
		if r.Kind != coorddb.OutboxTiles {
			continue
		}
		j := h.job(t, r.JobID)
		if !r.First || r.Tiles != nil || r.Priority != j.Priority {
			t.Errorf("outbox record %+v of job %s: want every tile of a new frame, first dispatch, at priority %d", r, r.JobID, j.Priority)
		}
		for n := range j.FrameNumbers() {
			if j.FrameKey(n) == r.FrameKey {
				out[r.JobID] = append(out[r.JobID], n)
			}
		}
	}
	h.relay(t)
	for id := range out {
		slices.Sort(out[id])
	}
	return out
}

// after is a request for frames first-last of the shot at another width than h.request's
// jobs (so its frames are its own) that waits for the jobs after and frame by frame for
// afterFrames.
func (h *harness) after(first, last int, afterFrames string, after ...string) api.SubmitRequest {
	req := h.request(first, last, 48, 16, 16)
	req.After, req.AfterFrames = after, afterFrames
	return req
}

// frameStates are the states of a status's frames, in frame order.
func frameStates(st api.Status) []api.FrameState {
	var out []api.FrameState
	for _, f := range st.Frames {
		out = append(out, f.State)
	}
	return out
}

// A submission naming a job the coordinator does not know, itself, or a job that waits for it
// is bad input, naming what is wrong, and writes nothing.
func TestSubmitAfterRefusesUnknownJobsAndCycles(t *testing.T) {
	h := newHarness(t, Config{})
	reqA := h.request(1, 2, 32, 16, 16)
	a := h.submit(t, reqA).Status.JobID
	before, err := h.st.Counts(h.ctx)
	if err != nil {
		t.Fatal(err)
	}
	refused := func(what string, req api.SubmitRequest, want ...string) {
		t.Helper()
		_, err := h.c.Submit(h.ctx, req)
		if !errors.Is(err, api.ErrBadInput) || api.ExitCode(err) != api.ExitFailed {
			t.Fatalf("%s: %v, want bad input (exit 1)", what, err)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("%s: %q does not say %q", what, err, w)
			}
		}
	}
	unknown := "job-000000000000000000000000"
	refused("after an unknown job", h.after(1, 2, "", a, unknown), unknown)
	refused("frame by frame after an unknown job", h.after(1, 2, unknown), unknown)
	refused("after no job id", h.after(1, 2, strings.Repeat("j", 100)), "is not a job id")
	if now, err := h.st.Counts(h.ctx); err != nil || !mapsEqual(now, before) {
		t.Fatalf("a refused submission wrote %v (before %v), %v", now, before, err)
	}

	// B waits for A, C for B: A naming C (or B, or itself) closes a cycle, even as a
	// resubmission of A.
	b := h.submit(t, h.after(1, 2, "", a)).Status.JobID
	reqC := h.after(3, 3, "", b)
	c := h.submit(t, reqC).Status.JobID
	cycle := reqA
	cycle.AfterFrames = c
	refused("A after C after B after A", cycle, "dependency cycle: "+a+" waits for "+c+" waits for "+b+" waits for "+a)
	cycle.AfterFrames, cycle.After = "", []string{b}
	refused("A after B after A", cycle, "dependency cycle: "+a+" waits for "+b+" waits for "+a)
	cycle.After = []string{a}
	refused("A after itself", cycle, "cannot wait for itself")
	// Naming a job that does not wait for it is no cycle: the resubmission returns the job,
	// with what it waited for from the first submission.
	reqC.After = []string{a}
	if res := h.submit(t, reqC); res.Created || res.Status.JobID != c || !slices.Equal(res.Status.After, []string{b}) {
		t.Fatalf("resubmitting C after A: %+v, want job C as first submitted, after B", res)
	}
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// Property: a job submitted after another is recorded at once but dispatches nothing until the
// other completed; the transaction that applies the other's last frame dispatches all of it,
// once, as new frames.
func TestAfterJobIsDispatchedWhenItsUpstreamCompletes(t *testing.T) {
	h := newHarness(t, Config{})
	up := h.submit(t, h.request(1, 2, 32, 16, 16)).Status.JobID
	h.relay(t)
	req := h.after(1, 2, "", up)
	req.Priority = 7
	res := h.submit(t, req)
	d := res.Status.JobID
	if !res.Created || res.Status.State != api.JobWaiting || res.Status.State.ExitCode() != api.ExitQueued ||
		res.Status.WaitingFor != "job "+up || !slices.Equal(res.Status.After, []string{up}) {
		t.Fatalf("submitted after %s: %+v, want waiting for it (exit 42)", up, res.Status)
	}
	if got := frameStates(res.Status); !slices.Equal(got, []api.FrameState{api.FrameWaiting, api.FrameWaiting}) {
		t.Fatalf("frames of the waiting job: %v", got)
	}
	if got := h.dispatched(t, d); got != nil {
		t.Fatalf("the waiting job dispatched frames %v at submit", got)
	}
	j := h.job(t, d)
	for n := range j.FrameNumbers() {
		if f := h.frame(t, j.FrameKey(n)); !f.Held || f.State != coorddb.FrameQueued {
			t.Fatalf("frame %d of the waiting job: held %v, %s; want held and queued", n, f.Held, f.State)
		}
	}

	h.completeFrame(t, h.job(t, up).FrameKey(1))
	if got := h.dispatched(t, d); got != nil {
		t.Fatalf("frames %v dispatched with one of two upstream frames done", got)
	}
	if st := h.status(t, d); st.State != api.JobWaiting || st.WaitingFor != "job "+up {
		t.Fatalf("with the upstream half done: %s, waiting for %q", st.State, st.WaitingFor)
	}
	h.completeFrame(t, h.job(t, up).FrameKey(2))
	if got := h.dispatched(t, d); !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("upstream completed: frames %v dispatched, want 1 and 2", got)
	}
	st := h.status(t, d)
	if st.State != api.JobQueued || strings.Contains(st.WaitingFor, up) || st.BlockedReason != "" {
		t.Fatalf("released job: %s, waiting for %q, blocked by %q; want queued", st.State, st.WaitingFor, st.BlockedReason)
	}
	for n := range j.FrameNumbers() {
		if f := h.frame(t, j.FrameKey(n)); f.Held {
			t.Fatalf("frame %d still held once dispatched", n)
		}
	}
	// The release happened once: the upstream's frames completing again change nothing.
	h.apply(t, wire.Event{ID: "again", Type: wire.EventFrameAssembled, FrameKey: h.job(t, up).FrameKey(2), Formats: []string{"png"}})
	if got := h.dispatched(t, d); got != nil {
		t.Fatalf("frames %v dispatched a second time", got)
	}
	// And it renders: its frames complete as any job's.
	for n := range j.FrameNumbers() {
		h.completeFrame(t, j.FrameKey(n))
	}
	if st := h.status(t, d); st.State != api.JobCompleted {
		t.Fatalf("the released job after its frames completed: %s", st.State)
	}
}

// Property: frame N of a job submitted frame by frame after another is dispatched exactly
// when frame N of the other completed, each once; a frame the other has none of waits for all
// of it.
func TestAfterFramesDispatchesFrameByFrame(t *testing.T) {
	h := newHarness(t, Config{})
	up := h.submit(t, h.request(1, 3, 32, 16, 16)).Status.JobID
	h.relay(t)
	d := h.submit(t, h.after(1, 4, up)).Status.JobID
	u := h.job(t, up)

	h.completeFrame(t, u.FrameKey(2))
	if got := h.dispatched(t, d); !slices.Equal(got, []int{2}) {
		t.Fatalf("upstream frame 2 done: frames %v dispatched, want 2", got)
	}
	st := h.status(t, d)
	w, q := api.FrameWaiting, api.FrameQueued
	if got := frameStates(st); !slices.Equal(got, []api.FrameState{w, q, w, w}) || st.State != api.JobQueued ||
		!strings.HasPrefix(st.WaitingFor, "frames 1, 3 of job "+up+", job "+up) {
		t.Fatalf("after upstream frame 2: %s, frames %v, waiting for %q", st.State, got, st.WaitingFor)
	}
	h.completeFrame(t, u.FrameKey(1))
	if got := h.dispatched(t, d); !slices.Equal(got, []int{1}) {
		t.Fatalf("upstream frame 1 done: frames %v dispatched, want 1", got)
	}
	h.completeFrame(t, u.FrameKey(3))
	if got := h.dispatched(t, d); !slices.Equal(got, []int{3, 4}) {
		t.Fatalf("upstream done: frames %v dispatched, want 3 and 4 (which it has none of)", got)
	}
	if st := h.status(t, d); st.State != api.JobQueued || strings.Contains(st.WaitingFor, up) {
		t.Fatalf("every frame released: %s, waiting for %q", st.State, st.WaitingFor)
	}
}

// deadLetterTile takes the next tile of the queue and dead-letters it for good, as a worker
// whose render failed terminally does: the DLQ copy, then the terminal tile.failed.
func (h *harness) deadLetterTile(t *testing.T) {
	t.Helper()
	m, err := h.workerSources(t).FetchTile(h.ctx, 5*time.Second)
	if err != nil || m == nil {
		t.Fatalf("fetching a tile to dead-letter: %v (message %v)", err, m)
	}
	var job wire.TileJob
	if err := json.Unmarshal(m.Data(), &job); err != nil {
		t.Fatal(err)
	}
	meta, err := m.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	if err := h.queue.DeadLetterNow(h.ctx, m, "unknown material"); err != nil {
		t.Fatalf("DeadLetterNow: %v", err)
	}
	h.apply(t, wire.Event{ID: "dead:" + job.TileKey, Type: wire.EventTileFailed, TileKey: job.TileKey, TileIndex: job.Index,
		FrameKey: job.FrameKey, Seq: meta.Sequence.Stream, Delivery: meta.NumDelivered, Terminal: true,
		Code: failure.CodeTerminal, Error: "unknown material", Attempt: "a1", Worker: "w1"})
}

// Property: a failed upstream blocks the jobs waiting for it (exit 1, saying which), a
// requeue of its dead letter puts them back to waiting, and its completion then dispatches
// them; a retry of a failed upstream does the same.
func TestUpstreamFailureBlocksAndRetryUnblocks(t *testing.T) {
	h := newHarness(t, Config{})
	up := h.submit(t, h.request(1, 1, 32, 16, 16)).Status.JobID // 2 tiles
	h.relay(t)
	d := h.submit(t, h.after(1, 1, "", up)).Status.JobID
	e := h.submit(t, h.after(2, 2, up)).Status.JobID // frame by frame: a frame the upstream lacks
	h.deadLetterTile(t)
	if st := h.status(t, up); st.State != api.JobFailed {
		t.Fatalf("upstream with a dead-lettered tile: %s", st.State)
	}
	for _, id := range []string{d, e} {
		st := h.status(t, id)
		if st.State != api.JobBlocked || st.State.ExitCode() != api.ExitFailed || st.BlockedReason != "job "+up+" failed" ||
			st.WaitingFor != "" || frameStates(st)[0] != api.FrameBlocked {
			t.Fatalf("job %s waiting for a failed job: %s (exit %d), blocked by %q, waiting for %q",
				id, st.State, st.State.ExitCode(), st.BlockedReason, st.WaitingFor)
		}
	}
	// A job submitted after a failed one is accepted, blocked.
	late := h.submit(t, h.after(3, 3, "", up)).Status
	if late.State != api.JobBlocked || late.State.ExitCode() != api.ExitFailed || late.BlockedReason != "job "+up+" failed" {
		t.Fatalf("submitted after a failed job: %s, blocked by %q", late.State, late.BlockedReason)
	}

	if err := h.c.RequeueDeadLetter(h.ctx, 1); err != nil {
		t.Fatalf("RequeueDeadLetter: %v", err)
	}
	for _, id := range []string{d, e, late.JobID} {
		if st := h.status(t, id); st.State != api.JobWaiting || st.BlockedReason != "" || st.WaitingFor != "job "+up {
			t.Fatalf("job %s after the upstream's dead letter was requeued: %s, blocked by %q, waiting for %q", id, st.State, st.BlockedReason, st.WaitingFor)
		}
	}
	if got := h.dispatched(t, d); got != nil {
		t.Fatalf("a requeue dispatched frames %v of the waiting job", got)
	}
	h.completeFrame(t, h.job(t, up).FrameKey(1))
	released := h.dispatchedBy(t)
	for _, id := range []string{d, e, late.JobID} {
		if got := released[id]; len(got) != 1 {
			t.Fatalf("upstream completed after its requeue: job %s dispatched frames %v, want its one frame", id, got)
		}
	}
}

// Property: a retry of a failed upstream (a one-shot render run again) unblocks the jobs
// waiting for it alike.
func TestUpstreamRetryUnblocks(t *testing.T) {
	h := newHarness(t, Config{})
	up2 := h.submit(t, h.request(5, 5, 32, 16, 16)).Status.JobID
	h.relay(t)
	d2 := h.submit(t, h.after(5, 5, "", up2)).Status.JobID
	h.deadLetterTile(t)
	if st := h.status(t, d2); st.State != api.JobBlocked {
		t.Fatalf("second waiting job: %s, want blocked", st.State)
	}
	if n, err := h.c.Retry(h.ctx, up2); err != nil || n != 1 {
		t.Fatalf("Retry = %d, %v", n, err)
	}
	if st := h.status(t, d2); st.State != api.JobWaiting {
		t.Fatalf("after a retry of the upstream: %s, want waiting", st.State)
	}
	h.relay(t)
	h.completeFrame(t, h.job(t, up2).FrameKey(5))
	if got := h.dispatched(t, d2); !slices.Equal(got, []int{5}) {
		t.Fatalf("retried upstream completed: frames %v dispatched, want 5", got)
	}
}

// Property: cancelling a waiting job dispatches nothing of it, ever; cancelling the job it
// waits for blocks it, saying so; a chain blocks as a whole.
func TestCancelWaitingAndCancelledUpstream(t *testing.T) {
	h := newHarness(t, Config{})
	up := h.submit(t, h.request(1, 2, 32, 16, 16)).Status.JobID
	h.relay(t)
	d := h.submit(t, h.after(1, 2, "", up)).Status.JobID
	reqE := h.after(1, 2, up)
	reqE.IdempotencyKey = "frame by frame" // the same frames as d's: another job only by its key
	e := h.submit(t, reqE).Status.JobID
	chained := h.submit(t, h.after(3, 3, "", e)).Status.JobID // waits for e

	st, err := h.c.Cancel(h.ctx, d)
	if err != nil || st.State != api.JobCancelled || st.State.ExitCode() != api.ExitFailed {
		t.Fatalf("cancelling the waiting job: %s, %v", st.State, err)
	}
	h.completeFrame(t, h.job(t, up).FrameKey(1))
	if got := h.dispatched(t, e); !slices.Equal(got, []int{1}) {
		t.Fatalf("frame by frame: frames %v dispatched, want 1", got)
	}
	if _, err := h.c.Cancel(h.ctx, up); err != nil {
		t.Fatalf("cancelling the upstream: %v", err)
	}
	st = h.status(t, e)
	if st.State != api.JobQueued || st.BlockedReason != "job "+up+" was cancelled" || frameStates(st)[1] != api.FrameBlocked {
		t.Fatalf("frame by frame after a cancelled job, frame 1 released: %s, frames %v, blocked by %q", st.State, frameStates(st), st.BlockedReason)
	}
	h.completeFrame(t, h.job(t, e).FrameKey(1))
	st = h.status(t, e)
	if st.State != api.JobBlocked || st.State.ExitCode() != api.ExitFailed || st.BlockedReason != "job "+up+" was cancelled" {
		t.Fatalf("frame by frame after a cancelled job, its released frame done: %s, blocked by %q", st.State, st.BlockedReason)
	}
	if st := h.status(t, chained); st.State != api.JobBlocked || st.BlockedReason != "job "+e+" is blocked (job "+up+" was cancelled)" {
		t.Fatalf("a job waiting for a blocked job: %s, blocked by %q", st.State, st.BlockedReason)
	}
	// A cancelled waiting job stays undispatched when what it waited for completes.
	up3 := h.submit(t, h.request(4, 4, 32, 16, 16)).Status.JobID
	h.relay(t)
	d3 := h.submit(t, h.after(4, 4, "", up3)).Status.JobID
	if _, err := h.c.Cancel(h.ctx, d3); err != nil {
		t.Fatal(err)
	}
	if f := h.frame(t, h.job(t, d3).FrameKey(4)); !f.Dropped || !f.Held {
		t.Fatalf("the cancelled waiting job's frame: dropped %v, held %v; want both", f.Dropped, f.Held)
	}
	h.completeFrame(t, h.job(t, up3).FrameKey(4))
	if got := h.dispatched(t, d3); got != nil {
		t.Fatalf("the cancelled waiting job dispatched frames %v once its upstream completed", got)
	}
	if st := h.status(t, d3); st.State != api.JobCancelled || st.WaitingFor != "" {
		t.Fatalf("the cancelled waiting job: %s, waiting for %q", st.State, st.WaitingFor)
	}
}

// Property: a held frame is dispatched by nothing but its release: not by a reprioritize of its
// job (the release then dispatches it in the new band), not by the reconciler looking for lost
// tiles; another job asking for the same frame starts it for itself, as a new frame.
func TestHeldFramesAreDispatchedOnlyWhenReleased(t *testing.T) {
	h := newHarness(t, Config{})
	if _, err := h.queue.Events.CreateOrUpdateConsumer(h.ctx, eventsConsumer); err != nil {
		t.Fatal(err)
	}
	up := h.submit(t, h.request(1, 1, 32, 16, 16)).Status.JobID // 2 tiles
	h.relay(t)
	d := h.submit(t, h.after(1, 2, "", up)).Status.JobID // 3 tiles per frame
	if _, err := h.c.Reprioritize(h.ctx, d, 50); err != nil {
		t.Fatalf("Reprioritize: %v", err)
	}
	if got := h.dispatched(t, d); got != nil {
		t.Fatalf("reprioritizing the waiting job dispatched frames %v", got)
	}
	// Every message of TILES gone (a purge; an OS crash in life): the upstream's tiles are
	// lost and dispatched again, the held frames are not.
	tiles, err := h.js.Stream(h.ctx, queue.StreamTiles)
	if err != nil {
		t.Fatal(err)
	}
	if err := tiles.Purge(h.ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := h.c.Reconcile(h.ctx); err != nil {
			t.Fatal(err)
		}
	}
	var lost int
	for _, r := range h.outbox(t) {
		if r.JobID == d {
			t.Fatalf("the reconciler dispatched a held frame: %+v", r)
		}
		lost += len(r.Tiles)
	}
	if lost != 2 {
		t.Fatalf("%d lost tiles of the upstream dispatched again, want 2", lost)
	}
	h.relay(t)

	// A job with nothing to wait for asks for frame 2: dispatched for it, as new.
	shared := h.submit(t, h.request(2, 2, 48, 16, 16)).Status.JobID
	if got := h.dispatched(t, shared); !slices.Equal(got, []int{2}) {
		t.Fatalf("a job sharing the held frame dispatched frames %v, want 2", got)
	}
	if st := h.status(t, d); st.State != api.JobWaiting {
		t.Fatalf("the waiting job once another started its frame: %s", st.State)
	}
	h.completeFrame(t, h.job(t, up).FrameKey(1))
	if got := h.dispatched(t, d); !slices.Equal(got, []int{1}) { // at its new priority: dispatched checks
		t.Fatalf("upstream completed: frames %v dispatched, want 1 (2 renders already)", got)
	}
}
