package coordinator

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/failure"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/wire"
	"github.com/tilefarm/tilefarm/tiles"
)

// Tile events move tiles and frame counters; the last tile completed asks for exactly one
// assembly, and frame.completed completes the frame and the job.
func TestEventsMoveTilesAndCompleteFrame(t *testing.T) {
	h := newHarness(t, Config{})
	res, fk := h.submitFrame(t, 32, 16, 16) // 2 tiles
	f := h.frame(t, fk)
	h.apply(t, tileEvent(t, f, 0, wire.EventTileStarted, 1, 1))
	if s := h.tileState(t, fk, 0); s != coorddb.TileRendering {
		t.Fatalf("tile 0 after start: %s", s)
	}
	if st := h.status(t, res.Status.JobID); st.State != api.JobRendering || st.State.ExitCode() != 3 || st.TileAttempts != 1 {
		t.Fatalf("job after a start: %s, %d attempts", st.State, st.TileAttempts)
	}
	h.apply(t, tileEvent(t, f, 0, wire.EventTileCompleted, 1, 1))
	if n := h.outboxKinds(t)[coorddb.OutboxAssemble]; n != 0 {
		t.Fatalf("assembly asked for with a tile missing (%d records)", n)
	}
	h.apply(t, tileEvent(t, f, 1, wire.EventTileCompleted, 2, 1), tileEvent(t, f, 1, wire.EventTileCompleted, 2, 1))
	if n := h.outboxKinds(t)[coorddb.OutboxAssemble]; n != 1 {
		t.Fatalf("%d assembly records after the last tile (and a duplicate event), want 1", n)
	}
	if f := h.frame(t, fk); f.State != coorddb.FrameAssembling || f.TilesCompleted != 2 {
		t.Fatalf("frame %s with %d tiles completed", f.State, f.TilesCompleted)
	}
	h.apply(t, wire.Event{ID: "fc", Type: wire.EventFrameAssembled, FrameKey: fk, Formats: []string{"png"}})
	st := h.status(t, res.Status.JobID)
	if st.State != api.JobCompleted || st.State.ExitCode() != 0 || st.FramesCompleted != 1 {
		t.Fatalf("job after frame.completed: %+v", st)
	}
}

// An event naming a tile its frame does not have, or a frame nobody asked for, changes
// nothing and does not block the events around it.
func TestForgedEventsChangeNothing(t *testing.T) {
	h := newHarness(t, Config{})
	res := h.submit(t, h.request(1, 1, 32, 16, 16))
	fk := h.job(t, res.Status.JobID).FrameKey(1)
	f := h.frame(t, fk)
	wrongKey := tileEvent(t, f, 0, wire.EventTileCompleted, 1, 1)
	wrongKey.TileKey = strings.Repeat("f", 64)
	outOfRange := tileEvent(t, f, 0, wire.EventTileCompleted, 1, 1)
	outOfRange.TileIndex = 7
	unknownFrame := wire.Event{ID: "x", Type: wire.EventFrameAssembled, FrameKey: strings.Repeat("e", 64), Formats: []string{"png"}}
	good := tileEvent(t, f, 1, wire.EventTileCompleted, 2, 1)
	h.apply(t, wrongKey, outOfRange, unknownFrame, good)
	if got := h.frame(t, fk).TilesCompleted; got != 1 {
		t.Fatalf("%d tiles completed, want only the genuine event's", got)
	}
	if s := h.tileState(t, fk, 0); s != coorddb.TileQueued {
		t.Fatalf("forged events moved tile 0 to %s", s)
	}
}

