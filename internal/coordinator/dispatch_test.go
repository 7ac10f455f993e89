package coordinator

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/wire"
)

// fetchAll takes, without acking, every tile a worker with src can pull within wait, by tile
// message id: a pool's slot limit (MaxAckPending) holds back the rest.
func fetchAll(t *testing.T, h *harness, src *queue.Sources, wait time.Duration) map[string]bool {
	t.Helper()
	got := map[string]bool{}
	for {
		m, err := src.FetchTile(h.ctx, wait)
		if err != nil {
			t.Fatal(err)
		}
		if m == nil {
			return got
		}
		got[queue.MsgID(m.Headers())] = true
	}
}

// Property: a shared frame's tiles are on a subject every job that still wants the frame
// reaches, under the loosest limit among those jobs (docs/design.md, "Dispatch"). Job A, which
// requires a tag (or holds at most one slot), makes a frame; job B, with neither, shares it: a
// worker B's pool holds takes every tile of the frame, at once, before and after A is
// cancelled.
func TestSharedFrameIsDispatchedWhereEveryJobReachesIt(t *testing.T) {
	for _, c := range []struct {
		name  string
		limit func(*api.SubmitRequest)
	}{
		{"requires", func(r *api.SubmitRequest) { r.Requires = []string{"gpu"} }},
		{"max slots", func(r *api.SubmitRequest) { r.MaxSlots = 1 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, Config{})
			reqA := h.request(1, 1, 32, 16, 16) // two tiles
			c.limit(&reqA)
			a := h.submit(t, reqA)
			h.relay(t)
			reqB := h.request(1, 1, 32, 16, 16)
			reqB.IdempotencyKey = "job b, sharing a's frame"
			b := h.submit(t, reqB)
			if b.Status.JobID == a.Status.JobID {
				t.Fatal("the second submission returned the first job")
			}
			h.relay(t)
			if _, err := h.c.Cancel(h.ctx, a.Status.JobID); err != nil {
				t.Fatal(err)
			}
			h.relay(t)
			fk := h.job(t, b.Status.JobID).FrameKey(1)
			if f := h.frame(t, fk); f.Dropped || len(f.JobIDs) != 2 {
				t.Fatalf("the shared frame after A's cancel: dropped %v, jobs %v", f.Dropped, f.JobIDs)
			}
			got := fetchAll(t, h, h.workerSources(t), 500*time.Millisecond)
			want := frameTiles(t, h.frame(t, fk))
			for _, ft := range want {
				found := false
				for id := range got {
					found = found || id == ft.Key || len(id) > len(ft.Key) && id[:len(ft.Key)] == ft.Key
				}
				if !found {
					t.Fatalf("a worker of job B's pool never sees tile %.12s of the shared frame (it took %d messages)", ft.Key, len(got))
				}
			}
			if st := h.status(t, b.Status.JobID); st.State != api.JobQueued {
				t.Fatalf("job B is %s", st.State)
			}
		})
	}
}

