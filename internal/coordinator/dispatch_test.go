package coordinator

import (
	"errors"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/queue"
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