// One causal order per tile: whatever order a tile's events arrive in (a lagging consumer, a
// redelivered batch, the watcher racing the events), the projection ends the same. Here: two
// failed deliveries, a dead letter, a retry's new message that starts and completes.
func TestEventOrderDoesNotChangeTheOutcome(t *testing.T) {
	h := newHarness(t, Config{})
	res := h.submit(t, h.request(1, 1, 16, 16, 16)) // one tile
	fk := h.job(t, res.Status.JobID).FrameKey(1)
	f := h.frame(t, fk)
	failed := func(seq, d uint64, terminal bool) wire.Event {
		ev := tileEvent(t, f, 0, wire.EventTileFailed, seq, d)
		ev.Terminal, ev.Code, ev.Error = terminal, failure.CodePanic, "boom"
		return ev
	}
	deadMessage := []wire.Event{
		tileEvent(t, f, 0, wire.EventTileStarted, 10, 1), failed(10, 1, false),
		tileEvent(t, f, 0, wire.EventTileStarted, 10, 2), failed(10, 2, true),
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 5 {
		evs := slices.Clone(deadMessage)
		rng.Shuffle(len(evs), func(i, j int) { evs[i], evs[j] = evs[j], evs[i] })
		hr := newHarness(t, Config{})
		rr := hr.submit(t, hr.request(1, 1, 16, 16, 16))
		for _, ev := range evs {
			hr.apply(t, ev)
		}
		fk := hr.job(t, rr.Status.JobID).FrameKey(1)
		if s := hr.tileState(t, fk, 0); s != coorddb.TileDeadLettered {
			t.Fatalf("round %d (%v): tile ends %s, want dead_lettered", round, eventTypes(evs), s)
		}
		// Attempts count the starts that were news when they arrived, so only the states and
		// failure counts are order-independent.
		if st := hr.status(t, rr.Status.JobID); st.State != api.JobFailed || st.TilesFailed != 1 || len(st.Failures) != 1 {
			t.Fatalf("round %d: job %s, %d failed tiles, failures %v; want failed, 1", round, st.State, st.TilesFailed, st.Failures)
		}
	}
	// On one projection: the dead message's events in every order, then a retry whose events
	// arrive before and after stale ones.
	for _, ev := range deadMessage {
		h.apply(t, ev)
	}
	if n, err := h.c.Retry(h.ctx, res.Status.JobID); err != nil || n != 1 {
		t.Fatalf("Retry = %d, %v", n, err)
	}
	if s := h.tileState(t, fk, 0); s != coorddb.TileQueued {
		t.Fatalf("retried tile is %s", s)
	}
	stale := slices.Clone(deadMessage)
	rng.Shuffle(len(stale), func(i, j int) { stale[i], stale[j] = stale[j], stale[i] })
	h.apply(t, stale...) // a lagging consumer replays the dead message: nothing changes
	if s := h.tileState(t, fk, 0); s != coorddb.TileQueued {
		t.Fatalf("stale events of the dead message moved the retried tile to %s", s)
	}
	h.apply(t, tileEvent(t, f, 0, wire.EventTileStarted, 11, 1))
	h.apply(t, stale[0], failed(10, 2, true))
	if s := h.tileState(t, fk, 0); s != coorddb.TileRendering {
		t.Fatalf("the retry's tile is %s after stale events, want rendering", s)
	}
	h.apply(t, tileEvent(t, f, 0, wire.EventTileCompleted, 11, 1))
	h.apply(t, failed(10, 2, true))
	if s := h.tileState(t, fk, 0); s != coorddb.TileCompleted {
		t.Fatalf("completed tile moved to %s by a stale dead letter", s)
	}
	if st := h.status(t, res.Status.JobID); st.State != api.JobRendering || st.TilesFailed != 0 {
		t.Fatalf("job after the retry completed its tile: %s, %d failed tiles", st.State, st.TilesFailed)
	}
}

func eventTypes(evs []wire.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, fmt.Sprintf("%s@%d", e.Type, e.Delivery))
	}
	return out
}