// Property: flush makes no NATS request (docs/design.md, "Flows": Cancel). A job asking for a
// dropped frame revives it through the outbox: the transaction that revives it changes no mark
// in the dropped bucket, so one rolled back leaves the mark as it was, and the relay, after the
// commit, tells the workers before it dispatches the new copies.
func TestReviveLeavesThroughTheOutbox(t *testing.T) {
	h := newHarness(t, Config{})
	a := h.submit(t, h.request(1, 1, 32, 16, 16))
	h.relay(t)
	if _, err := h.c.Cancel(h.ctx, a.Status.JobID); err != nil {
		t.Fatal(err)
	}
	fk := h.job(t, a.Status.JobID).FrameKey(1)
	if m, err := h.queue.Dropped.Mark(h.ctx, fk); err != nil || !m.Dropped {
		t.Fatalf("the cancelled job's frame: mark %v, %v", m, err)
	}
	reqB := h.request(1, 1, 32, 16, 16)
	reqB.IdempotencyKey = "job b, reviving a's frame"
	rolledBack := errors.New("rolled back")
	err := h.c.db.Update(h.ctx, func(tx *coorddb.Tx) error {
		p := h.c.newProjection(h.ctx, tx)
		j := h.job(t, a.Status.JobID)
		j.ID, j.Cancelled = "job-b", time.Time{}
		p.addJob(j)
		if err := h.c.shareFrame(p, fk, j, true); err != nil {
			return err
		}
		if _, err := p.flush(); err != nil {
			return err
		}
		return rolledBack
	})
	if !errors.Is(err, rolledBack) {
		t.Fatalf("the revive's transaction: %v", err)
	}
	if m, err := h.queue.Dropped.Mark(h.ctx, fk); err != nil || !m.Dropped {
		t.Fatalf("a revive rolled back changed the frame's mark to %v (%v)", m, err)
	}
	b := h.submit(t, reqB)
	if m, err := h.queue.Dropped.Mark(h.ctx, fk); err != nil || !m.Dropped {
		t.Fatalf("the revive's transaction changed the mark to %v (%v) before its commit was relayed", m, err)
	}
	if k := h.outboxKinds(t); k[coorddb.OutboxMove] != 1 {
		t.Fatalf("outbox after the revive: %v, want one move", k)
	}
	last, err := h.queue.LastSeq(h.ctx)
	if err != nil {
		t.Fatal(err)
	}
	h.relay(t)
	if m, err := h.queue.Dropped.Mark(h.ctx, fk); err != nil || m.Dropped {
		t.Fatalf("the revived frame is still marked dropped after the relay (%v)", err)
	}
	if next, err := h.queue.LastSeq(h.ctx); err != nil || next != last+2 {
		t.Fatalf("TILES went from %d to %d (%v), want the frame's two tiles again", last, next, err)
	}
	if st := h.status(t, b.Status.JobID); st.State != api.JobQueued || st.TilesTotal != 2 {
		t.Fatalf("job B: %s, %d tiles", st.State, st.TilesTotal)
	}
}

// finishSlotJob submits frame n alone as a one-tile job of slots --max-slots (its own pool),
// dispatches it and completes it: tile done, PNG promoted, frame assembled.
func (h *harness) finishSlotJob(t *testing.T, n, slots int) {
	t.Helper()
	req := h.request(n, n, 16, 16, 16) // one tile
	req.MaxSlots = slots
	res := h.submit(t, req)
	h.relay(t)
	fk := h.job(t, res.Status.JobID).FrameKey(n)
	h.completeTiles(t, fk)
	h.promoteFormat(t, fk, "png")
	h.apply(t, wire.Event{ID: fmt.Sprintf("assembled-%d", n), Type: wire.EventFrameAssembled, FrameKey: fk, Formats: []string{"png"}})
	if st := h.status(t, res.Status.JobID); st.State != api.JobCompleted {
		t.Fatalf("job of frame %d: %s", n, st.State)
	}
}

// Property: a pool goes away once no frame wanted is dispatched there, and only then. The own
// pools of five finished --max-slots jobs are retired (consumers deleted, subjects purged),
// while that of a job still rendering keeps its consumers and its queued tiles.
func TestPoolsOfFinishedJobsAreRetired(t *testing.T) {
	h := newHarness(t, Config{RetirePoolsAfter: -1})
	for n := 1; n <= 5; n++ {
		h.finishSlotJob(t, n, 1)
	}
	live := h.request(9, 9, 32, 16, 16) // two tiles, still to render
	live.MaxSlots = 1
	running := h.submit(t, live)
	h.relay(t)
	runningPool := jobPool(h.job(t, running.Status.JobID))
	pools, err := h.queue.TilePools(h.ctx)
	if err != nil || len(pools) != 6 {
		t.Fatalf("pools before retiring: %d (%v), want the six jobs' own", len(pools), err)
	}
	if err := h.c.retirePools(h.ctx); err != nil {
		t.Fatal(err)
	}
	h.relay(t)
	pools, err = h.queue.TilePools(h.ctx)
	if err != nil || len(pools) != 1 || pools[0].ID() != runningPool.ID() {
		t.Fatalf("pools after retiring: %v (%v), want only the running job's %s", pools, err, runningPool)
	}
	if got := fetchAll(t, h, h.workerSources(t), 300*time.Millisecond); len(got) != 1 {
		t.Fatalf("the running job's pool delivered %d tiles at once, want 1 (its slot limit) of its 2", len(got))
	}
	// No tile of a job that finished is left in TILES: the running job's two alone (the
	// assemblies and movies of the others wait for an assembler, which this test runs none of).
	info, err := h.queue.Tiles.Info(h.ctx, jetstream.WithSubjectFilter(queue.SubjectRender+".>"))
	if err != nil {
		t.Fatal(err)
	}
	if n := info.State.Subjects[runningPool.Subject(queue.BandNormal)]; n != 2 || len(info.State.Subjects) != 1 {
		t.Fatalf("tile messages in TILES by subject: %v, want the running job's 2 alone", info.State.Subjects)
	}
}

