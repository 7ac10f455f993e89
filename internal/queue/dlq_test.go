package queue

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/tilefarm/tilefarm/internal/api"
)

// startWatcher runs WatchDeadLetters on its own connection and returns the channel of dead letters and a
// stop function that asserts the watcher returned nil.
func startWatcher(t *testing.T, tf *testFarm, name string) (<-chan api.DeadLetter, func()) {
	t.Helper()
	nc := tf.connect(t, name)
	ctx, cancel := context.WithCancel(context.Background())
	dead := make(chan api.DeadLetter, 16)
	errc := make(chan error, 1)
	go func() {
		errc <- tf.f.WatchDeadLetters(ctx, nc, recordFunc(func(dl api.DeadLetter) error { dead <- dl; return nil }))
	}()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-errc:
			if err != nil {
				t.Errorf("WatchDeadLetters returned %v after cancel, want nil", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("WatchDeadLetters did not return after cancel")
		}
		nc.Close()
	}
	t.Cleanup(stop)
	return dead, stop
}

// nakUntilDead fetches and Naks the only message until the consumer gives up on it (MaxDeliver 2),
// and returns the first delivery's stream sequence.
func nakUntilDead(t *testing.T, f *Queue, msgID string) uint64 {
	t.Helper()
	var seq uint64
	for attempt := 1; attempt <= f.Cfg.MaxDeliver; attempt++ {
		m := mustFetch(t, f, 3*time.Second)
		if got := m.Headers().Get(jetstream.MsgIDHeader); got != msgID {
			t.Fatalf("attempt %d fetched %q, want %q", attempt, got, msgID)
		}
		if d := deliveries(t, m); d != uint64(attempt) {
			t.Fatalf("attempt %d has delivery count %d", attempt, d)
		}
		md, _ := m.Metadata()
		seq = md.Sequence.Stream
		if err := m.Nak(); err != nil {
			t.Fatalf("Nak: %v", err)
		}
	}
	return seq
}

func TestMaxDeliveriesGoToDLQAndRequeue(t *testing.T) {
	t.Parallel()
	cfg := fastConfig()
	cfg.MaxDeliver = 2
	tf := startFarm(t, cfg)
	ctx := testCtx(t)
	dead, stop := startWatcher(t, tf, "watcher")

	hdr := nats.Header{"Tile-Key": []string{"frame1.0_0_64_64"}}
	if _, err := tf.f.Publish(ctx, SubjectRender, "tile-dead", []byte("payload"), hdr); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	seq := nakUntilDead(t, tf.f, "tile-dead")

	// Keep pulling (as workers do) until the advisory has been handled; the message must not come back.
	var dl api.DeadLetter
	deadline := time.Now().Add(10 * time.Second)
wait:
	for {
		select {
		case dl = <-dead:
			break wait
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no dead letter within 10s")
		}
		if m, err := tf.f.FetchTile(ctx, 300*time.Millisecond); err != nil || m != nil {
			t.Fatalf("message delivered beyond MaxDeliver (err %v)", err)
		}
	}
	if dl.Subject != SubjectRender || dl.MsgID != "tile-dead" || string(dl.Data) != "payload" ||
		nats.Header(dl.Header).Get("Tile-Key") != "frame1.0_0_64_64" || dl.Deliveries != 2 || dl.StreamSeq != seq || dl.DLQSeq == 0 {
		t.Fatalf("dead letter = %+v", dl)
	}
	if dl.Reason != reasonMaxDelivers {
		t.Fatalf("reason = %q, want %q", dl.Reason, reasonMaxDelivers)
	}
	// onDead runs between the DLQ copy and the delete from TILES.
	eventually(t, 5*time.Second, "dead message to leave TILES", func() bool { return tilesCount(t, tf.f) == 0 })
	list, err := tf.f.ListDeadLetters(ctx)
	if err != nil {
		t.Fatalf("ListDeadLetters: %v", err)
	}
	if len(list) != 1 {
		t.Fatalf("DLQ holds %d dead letters, want 1", len(list))
	}
	got := list[0]
	if got.DLQSeq != dl.DLQSeq || got.StreamSeq != seq || got.MsgID != "tile-dead" || got.Subject != SubjectRender ||
		got.Reason != dl.Reason || got.Deliveries != 2 || string(got.Data) != "payload" ||
		nats.Header(got.Header).Get("Tile-Key") != "frame1.0_0_64_64" || got.Time.IsZero() {
		t.Fatalf("listed dead letter = %+v", got)
	}
	if len(got.Header) != 1 {
		t.Fatalf("listed dead letter leaks bookkeeping headers: %v", got.Header)
	}
	stop()

	// Requeue: back on TILES under a fresh id, gone from the DLQ.
	if _, err := tf.f.RequeueDeadLetter(ctx, dl.DLQSeq); err != nil {
		t.Fatalf("RequeueDeadLetter: %v", err)
	}
	if list, err := tf.f.ListDeadLetters(ctx); err != nil || len(list) != 0 {
		t.Fatalf("DLQ after requeue = %d entries, %v; want empty", len(list), err)
	}
	m := mustFetch(t, tf.f, 3*time.Second)
	wantID := fmt.Sprintf("tile-dead:requeue:%d", dl.DLQSeq)
	if string(m.Data()) != "payload" || m.Subject() != SubjectRender || m.Headers().Get(jetstream.MsgIDHeader) != wantID ||
		m.Headers().Get("Tile-Key") != "frame1.0_0_64_64" || m.Headers().Get(HeaderLastError) != "" || deliveries(t, m) != 1 {
		t.Fatalf("requeued message = %q on %q headers %v delivery %d", m.Data(), m.Subject(), m.Headers(), deliveries(t, m))
	}
	if err := m.DoubleAck(ctx); err != nil {
		t.Fatalf("DoubleAck: %v", err)
	}
	if _, err := tf.f.RequeueDeadLetter(ctx, dl.DLQSeq); !errors.Is(err, ErrDeadLetterNotFound) {
		t.Fatalf("second requeue = %v, want ErrDeadLetterNotFound", err)
	}
}