// A terminal failure fails the frame, names the tile and its error, and exits 1; a retry
// queues only the dead-lettered tile, under a message id of its own.
func TestDeadLetteredTileFailsFrameAndRetryRequeuesIt(t *testing.T) {
	h := newHarness(t, Config{})
	res, fk := h.submitFrame(t, 32, 16, 16)
	f := h.frame(t, fk)
	h.apply(t, tileEvent(t, f, 0, wire.EventTileCompleted, 1, 1))
	ev := tileEvent(t, f, 1, wire.EventTileFailed, 2, 1)
	ev.Terminal, ev.Code, ev.Error = true, failure.CodeTerminal, "unknown material"
	h.apply(t, ev)
	st := h.status(t, res.Status.JobID)
	ft := frameTiles(t, f)
	if st.State != api.JobFailed || st.State.ExitCode() != 1 || len(st.Failures) != 1 ||
		!strings.Contains(st.Failures[0], ft[1].Key[:12]) || !strings.Contains(st.Failures[0], "unknown material") {
		t.Fatalf("failed job: %s %v", st.State, st.Failures)
	}
	if n, err := h.c.Retry(h.ctx, res.Status.JobID); err != nil || n != 1 {
		t.Fatalf("Retry = %d, %v", n, err)
	}
	recs := h.outbox(t)
	if len(recs) != 1 || !slices.Equal(recs[0].Tiles, []int{1}) || recs[0].Retry != 1 {
		t.Fatalf("retry outbox %+v, want tile 1 only as retry 1", recs)
	}
	msgs, err := h.c.outboxMessages(h.ctx, recs[0])
	if err != nil || len(msgs) != 1 || queue.MsgID(msgs[0].Header) != ft[1].Key+":retry:1" {
		t.Fatalf("retry messages %v, %v", msgs, err)
	}
	if st := h.status(t, res.Status.JobID); st.State != api.JobRendering {
		t.Fatalf("job after retry: %s", st.State)
	}
}

// Another format of a completed frame is assembled again under a dedup id of its own, and the
// job that finished first stays completed, its output served, while the other assembles.
// Two such requests in a row each get their own assembly.
func TestOtherFormatsNeverRegressAFinishedJob(t *testing.T) {
	h := newHarness(t, Config{})
	a, fk := h.submitFrame(t, 16, 16, 16)
	h.completeTiles(t, fk)
	h.promoteFormat(t, fk, "png")
	h.apply(t, wire.Event{ID: "png", Type: wire.EventFrameAssembled, FrameKey: fk, Formats: []string{"png"}})
	h.relay(t)
	var ids []string
	for _, format := range []string{"exr", "png16"} {
		req := h.request(1, 1, 16, 16, 16)
		req.Formats = []string{format}
		b := h.submit(t, req)
		if b.Status.State != api.JobRendering {
			t.Fatalf("%s job: %s, want in progress while it assembles", format, b.Status.State)
		}
		if st := h.status(t, a.Status.JobID); st.State != api.JobCompleted {
			t.Fatalf("the png job regressed to %s when %s was asked for", st.State, format)
		}
		if _, err := h.c.FrameOutput(h.ctx, a.Status.JobID, 1, "png"); err != nil {
			t.Fatalf("png output unavailable while %s assembles: %v", format, err)
		}
		for _, r := range h.outbox(t) {
			msgs, err := h.c.outboxMessages(h.ctx, r)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range msgs {
				ids = append(ids, m.Header.Get("Nats-Msg-Id"))
			}
		}
		h.relay(t)
	}
	if len(ids) != 2 || ids[0] == ids[1] {
		t.Fatalf("re-assembly ids %v, want two distinct ones", ids)
	}
	h.apply(t, wire.Event{ID: "all", Type: wire.EventFrameAssembled, FrameKey: fk, Formats: []string{"exr", "png", "png16"}})
	if f := h.frame(t, fk); f.State != coorddb.FrameCompleted {
		t.Fatalf("frame after every format: %s", f.State)
	}
}

// A tile dead-lettered whose manifest appears after all (its last ack was lost) is completed by
// the reconciler: nothing promoted stays failed.
func TestReconcilerCompletesADeadLetteredTileFoundPromoted(t *testing.T) {
	h := newHarness(t, Config{})
	res, fk := h.submitFrame(t, 32, 16, 16)
	f := h.frame(t, fk)
	h.promoteTile(t, f, 0)
	h.apply(t, tileEvent(t, f, 0, wire.EventTileCompleted, 1, 1))
	dead := tileEvent(t, f, 1, wire.EventTileFailed, 2, 20)
	dead.Terminal, dead.Code, dead.Error = true, failure.CodeMaxDeliveries, "max deliveries exceeded"
	h.apply(t, dead)
	if st := h.status(t, res.Status.JobID); st.State != api.JobFailed || !strings.Contains(st.Failures[0], failure.CodeMaxDeliveries) {
		t.Fatalf("job after a real dead letter: %s %v", st.State, st.Failures)
	}
	h.promoteTile(t, f, 1)
	if _, err := h.c.Reconcile(h.ctx); err != nil {
		t.Fatal(err)
	}
	if st := h.status(t, res.Status.JobID); st.State != api.JobRendering || st.TilesCompleted != 2 || st.TilesFailed != 0 {
		t.Fatalf("job after the dead tile's manifest appeared: %+v", st)
	}
}

