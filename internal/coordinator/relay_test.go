package coordinator

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/wire"
)

// The relay publishes every tile of a frame record with its tile key as its id (not a dedup
// id: the stream keeps no entry per tile), in tile order, and deletes the record. A record
// whose publish began before (a crash before the delete) is published again with its frame
// marked as having copies, so a worker checks even the copy marked First before rendering it,
// and the copy that comes second finds the tile promoted.
func TestRelayPublishesDerivedTilesOnceEach(t *testing.T) {
	h := newHarness(t, Config{})
	res := h.submit(t, h.request(1, 2, 48, 32, 16)) // 2 frames of 6 tiles
	recs := h.outbox(t)
	h.relay(t)
	if n := len(h.outbox(t)); n != 0 {
		t.Fatalf("%d outbox records left after the relay", n)
	}
	info, err := h.queue.Tiles.Info(h.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 12 {
		t.Fatalf("TILES holds %d messages, want 12", info.State.Msgs)
	}
	j := h.job(t, res.Status.JobID)
	for n := 0; n < 12; n++ {
		raw, err := h.queue.Tiles.GetMsg(h.ctx, uint64(n+1))
		if err != nil {
			t.Fatal(err)
		}
		var job wire.TileJob
		if err := json.Unmarshal(raw.Data, &job); err != nil {
			t.Fatal(err)
		}
		f := h.frame(t, j.FrameKey(1+n/6))
		ft := frameTiles(t, f)[n%6]
		if job.Index != n%6 || job.TileKey != ft.Key || queue.MsgID(raw.Header) != ft.Key || raw.Header.Get(jetstream.MsgIDHeader) != "" ||
			job.InputHash != identity.InputHash(f.SceneVersion, f.Settings, f.Frame, ft.Rect) || job.JobID != res.Status.JobID || !job.First {
			t.Fatalf("message %d: %+v with id %q and dedup id %q", n+1, job, queue.MsgID(raw.Header), raw.Header.Get(jetstream.MsgIDHeader))
		}
		if mark, err := h.queue.Dropped.Mark(h.ctx, f.Key); err != nil || mark.Copies {
			t.Fatalf("frame %d after its first publish: mark %+v, %v; want no copies", 1+n/6, mark, err)
		}
	}

	// A crash after the PubAcks and before the delete: the records are still there, tried.
	if err := h.st.Update(h.ctx, func(tx *coorddb.Tx) error {
		for _, r := range recs {
			r.Tried = true
			if err := tx.AddOutbox(r); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	h.relay(t)
	if info, _ := h.queue.Tiles.Info(h.ctx); info.State.Msgs != 24 {
		t.Fatalf("republishing stored %d messages in all, want 24 (no dedup id)", info.State.Msgs)
	}
	for _, n := range []int{1, 2} {
		if mark, err := h.queue.Dropped.Mark(h.ctx, j.FrameKey(n)); err != nil || !mark.Copies || mark.Dropped {
			t.Fatalf("frame %d after a republish: mark %+v, %v; want copies", n, mark, err)
		}
	}
}

// A record is marked tried, durably, before its first message is published.
func TestRelayMarksARecordTriedBeforePublishing(t *testing.T) {
	h := newHarness(t, Config{})
	h.submit(t, h.request(1, 1, 32, 32, 16))
	recs := h.outbox(t)
	if len(recs) != 1 || recs[0].Tried {
		t.Fatalf("outbox after submit: %+v, want one record not tried", recs)
	}
	if err := h.c.beginPublishing(h.ctx, recs); err != nil {
		t.Fatal(err)
	}
	if recs := h.outbox(t); len(recs) != 1 || !recs[0].Tried {
		t.Fatalf("outbox after beginPublishing: %+v, want the record tried", recs)
	}
	if last, _ := h.queue.LastSeq(h.ctx); last != 0 {
		t.Fatalf("beginPublishing published %d messages, want none", last)
	}
}

// Dispatch keeps many PubAcks in flight: a frame of thousands of tiles is published in one
// round, not one round trip per tile.
func TestRelayDispatchesLargeFrame(t *testing.T) {
	h := newHarness(t, Config{})
	h.submit(t, h.request(1, 1, 640, 400, 8)) // 4000 tiles
	start := time.Now()
	h.relay(t)
	info, err := h.queue.Tiles.Info(h.ctx)
	if err != nil || info.State.Msgs != 4000 {
		t.Fatalf("TILES holds %d messages (%v), want 4000", info.State.Msgs, err)
	}
	t.Logf("dispatched 4000 tiles in %v", time.Since(start))
	m, err := h.workerSources(t).FetchTile(h.ctx, time.Second)
	if err != nil || m == nil || !queue.IsRenderSubject(m.Subject()) {
		t.Fatalf("a worker cannot take a dispatched tile: %v, %v", m, err)
	}
}

// Property: nothing believed without proof. Completions of tiles whose manifests the store
// does not hold (forged by a worker credential, or mistaken) never get a frame assembled: before
// asking for the assembly the relay finds them unproven, dispatches them again and forgets the
// request; the frame is assembled once they complete with their manifests.
func TestForgedCompletionsAreDispatchedAgain(t *testing.T) {
	h := newHarness(t, Config{})
	res, fk := h.submitFrame(t, 32, 32, 16) // 4 tiles
	f := h.frame(t, fk)
	h.promoteTile(t, f, 0)
	h.promoteTile(t, f, 1)
	for i := range 4 { // tiles 2 and 3 forged
		h.apply(t, tileEvent(t, f, i, wire.EventTileCompleted, uint64(i+1), 1))
	}
	if recs := h.outbox(t); len(recs) != 1 || recs[0].Kind != coorddb.OutboxAssemble {
		t.Fatalf("outbox after every tile claimed completed: %+v, want the assembly request", recs)
	}
	before, err := h.queue.LastSeq(h.ctx)
	if err != nil {
		t.Fatal(err)
	}
	h.relay(t)
	after, err := h.queue.LastSeq(h.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after != before+2 {
		for seq := before + 1; seq <= after; seq++ {
			if m, err := h.queue.Tiles.GetMsg(h.ctx, seq); err == nil {
				t.Logf("published %d: %s %s", seq, m.Subject, m.Header.Get(jetstream.MsgIDHeader))
			}
		}
		t.Fatalf("the relay published %d messages, want the 2 unproven tiles again and no assembly", after-before)
	}
	for i, want := range []coorddb.TileState{coorddb.TileCompleted, coorddb.TileCompleted, coorddb.TileQueued, coorddb.TileQueued} {
		if s := h.tileState(t, fk, i); s != want {
			t.Fatalf("tile %d is %s, want %s", i, s, want)
		}
	}
	if st := h.status(t, res.Status.JobID); st.TilesCompleted != 2 || st.Frames[0].State != api.FrameQueued && st.Frames[0].State != api.FrameRendering {
		t.Fatalf("status after the unproven tiles went back: %+v", st)
	}
	// The tiles complete for real, each on its new message: the frame is assembled.
	for i := 2; i < 4; i++ {
		h.promoteTile(t, f, i)
		h.apply(t, tileEvent(t, f, i, wire.EventTileCompleted, after-uint64(3-i), 1))
	}
	if recs := h.outbox(t); len(recs) != 1 || recs[0].Kind != coorddb.OutboxAssemble {
		t.Fatalf("outbox after the tiles completed with their manifests: %+v, want the assembly request", recs)
	}
	h.relay(t)
	if last, _ := h.queue.LastSeq(h.ctx); last != after+1 {
		t.Fatalf("the relay published %d messages, want the assembly", last-after)
	}
}

// Property: a frame new at submission is dispatched marked First (its workers skip the store
// reads that find earlier attempts), and its assembly job names the object each tile's worker
// reported with its completion, so the assembler reads each tile once; a tile whose
// completion is taken back (no manifest) is no longer named.
func TestFirstDispatchAndReportedTileObjects(t *testing.T) {
	h := newHarness(t, Config{})
	res := h.submit(t, h.request(1, 1, 48, 32, 16)) // 1 frame of 6 tiles
	h.relay(t)
	for seq := uint64(1); seq <= 6; seq++ {
		raw, err := h.queue.Tiles.GetMsg(h.ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		var job wire.TileJob
		if err := json.Unmarshal(raw.Data, &job); err != nil || !job.First {
			t.Fatalf("tile message %d of a new frame: %+v, %v; want First", seq, job, err)
		}
	}
	j := h.job(t, res.Status.JobID)
	f := h.frame(t, j.FrameKey(1))
	var evs []wire.Event
	want := make([]string, 6)
	for i := range frameTiles(t, f) {
		if i != 5 { // tile 5's completion has no manifest: it is taken back
			h.promoteTile(t, f, i)
		}
		ev := tileEvent(t, f, i, wire.EventTileCompleted, uint64(i+1), 1)
		sum := fmt.Sprintf("%064x", i+1)
		ev.Object = &wire.TileObject{Attempt: fmt.Sprintf("%016x", i+1), SHA256: sum, Build: "build-1"}
		want[i] = fmt.Sprintf("%016x:%s", i+1, sum)
		evs = append(evs, ev)
	}
	h.apply(t, evs...)
	h.relay(t) // tile 5 goes back to queued and is dispatched again, not First
	info, err := h.queue.Tiles.Info(h.ctx)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := h.queue.Tiles.GetMsg(h.ctx, info.State.LastSeq)
	if err != nil {
		t.Fatal(err)
	}
	var again wire.TileJob
	if err := json.Unmarshal(raw.Data, &again); err != nil || again.Index != 5 || again.First {
		t.Fatalf("the tile dispatched again: %+v, %v; want tile 5, not First", again, err)
	}
	h.promoteTile(t, f, 5)
	ev := tileEvent(t, f, 5, wire.EventTileCompleted, 7, 1)
	h.apply(t, ev) // reported no object this time
	h.relay(t)
	raw, err = h.queue.Tiles.GetLastMsgForSubject(h.ctx, poolOf(j, f).AssembleSubject())
	if err != nil {
		t.Fatal(err)
	}
	var asm wire.AssembleJob
	if err := json.Unmarshal(raw.Data, &asm); err != nil {
		t.Fatal(err)
	}
	want[5] = ""
	if asm.TileBuild != "build-1" || !slices.Equal(asm.TileObjects, want) {
		t.Fatalf("the assembly names %q of build %q, want %q of build-1", asm.TileObjects, asm.TileBuild, want)
	}
}