func TestAdvisoryRaisedWhileNoWatcherRunsIsHandledLater(t *testing.T) {
	t.Parallel()
	cfg := fastConfig()
	cfg.MaxDeliver = 2
	cfg.AckWait = 10 * time.Second
	tf := startFarm(t, cfg)
	ctx := testCtx(t)

	if _, err := tf.f.Publish(ctx, SubjectRender, "dead", []byte("dead"), nil); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	nakUntilDead(t, tf.f, "dead")
	// Pull until the consumer gives up on "dead". No watcher runs: the advisory must wait in its stream.
	advisories, err := tf.f.JS.Stream(ctx, StreamAdvisories)
	if err != nil {
		t.Fatalf("Stream(%s): %v", StreamAdvisories, err)
	}
	advisoryCount := func() uint64 {
		si, err := advisories.Info(ctx)
		if err != nil {
			t.Fatalf("advisories Info: %v", err)
		}
		return si.State.Msgs
	}
	eventually(t, 5*time.Second, "max deliveries advisory to be stored", func() bool {
		if m, err := tf.f.FetchTile(ctx, 200*time.Millisecond); err != nil || m != nil {
			t.Fatalf("message delivered beyond MaxDeliver (err %v)", err)
		}
		return advisoryCount() == 1
	})
	// An advisory for a message that is already gone (acked late by a worker that finished it) is settled
	// without a dead letter.
	fake := fmt.Sprintf(`{"type":"io.nats.jetstream.advisory.v1.max_deliver","stream":"TILES","consumer":"workers","stream_seq":%d,"deliveries":2}`, 999)
	if _, err := tf.f.JS.Publish(ctx, maxDeliveriesSubject, []byte(fake)); err != nil {
		t.Fatalf("publishing fake advisory: %v", err)
	}
	// A live message stays in flight, unacked, while the watchers run: it must not be touched.
	if _, err := tf.f.Publish(ctx, SubjectRender, "in-flight", []byte("live"), nil); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	held := mustFetch(t, tf.f, 3*time.Second)
	if got := held.Headers().Get(jetstream.MsgIDHeader); got != "in-flight" {
		t.Fatalf("fetched %q, want in-flight", got)
	}

	// Two coordinators watch at once: the dead letter is produced exactly once.
	dead1, _ := startWatcher(t, tf, "watcher-1")
	dead2, _ := startWatcher(t, tf, "watcher-2")
	var got []api.DeadLetter
	timeout := time.After(10 * time.Second)
	for len(got) == 0 {
		select {
		case dl := <-dead1:
			got = append(got, dl)
		case dl := <-dead2:
			got = append(got, dl)
		case <-timeout:
			t.Fatalf("the stored advisory was not handled within 10s")
		}
	}
	dl := got[0]
	if dl.MsgID != "dead" || dl.Reason != reasonMaxDelivers || string(dl.Data) != "dead" ||
		dl.Subject != SubjectRender || dl.Deliveries != 2 {
		t.Fatalf("dead letter = %+v", dl)
	}
	eventually(t, 5*time.Second, "both advisories to be settled", func() bool { return advisoryCount() == 0 })
	select {
	case dl := <-dead1:
		t.Fatalf("second dead letter: %+v", dl)
	case dl := <-dead2:
		t.Fatalf("second dead letter: %+v", dl)
	default:
	}
	if n := tilesCount(t, tf.f); n != 1 {
		t.Fatalf("TILES holds %d messages, want only the held one", n)
	}
	if err := held.DoubleAck(ctx); err != nil {
		t.Fatalf("DoubleAck held message: %v", err)
	}
	if list, err := tf.f.ListDeadLetters(ctx); err != nil || len(list) != 1 || list[0].MsgID != "dead" {
		t.Fatalf("DLQ = %+v, %v; want only dead", list, err)
	}
}