// Property: an idle pool keeps its consumers for Config.RetirePoolsAfter after a look first
// found it idle, so a job of the same pool soon after finds the workers already pulling, and
// is retired at the first look past it.
func TestIdlePoolIsRetiredOnlyAfterItsGrace(t *testing.T) {
	h := newHarness(t, Config{RetirePoolsAfter: time.Minute})
	clock := time.Now()
	h.c.now = func() time.Time { return clock }
	h.finishSlotJob(t, 1, 1)
	look := func() int {
		t.Helper()
		if err := h.c.retirePools(h.ctx); err != nil {
			t.Fatal(err)
		}
		h.relay(t)
		pools, err := h.queue.TilePools(h.ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(pools)
	}
	for _, after := range []time.Duration{0, 59 * time.Second} {
		clock = clock.Add(after)
		if n := look(); n != 1 {
			t.Fatalf("%v into its grace: %d pools, want the finished job's still there", after, n)
		}
	}
	clock = clock.Add(time.Second)
	if n := look(); n != 0 {
		t.Fatalf("past its grace: %d pools, want the finished job's retired", n)
	}
}

// Property: a worker's polling does not grow with finished work. A running coordinator leaves
// no tile consumer of a finished --max-slots job's own pool in TILES, so an idle worker, which
// pulls from every consumer it finds, pulls from none of them.
func TestRunningCoordinatorLeavesNoPoolOfFinishedJobs(t *testing.T) {
	h := newHarness(t, Config{RetirePoolsAfter: -1})
	for n := 1; n <= 3; n++ {
		h.finishSlotJob(t, n, 2)
	}
	poolConsumers := func() []string {
		var out []string
		names := h.queue.Tiles.ConsumerNames(h.ctx)
		for name := range names.Name() {
			if strings.HasPrefix(name, queue.ConsumerWorkers+"-p") {
				out = append(out, name)
			}
		}
		if err := names.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if n := len(poolConsumers()); n != 3*int(queue.NumBands) {
		t.Fatalf("%d pool consumers before the coordinator runs, want the three jobs' %d", n, 3*int(queue.NumBands))
	}
	h.run(t)
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		left := poolConsumers()
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the finished jobs' pools are still polled: %v", left)
		}
	}
}

// Property: a dead letter requeued after its pool was retired reaches a worker: it goes where
// its frame's tiles go now, the pool made anew.
func TestRequeueAfterThePoolWasRetiredReachesAWorker(t *testing.T) {
	h := newHarness(t, Config{RetirePoolsAfter: -1})
	req := h.request(1, 2, 16, 16, 16) // two frames of one tile
	req.MaxSlots = 1
	res := h.submit(t, req)
	h.relay(t)
	h.deadLetterTile(t)
	if _, err := h.c.Cancel(h.ctx, res.Status.JobID); err != nil {
		t.Fatal(err)
	}
	if err := h.c.retirePools(h.ctx); err != nil {
		t.Fatal(err)
	}
	h.relay(t)
	if pools, err := h.queue.TilePools(h.ctx); err != nil || len(pools) != 0 {
		t.Fatalf("pools of a job cancelled: %v (%v), want it retired", pools, err)
	}
	if err := h.c.RequeueDeadLetter(h.ctx, 1); err != nil {
		t.Fatal(err)
	}
	if got := fetchAll(t, h, h.workerSources(t), 500*time.Millisecond); len(got) != 1 {
		t.Fatalf("the requeued tile reached no worker (%d messages)", len(got))
	}
}