// Property: one order per tile across copies. After a reprioritize moved a queued tile to a
// new copy in another band, its old copy dead-lettering in the old band fails neither the tile
// nor the job, the new copy's start is news, and the job can still be cancelled.
func TestReprioritizedTileIgnoresItsOldCopy(t *testing.T) {
	h := newHarness(t, Config{})
	res, fk := h.submitFrame(t, 16, 16, 16)
	last, err := h.queue.LastSeq(h.ctx)
	if err != nil || last == 0 {
		t.Fatalf("TILES holds no message after the relay: %d, %v", last, err)
	}
	if _, err := h.c.Reprioritize(h.ctx, res.Status.JobID, 50); err != nil {
		t.Fatal(err)
	}
	if recs := h.outbox(t); len(recs) != 1 || recs[0].Kind != coorddb.OutboxMove {
		t.Fatalf("outbox after the reprioritize: %+v, want the frame's move", recs)
	}
	h.relay(t) // the move: a new copy, a later message, in the high band
	high := jobPool(h.job(t, res.Status.JobID)).Subject(queue.BandHigh)
	if msg, err := h.queue.Tiles.GetMsg(h.ctx, last+1); err != nil || msg.Subject != high {
		t.Fatalf("TILES after the move: %v; want the new copy on %s", err, high)
	}
	// The old copy runs out of deliveries in its old band.
	old := tileEvent(t, h.frame(t, fk), 0, wire.EventTileFailed, last, 20)
	old.Terminal, old.Code, old.Error = true, failure.CodeMaxDeliveries, "max deliveries exceeded"
	h.apply(t, old)
	if s := h.tileState(t, fk, 0); s != coorddb.TileQueued {
		t.Fatalf("the old copy's dead letter left the tile %s, want queued for its new copy", s)
	}
	if st := h.status(t, res.Status.JobID); st.State == api.JobFailed || st.TilesFailed != 0 {
		t.Fatalf("the old copy's dead letter failed the job: %+v", st)
	}
	ft, err := tiles.FrameTiles(fk, 16, 16, 16)
	if err != nil {
		t.Fatal(err)
	}
	h.apply(t, wire.Event{ID: "new-copy-started", Type: wire.EventTileStarted, FrameKey: fk, TileKey: ft[0].Key, TileIndex: 0,
		Seq: last + 1, Delivery: 1, Attempt: "a2", Worker: "w1"})
	if s := h.tileState(t, fk, 0); s != coorddb.TileRendering {
		t.Fatalf("the new copy's start left the tile %s, want rendering", s)
	}
	if st, err := h.c.Cancel(h.ctx, res.Status.JobID); err != nil || st.State != api.JobCancelled {
		t.Fatalf("cancel after the old copy died: %s, %v", st.State, err)
	}
	if _, err := h.c.Cancel(h.ctx, h.submit(t, h.request(7, 7, 16, 16, 16)).Status.JobID); err != nil {
		t.Fatal(err)
	}
}