func TestDeadLetterNowCopiesThenTerms(t *testing.T) {
	t.Parallel()
	tf := startFarm(t, fastConfig()) // AckWait 1s
	ctx := testCtx(t)
	hdr := nats.Header{"Tile-Key": []string{"k"}}
	if _, err := tf.f.Publish(ctx, SubjectAssemble, "assemble:f1", []byte("asm"), hdr); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	m, err := tf.f.FetchAssembly(ctx, 3*time.Second)
	if err != nil || m == nil {
		t.Fatalf("FetchAssembly = %v, %v", m, err)
	}
	md, _ := m.Metadata()
	if err := tf.f.DeadLetterNow(ctx, m, "invalid scene: unknown material"); err != nil {
		t.Fatalf("DeadLetterNow: %v", err)
	}
	eventually(t, 5*time.Second, "terminated message to leave TILES", func() bool { return tilesCount(t, tf.f) == 0 })
	if m, err := tf.f.FetchAssembly(ctx, 1500*time.Millisecond); err != nil || m != nil {
		t.Fatalf("terminated message delivered again (err %v)", err)
	}
	list, err := tf.f.ListDeadLetters(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("ListDeadLetters = %d, %v; want 1", len(list), err)
	}
	dl := list[0]
	if dl.Subject != SubjectAssemble || dl.MsgID != "assemble:f1" || dl.Reason != "invalid scene: unknown material" ||
		dl.Deliveries != 1 || dl.StreamSeq != md.Sequence.Stream || string(dl.Data) != "asm" || nats.Header(dl.Header).Get("Tile-Key") != "k" {
		t.Fatalf("dead letter = %+v", dl)
	}
	raw, err := tf.f.DLQ.GetMsg(ctx, dl.DLQSeq)
	if err != nil {
		t.Fatalf("DLQ.GetMsg: %v", err)
	}
	if raw.Subject != "dlq."+SubjectAssemble || raw.Header.Get(jetstream.MsgIDHeader) != deadLetterMsgID(dl.StreamSeq, "assemble:f1") {
		t.Fatalf("DLQ message on %q with msg id %q", raw.Subject, raw.Header.Get(jetstream.MsgIDHeader))
	}
	// Copying the same TILES message again (a repeated advisory, a second watcher) is deduplicated.
	if _, err := tf.f.storeDeadLetter(ctx, dl); err != nil {
		t.Fatalf("storeDeadLetter again: %v", err)
	}
	if list, err := tf.f.ListDeadLetters(ctx); err != nil || len(list) != 1 {
		t.Fatalf("DLQ after repeated copy = %d, %v; want 1", len(list), err)
	}
}

