package coordinator

import (
	"encoding/json"
	"testing"

	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/wire"
)

// Property (never loses work): tiles whose messages left TILES unrendered (a purge here; an
// OS crash of an unsynced JetStream server in life) are dispatched again once two
// reconciliations in a row find nothing that could still deliver them; completed tiles are
// not, and nothing is dispatched again while the queue holds messages or events wait.
func TestReconcileRedispatchesLostTiles(t *testing.T) {
	h := newHarness(t, Config{})
	if _, err := h.queue.Events.CreateOrUpdateConsumer(h.ctx, eventsConsumer); err != nil {
		t.Fatal(err)
	}
	res, fk := h.submitFrame(t, 32, 32, 16) // 4 tiles, dispatched
	reconcile := func(when string, want int) {
		t.Helper()
		rep, err := h.c.Reconcile(h.ctx)
		if err != nil || rep.Redispatched != want {
			t.Fatalf("%s: reconcile %+v, %v; want %d tiles dispatched again", when, rep, err, want)
		}
	}
	depth := func() uint64 {
		t.Helper()
		n, _, err := h.queue.Depth(h.ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	reconcile("tiles in the queue", 0)
	reconcile("tiles in the queue, again", 0)
	f := h.frame(t, fk)
	h.apply(t, tileEvent(t, f, 0, wire.EventTileCompleted, 1, 1))
	h.apply(t, tileEvent(t, f, 2, wire.EventTileStarted, 50, 1)) // rendering, as of message 50

	tilesStream, err := h.js.Stream(h.ctx, queue.StreamTiles)
	if err != nil {
		t.Fatal(err)
	}
	if err := tilesStream.Purge(h.ctx); err != nil {
		t.Fatal(err)
	}
	// An event not applied yet may be about a tile that left the queue rendered: wait for it.
	ev := tileEvent(t, f, 1, wire.EventTileStarted, 2, 1)
	data, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.queue.Publish(h.ctx, ev.Subject(), "", data, nil); err != nil {
		t.Fatal(err)
	}
	reconcile("an event waiting", 0)
	reconcile("an event waiting, again", 0)
	cons, err := h.queue.Events.Consumer(h.ctx, consumerEvents)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1)
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		if err := m.DoubleAck(h.ctx); err != nil {
			t.Fatal(err)
		}
	}

	reconcile("lost, seen once", 0)
	// A drop mark the store does not have (a cancel racing a revive) would have workers ack
	// the new messages unrendered: dispatching again clears it.
	if err := h.queue.Dropped.Add(h.ctx, fk); err != nil {
		t.Fatal(err)
	}
	reconcile("lost, seen twice", 3)
	if mark, err := h.queue.Dropped.Mark(h.ctx, fk); err != nil || mark.Dropped {
		t.Fatalf("the frame dispatched again is still marked dropped (%+v, %v)", mark, err)
	}
	// The new messages' events apply even at a lower stream sequence than the lost one's (a
	// stream that lost its unsynced tail numbers on from its last synced message).
	attempts := h.frame(t, fk).TileAttempts
	h.apply(t, tileEvent(t, f, 2, wire.EventTileStarted, 3, 1))
	if s, n := h.tileState(t, fk, 2), h.frame(t, fk).TileAttempts; s != coorddb.TileRendering || n != attempts+1 {
		t.Fatalf("a start of tile 2's new message at sequence 3: %s, %d attempts (was %d); want rendering, one more", s, n, attempts)
	}
	recs := h.outbox(t)
	if len(recs) != 1 || recs[0].Retry != 1 || len(recs[0].Tiles) != 3 || recs[0].JobID != res.Status.JobID {
		t.Fatalf("outbox after the lost tiles were found: %+v, want one record of tiles 1-3 as retry 1", recs)
	}
	h.relay(t)
	if n := depth(); n != 3 {
		t.Fatalf("%d messages in TILES after the relay, want the 3 lost tiles", n)
	}
	reconcile("dispatched again", 0)
	if s := h.tileState(t, fk, 0); s != coorddb.TileCompleted {
		t.Fatalf("tile 0 is %s, want completed", s)
	}
}