// One causal order per tile, through the real EVENTS stream: a dead letter is recorded, then a lagging
// consumer delivers an older tile.started of the same message. The dead letter stands, so a
// retry requeues the tile (it left the queue) and the job completes when the retry does.
func TestLaggingEventNeverUndoesADeadLetter(t *testing.T) {
	h := newHarness(t, Config{})
	res, fk := h.submitFrame(t, 16, 16, 16)
	f := h.frame(t, fk)
	dead := tileEvent(t, f, 0, wire.EventTileFailed, 1, 20)
	dead.Terminal, dead.Error = true, "killed"
	h.apply(t, dead)
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	go func() { _ = h.c.consumeEvents(ctx) }()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	h.publishEvent(t, tileEvent(t, f, 0, wire.EventTileStarted, 1, 19)) // the lagging start
	marker := tileEvent(t, f, 0, wire.EventTileStarted, 1, 1)
	h.publishEvent(t, marker) // an even older one, then wait until both were consumed
	waitFor("the lagging events to be consumed", func() bool {
		info, err := h.queue.Events.Info(h.ctx)
		if err != nil {
			return false
		}
		c, err := h.queue.Events.Consumer(h.ctx, consumerEvents)
		if err != nil {
			return false
		}
		ci, err := c.Info(h.ctx)
		return err == nil && info.State.Msgs == 2 && ci.AckFloor.Stream == info.State.LastSeq
	})
	if s := h.tileState(t, fk, 0); s != coorddb.TileDeadLettered {
		t.Fatalf("a lagging start moved the dead-lettered tile to %s", s)
	}
	if n, err := h.c.Retry(h.ctx, res.Status.JobID); err != nil || n != 1 {
		t.Fatalf("Retry = %d, %v", n, err)
	}
	h.publishEvent(t, tileEvent(t, f, 0, wire.EventTileStarted, 2, 1))
	h.publishEvent(t, tileEvent(t, f, 0, wire.EventTileCompleted, 2, 1))
	waitFor("the retried tile to complete", func() bool { return h.tileState(t, fk, 0) == coorddb.TileCompleted })
	if st := h.status(t, res.Status.JobID); st.State != api.JobRendering || st.TilesFailed != 0 {
		t.Fatalf("job after the retry: %+v", st)
	}
}

// Property: every sample a worker reports resumed from a checkpoint is counted exactly once,
// whatever order a tile's starts, failures and completion arrive in, in whatever batches, and
// however often each is applied: a start that arrives after the tile completed, after a later
// attempt's start, or with the delivery count of another attempt (a replicated consumer's
// leader change repeats one) still resumed its samples, and a completion counts its attempt's
// resumed samples even when that attempt's start never arrives (lost in flight with a pull
// when the coordinator moved to another NATS node, and redelivered a minute later).
func TestRecoveredSamplesCountOnceInAnyOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for round := range 40 {
		h := newHarness(t, Config{})
		req := h.request(1, 1, 16, 16, 16) // one tile
		req.SPP = 8
		res := h.submit(t, req)
		fk := h.job(t, res.Status.JobID).FrameKey(1)
		f := h.frame(t, fk)
		start := func(d uint64, attempt string, recovered int) wire.Event {
			ev := tileEvent(t, f, 0, wire.EventTileStarted, 10, d)
			ev.Attempt, ev.SamplesRecovered, ev.ID = attempt, recovered, "started:"+attempt
			return ev
		}
		failed := tileEvent(t, f, 0, wire.EventTileFailed, 10, 2)
		failed.Code, failed.Error = failure.CodePanic, "boom"
		done := tileEvent(t, f, 0, wire.EventTileCompleted, 10, 4)
		done.Attempt, done.SamplesRecovered = "last", 7
		evs := []wire.Event{
			start(1, "first", 0), start(2, "second", 5), failed,
			start(3, "third", 6), start(3, "third-again", 2), // two attempts, one delivery count
			done,
		}
		if round%2 == 0 { // else the completing attempt's start never arrives
			evs = append(evs, start(4, "last", 7))
		}
		want := 5 + 6 + 2 + 7
		for i := range len(evs) { // some events twice
			if rng.IntN(3) == 0 {
				evs = append(evs, evs[i])
			}
		}
		rng.Shuffle(len(evs), func(i, j int) { evs[i], evs[j] = evs[j], evs[i] })
		for len(evs) > 0 {
			n := 1 + rng.IntN(len(evs))
			h.apply(t, evs[:n]...)
			evs = evs[n:]
		}
		if got := h.frame(t, fk).SamplesRecovered; got != want {
			t.Fatalf("round %d: %d samples recovered, want %d", round, got, want)
		}
		if st := h.status(t, res.Status.JobID); st.SamplesRecovered != want || h.tileState(t, fk, 0) != coorddb.TileCompleted {
			t.Fatalf("round %d: status says %d samples recovered (want %d), tile %s", round, st.SamplesRecovered, want, h.tileState(t, fk, 0))
		}
	}
}