func TestRequeueRejectsUnknownSequence(t *testing.T) {
	t.Parallel()
	tf := startFarm(t, fastConfig())
	if _, err := tf.f.RequeueDeadLetter(testCtx(t), 42); !errors.Is(err, ErrDeadLetterNotFound) {
		t.Fatalf("RequeueDeadLetter(42) = %v, want ErrDeadLetterNotFound", err)
	}
}

// A watcher whose onDead fails keeps the message in TILES and tries again; the DLQ still holds
// exactly one copy.
func TestOnDeadFailureIsRetried(t *testing.T) {
	t.Parallel()
	cfg := fastConfig()
	cfg.MaxDeliver = 2
	tf := startFarm(t, cfg)
	ctx := testCtx(t)
	nc := tf.connect(t, "flaky-watcher")
	calls := make(chan uint64, 8)
	var n atomic.Int32
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_ = tf.f.WatchDeadLetters(wctx, nc, recordFunc(func(dl api.DeadLetter) error {
			calls <- dl.StreamSeq
			if n.Add(1) == 1 {
				// Still in TILES while onDead runs.
				if _, err := tf.f.Tiles.GetMsg(ctx, dl.StreamSeq); err != nil {
					t.Errorf("message gone from TILES during onDead: %v", err)
				}
				return errors.New("projection unavailable")
			}
			return nil
		}))
	}()
	if _, err := tf.f.Publish(ctx, SubjectRender, "tile-flaky", []byte("payload"), nil); err != nil {
		t.Fatal(err)
	}
	seq := nakUntilDead(t, tf.f, "tile-flaky")
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; i < 2; {
		select {
		case got := <-calls:
			if got != seq {
				t.Fatalf("onDead for seq %d, want %d", got, seq)
			}
			i++
			continue
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("onDead called %d times, want a retry after the failure", i)
		}
		// Keep pulling, as workers do: the server raises the advisory on a redelivery attempt.
		if m, err := tf.f.FetchTile(ctx, 300*time.Millisecond); err != nil || m != nil {
			t.Fatalf("message delivered beyond MaxDeliver (err %v)", err)
		}
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		_, err := tf.f.Tiles.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("message still in TILES after a successful onDead: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	dls, err := tf.f.ListDeadLetters(ctx)
	if err != nil || len(dls) != 1 {
		t.Fatalf("dead letters %v (%v), want exactly one", dls, err)
	}
}

// promotedHandler reports every message promoted.
type promotedHandler struct{ seen chan uint64 }

func (h promotedHandler) Promoted(_ context.Context, dl api.DeadLetter) (bool, error) {
	h.seen <- dl.StreamSeq
	return true, nil
}
func (promotedHandler) Record(context.Context, api.DeadLetter) error {
	return errors.New("a promoted message must not be recorded as dead")
}

// Nothing promoted is ever dead-lettered: a message whose work is done after all is deleted
// from TILES with no DLQ copy.
func TestPromotedMessageIsNotDeadLettered(t *testing.T) {
	t.Parallel()
	cfg := fastConfig()
	cfg.MaxDeliver = 2
	tf := startFarm(t, cfg)
	ctx := testCtx(t)
	nc := tf.connect(t, "watcher")
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	h := promotedHandler{seen: make(chan uint64, 4)}
	go func() { _ = tf.f.WatchDeadLetters(wctx, nc, h) }()
	if _, err := tf.f.Publish(ctx, SubjectRender, "tile-done", []byte("payload"), nil); err != nil {
		t.Fatal(err)
	}
	seq := nakUntilDead(t, tf.f, "tile-done")
	deadline := time.Now().Add(20 * time.Second)
	for got := uint64(0); got != seq; {
		select {
		case got = <-h.seen:
		default:
			if time.Now().After(deadline) {
				t.Fatal("watcher never asked whether the message was promoted")
			}
			if m, err := tf.f.FetchTile(ctx, 300*time.Millisecond); err != nil || m != nil {
				t.Fatalf("message delivered beyond MaxDeliver (err %v)", err)
			}
		}
	}
	eventually(t, 10*time.Second, "promoted message to leave TILES", func() bool { return tilesCount(t, tf.f) == 0 })
	if dls, err := tf.f.ListDeadLetters(ctx); err != nil || len(dls) != 0 {
		t.Fatalf("dead letters %v (%v), want none for promoted work", dls, err)
	}
}
