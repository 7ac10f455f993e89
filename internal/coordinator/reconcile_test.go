package coordinator

import (
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/coorddb"
)

// Manifests are the truth: with no event applied at all, the reconciler completes promoted
// tiles, asks for the assembly of a frame whose tiles are all promoted, and completes a frame
// whose outputs are promoted. It lists each unfinished frame's manifests, never tile by tile.
func TestReconcileCompletesFromManifestsAlone(t *testing.T) {
	h := newHarness(t, Config{})
	res := h.submit(t, h.request(1, 3, 32, 32, 16)) // 3 frames of 4 tiles
	h.relay(t)
	j := h.job(t, res.Status.JobID)
	f1, f2 := h.frame(t, j.FrameKey(1)), h.frame(t, j.FrameKey(2))
	for i := range 4 {
		h.promoteTile(t, f1, i)
	}
	h.promoteTile(t, f2, 2)

	before := h.objects.lists.Load()
	rep, err := h.c.Reconcile(h.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Frames != 3 || rep.Tiles != 5 {
		t.Fatalf("reconcile report %+v, want 3 frames, 5 tiles found", rep)
	}
	// One listing per unfinished frame, plus one of frame 1's outputs now its tiles are done.
	if n := h.objects.lists.Load() - before; n != 4 {
		t.Fatalf("reconciling 3 frames of 4 tiles made %d List calls, want 4", n)
	}
	if f := h.frame(t, f1.Key); f.State != coorddb.FrameAssembling || f.TilesCompleted != 4 {
		t.Fatalf("frame 1: %s, %d tiles", f.State, f.TilesCompleted)
	}
	if s := h.tileState(t, f2.Key, 2); s != coorddb.TileCompleted {
		t.Fatalf("frame 2 tile 2: %s", s)
	}
	if n := h.outboxKinds(t)[coorddb.OutboxAssemble]; n != 1 {
		t.Fatalf("%d assemblies asked for, want frame 1's", n)
	}
	h.promoteFormat(t, f1.Key, "png")
	if rep, err := h.c.Reconcile(h.ctx); err != nil || rep.Outputs != 1 {
		t.Fatalf("second reconcile = %+v, %v; want frame 1's png found", rep, err)
	}
	st := h.status(t, res.Status.JobID)
	if st.Frames[0].State != "completed" || st.FramesCompleted != 1 {
		t.Fatalf("status after reconciling: %+v", st.Frames)
	}
	// A finished frame leaves the reconciler's work list.
	before = h.objects.lists.Load()
	if rep, err := h.c.Reconcile(h.ctx); err != nil || rep.Frames != 2 {
		t.Fatalf("third reconcile = %+v, %v; want only the 2 unfinished frames", rep, err)
	}
	if n := h.objects.lists.Load() - before; n != 2 {
		t.Fatalf("%d List calls for 2 unfinished frames", n)
	}
}

// A frame that waits for its assembly far longer than an assembly takes (its message lost
// with unsynced JetStream data) is asked for again.
func TestReconcileAsksAgainForAStaleAssembly(t *testing.T) {
	h := newHarness(t, Config{StaleAssembly: time.Minute})
	_, fk := h.submitFrame(t, 16, 16, 16)
	h.completeTiles(t, fk)
	h.relay(t) // the assembly message, then lost
	if rep, err := h.c.Reconcile(h.ctx); err != nil || rep.Reassembled != 0 {
		t.Fatalf("reconcile of a fresh assembly = %+v, %v", rep, err)
	}
	h.c.now = func() time.Time { return time.Now().UTC().Add(2 * time.Minute) }
	if rep, err := h.c.Reconcile(h.ctx); err != nil || rep.Reassembled != 1 {
		t.Fatalf("reconcile of a stale assembly = %+v, %v", rep, err)
	}
	recs := h.outbox(t)
	if len(recs) != 1 || recs[0].Kind != coorddb.OutboxAssemble || recs[0].Assembly != 2 {
		t.Fatalf("outbox %+v, want the frame's second assembly request", recs)
	}
}
