package queue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestSetupIsIdempotentAndConfiguresStreams(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.DedupWindow = 7 * time.Minute
	cfg.AckWait = 9 * time.Second
	cfg.MaxDeliver = 4
	cfg.LeaseTTL = 11 * time.Second
	tf := startFarm(t, cfg)
	ctx := testCtx(t)

	if _, err := tf.f.Publish(ctx, SubjectRender, "before-second-setup", []byte("x"), nil); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	f2, err := Setup(ctx, tf.f.JS, cfg)
	if err != nil {
		t.Fatalf("second Setup: %v", err)
	}
	if n := tilesCount(t, f2); n != 1 {
		t.Fatalf("second Setup changed TILES contents: %d messages, want 1", n)
	}

	tiles, err := f2.Tiles.Info(ctx)
	if err != nil {
		t.Fatalf("Tiles.Info: %v", err)
	}
	if tiles.Config.Retention != jetstream.WorkQueuePolicy {
		t.Errorf("TILES retention = %v, want work queue", tiles.Config.Retention)
	}
	if tiles.Config.Duplicates != cfg.DedupWindow {
		t.Errorf("TILES dedup window = %v, want %v", tiles.Config.Duplicates, cfg.DedupWindow)
	}
	if tiles.Config.Storage != jetstream.FileStorage {
		t.Errorf("TILES storage = %v, want file", tiles.Config.Storage)
	}
	events, err := f2.Events.Info(ctx)
	if err != nil {
		t.Fatalf("Events.Info: %v", err)
	}
	if events.Config.Retention != jetstream.LimitsPolicy || events.Config.Duplicates != cfg.DedupWindow || events.Config.MaxAge < cfg.DedupWindow {
		t.Errorf("EVENTS config = retention %v dedup %v max age %v", events.Config.Retention, events.Config.Duplicates, events.Config.MaxAge)
	}
	dlq, err := f2.DLQ.Info(ctx)
	if err != nil {
		t.Fatalf("DLQ.Info: %v", err)
	}
	if dlq.Config.Retention != jetstream.LimitsPolicy || dlq.Config.MaxAge != 0 {
		t.Errorf("DLQ config = retention %v max age %v, want limits and no expiry", dlq.Config.Retention, dlq.Config.MaxAge)
	}
	ci, err := f2.Bands[BandNormal].Info(ctx)
	if err != nil {
		t.Fatalf("Consumer.Info: %v", err)
	}
	if ci.Config.Durable != ConsumerWorkers || ci.Config.AckPolicy != jetstream.AckExplicitPolicy ||
		ci.Config.AckWait != cfg.AckWait || ci.Config.MaxDeliver != -1 || ci.Config.Metadata[MetaMaxDeliver] != strconv.Itoa(cfg.MaxDeliver) ||
		ci.Config.MaxAckPending < 10000 {
		t.Errorf("consumer config = %+v", ci.Config)
	}
	st, err := f2.Leases.kv.Status(ctx)
	if err != nil {
		t.Fatalf("kv.Status: %v", err)
	}
	if st.TTL() != cfg.LeaseTTL || st.History() != 1 {
		t.Errorf("leases bucket ttl %v history %d, want %v and 1", st.TTL(), st.History(), cfg.LeaseTTL)
	}
	// The dropped frames are bounded: a mark outlives no events retention.
	if ds, err := f2.Dropped.kv.Status(ctx); err != nil || ds.TTL() != EventsRetention {
		t.Errorf("dropped bucket ttl %v (%v), want %v", ds.TTL(), err, EventsRetention)
	}

	// A changed config is applied by the next Setup.
	cfg.MaxDeliver = 6
	cfg.Backoff = []time.Duration{2 * time.Second, 4 * time.Second}
	f3, err := Setup(ctx, tf.f.JS, cfg)
	if err != nil {
		t.Fatalf("Setup with new config: %v", err)
	}
	ci, err = f3.Bands[BandNormal].Info(ctx)
	if err != nil {
		t.Fatalf("Consumer.Info: %v", err)
	}
	if ci.Config.Metadata[MetaMaxDeliver] != "6" || len(ci.Config.BackOff) != 2 || ci.Config.AckWait != 2*time.Second {
		t.Errorf("updated consumer config = max deliver %q backoff %v ack wait %v (want Backoff[0])",
			ci.Config.Metadata[MetaMaxDeliver], ci.Config.BackOff, ci.Config.AckWait)
	}
	if _, err := Setup(ctx, tf.f.JS, Config{}); err == nil {
		t.Errorf("Setup accepted a zero Config")
	}
}

func TestPublishDeduplicatesByMsgID(t *testing.T) {
	t.Parallel()
	tf := startFarm(t, fastConfig())
	ctx := testCtx(t)
	hdr := nats.Header{"Tile-Key": []string{"k1"}}
	dup, err := tf.f.Publish(ctx, SubjectRender, "tile-1", []byte("one"), hdr)
	if err != nil || dup {
		t.Fatalf("first Publish = %v, %v; want not duplicate", dup, err)
	}
	if len(hdr) != 1 {
		t.Fatalf("Publish mutated the caller's header: %v", hdr)
	}
	dup, err = tf.f.Publish(ctx, SubjectRender, "tile-1", []byte("one again"), hdr)
	if err != nil || !dup {
		t.Fatalf("second Publish = %v, %v; want duplicate", dup, err)
	}
	dup, err = tf.f.Publish(ctx, SubjectRender, "tile-2", []byte("two"), nil)
	if err != nil || dup {
		t.Fatalf("other id Publish = %v, %v; want not duplicate", dup, err)
	}
	if n := tilesCount(t, tf.f); n != 2 {
		t.Fatalf("TILES holds %d messages, want 2", n)
	}
	m := mustFetch(t, tf.f, 2*time.Second)
	if string(m.Data()) != "one" || m.Headers().Get("Tile-Key") != "k1" || m.Headers().Get(jetstream.MsgIDHeader) != "tile-1" {
		t.Fatalf("fetched %q with headers %v, want the first publish", m.Data(), m.Headers())
	}
	// Without a msg id nothing is deduplicated (events, whose consumer is idempotent).
	for range 2 {
		if dup, err := tf.f.Publish(ctx, "events.tile.started", "", []byte("x"), nil); err != nil || dup {
			t.Fatalf("Publish without msg id = %v, %v", dup, err)
		}
	}
	info, err := tf.f.Events.Info(ctx)
	if err != nil || info.State.Msgs != 2 {
		t.Fatalf("EVENTS holds %d messages (%v), want both", info.State.Msgs, err)
	}
}

func TestFetchAckAndDepth(t *testing.T) {
	t.Parallel()
	tf := startFarm(t, fastConfig())
	ctx := testCtx(t)

	if m, err := tf.f.Sources(Capabilities{}).FetchTile(ctx, 200*time.Millisecond); err != nil || m != nil {
		t.Fatalf("FetchTile on empty stream = %v, %v; want nil, nil", m, err)
	}
	if n, age, err := tf.f.Depth(ctx); err != nil || n != 0 || age != 0 {
		t.Fatalf("Depth on empty stream = %d, %v, %v", n, age, err)
	}
	if _, err := tf.f.Publish(ctx, SubjectRender, "a", []byte("a"), nil); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	eventually(t, 2*time.Second, "oldest age to grow", func() bool {
		_, age, err := tf.f.Depth(ctx)
		return err == nil && age >= 100*time.Millisecond
	})
	m := mustFetch(t, tf.f, 2*time.Second)
	if err := m.DoubleAck(ctx); err != nil {
		t.Fatalf("DoubleAck: %v", err)
	}
	if n := tilesCount(t, tf.f); n != 0 {
		t.Fatalf("acked work-queue message still stored: %d", n)
	}
	if m, err := tf.f.Sources(Capabilities{}).FetchTile(ctx, 1500*time.Millisecond); err != nil || m != nil {
		t.Fatalf("acked message redelivered: %v, %v", m, err)
	}
}

func TestUnackedMessageIsRedelivered(t *testing.T) {
	t.Parallel()
	tf := startFarm(t, fastConfig()) // AckWait 1s
	ctx := testCtx(t)
	if _, err := tf.f.Publish(ctx, SubjectRender, "r", []byte("r"), nil); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	first := mustFetch(t, tf.f, 2*time.Second)
	if d := deliveries(t, first); d != 1 {
		t.Fatalf("first delivery count %d", d)
	}
	// Not acked: after AckWait the same message comes back.
	again := mustFetch(t, tf.f, 3*time.Second)
	if string(again.Data()) != "r" || deliveries(t, again) != 2 {
		t.Fatalf("redelivery = %q delivery %d, want r/2", again.Data(), deliveries(t, again))
	}
	if err := again.DoubleAck(ctx); err != nil {
		t.Fatalf("DoubleAck: %v", err)
	}
}

func TestInProgressExtendsAckWait(t *testing.T) {
	t.Parallel()
	tf := startFarm(t, fastConfig()) // AckWait 1s
	ctx := testCtx(t)
	if _, err := tf.f.Publish(ctx, SubjectRender, "p", []byte("p"), nil); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	m := mustFetch(t, tf.f, 2*time.Second)
	// Keep the message in progress for 3x AckWait, polling the consumer meanwhile: it must not be redelivered.
	start := time.Now()
	for time.Since(start) < 3*time.Second {
		if err := m.InProgress(); err != nil {
			t.Fatalf("InProgress: %v", err)
		}
		if other, err := tf.f.Sources(Capabilities{}).FetchTile(ctx, 300*time.Millisecond); err != nil || other != nil {
			t.Fatalf("message redelivered while in progress after %v (err %v)", time.Since(start), err)
		}
	}
	// Once the heartbeats stop, ack-wait runs out and it is redelivered.
	again := mustFetch(t, tf.f, 3*time.Second)
	if deliveries(t, again) != 2 {
		t.Fatalf("redelivery count %d, want 2", deliveries(t, again))
	}
	if err := again.DoubleAck(ctx); err != nil {
		t.Fatalf("DoubleAck: %v", err)
	}
}

func TestFetchTileHonoursContext(t *testing.T) {
	t.Parallel()
	tf := startFarm(t, fastConfig())
	ctx, cancel := context.WithCancel(testCtx(t))
	time.AfterFunc(300*time.Millisecond, cancel)
	start := time.Now()
	m, err := tf.f.Sources(Capabilities{}).FetchTile(ctx, 2*time.Second)
	if m != nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("FetchTile with cancelled ctx = %v, %v; want context.Canceled", m, err)
	}
	if since := time.Since(start); since > 4*time.Second {
		t.Fatalf("FetchTile blocked %v past its 2s wait after cancellation", since)
	}
	if m, err := tf.f.Sources(Capabilities{}).FetchTile(ctx, time.Second); m != nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("FetchTile with an already cancelled ctx = %v, %v; want context.Canceled", m, err)
	}
	if _, err := tf.f.Sources(Capabilities{}).FetchTile(testCtx(t), 0); err == nil {
		t.Fatalf("FetchTile accepted a zero wait")
	}
}

// A pull cancelled by its caller stays open on the server until it expires; a message the
// server delivers meanwhile is handed back at once, never left to time out (which would cost
// an ack-wait and a delivery).
func TestCancelledFetchHandsBackLateDelivery(t *testing.T) {
	t.Parallel()
	cfg := fastConfig()
	cfg.AckWait = 30 * time.Second // a lost delivery would come back only after this
	tf := startFarm(t, cfg)
	ctx, cancel := context.WithCancel(testCtx(t))
	time.AfterFunc(200*time.Millisecond, cancel)
	time.AfterFunc(600*time.Millisecond, func() {
		if _, err := tf.f.Publish(testCtx(t), SubjectRender, "late", []byte("x"), nil); err != nil {
			t.Error(err)
		}
	})
	// One pull that outlives its caller (FetchTile's pulls are shorter than this test's timing).
	if m, err := tf.f.fetchOne(ctx, tf.f.Bands[BandNormal], 2*time.Second); m != nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("fetchOne = %v, %v; want context.Canceled", m, err)
	}
	m := mustFetch(t, tf.f, 3*time.Second)
	if d := deliveries(t, m); d != 2 {
		t.Fatalf("late message came back as delivery %d, want 2 (handed back by the cancelled pull)", d)
	}
}

// Tile and assembly jobs have consumers of their own, so a worker's assembly loop takes an
// assembly at once however many tiles are queued before it.
func TestFetchTakesEachConsumer(t *testing.T) {
	t.Parallel()
	tf := startFarm(t, fastConfig())
	ctx := testCtx(t)
	for i, subj := range []string{SubjectRender, SubjectRender, SubjectAssemble} {
		if _, err := tf.f.Publish(ctx, subj, fmt.Sprintf("m%d", i), []byte(subj), nil); err != nil {
			t.Fatal(err)
		}
	}
	m, err := tf.f.Sources(Capabilities{}).FetchAssembly(ctx, time.Second)
	if err != nil || m == nil || m.Subject() != SubjectAssemble {
		t.Fatalf("FetchAssembly = %v, %v; want the assemble job", m, err)
	}
	_ = m.Ack()
	for range 2 {
		m := mustFetch(t, tf.f, 2*time.Second)
		if m.Subject() != SubjectRender {
			t.Fatalf("FetchTile returned %s", m.Subject())
		}
		_ = m.Ack()
	}
	if m, err := tf.f.Sources(Capabilities{}).FetchAssembly(ctx, 200*time.Millisecond); err != nil || m != nil {
		t.Fatalf("FetchAssembly on an empty consumer = %v, %v", m, err)
	}
}

// The failure budget is counted per message id across workers, and a new id starts afresh.
func TestFailuresCountPerMessage(t *testing.T) {
	t.Parallel()
	tf := startFarm(t, fastConfig())
	ctx := testCtx(t)
	for want := 1; want <= 3; want++ {
		n, err := tf.f.Failures.Add(ctx, "abc:retry:2")
		if err != nil || n != want {
			t.Fatalf("Add #%d = %d, %v", want, n, err)
		}
	}
	if err := tf.f.Failures.HandBack(ctx, "abc:retry:2"); err != nil {
		t.Fatal(err)
	}
	if n, err := tf.f.Failures.Count(ctx, "abc:retry:2"); err != nil || n != (Tally{Failures: 3, HandBacks: 1}) {
		t.Fatalf("Count = %+v, %v; want 3 failures and a hand-back", n, err)
	}
	if n, err := tf.f.Failures.Count(ctx, "abc:requeue:9"); err != nil || n != (Tally{}) {
		t.Fatalf("Count of another id = %+v, %v; want nothing", n, err)
	}
	// Concurrent failures of one message from several workers are all counted.
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			_, err := tf.f.Failures.Add(ctx, "contended")
			errs <- err
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := tf.f.Failures.Count(ctx, "contended"); n.Failures != 8 {
		t.Fatalf("8 concurrent failures counted as %d", n.Failures)
	}
}

// Workers read the failure budget and the lost-delivery limit the coordinator set from the
// consumer's metadata.
func TestOpenReadsMaxFailures(t *testing.T) {
	t.Parallel()
	cfg := fastConfig()
	cfg.MaxFailures, cfg.MaxDeliver = 7, 9
	tf := startFarm(t, cfg)
	js, err := jetstream.New(tf.nc)
	if err != nil {
		t.Fatal(err)
	}
	f, err := Open(testCtx(t), js)
	if err != nil {
		t.Fatal(err)
	}
	if f.Cfg.MaxFailures != 7 || f.Cfg.MaxDeliver != 9 || f.Failures == nil {
		t.Fatalf("Open read max failures %d, max deliver %d (failures bucket %v), want 7 and 9", f.Cfg.MaxFailures, f.Cfg.MaxDeliver, f.Failures)
	}
}

// A frame's mark says dropped or copied: marking a frame's copies keeps a dropped mark, a
// revived frame is marked copied (its dropped copies may queue), and a frame whose messages the
// stream lost loses both.
func TestFrameMarks(t *testing.T) {
	t.Parallel()
	tf := startFarm(t, fastConfig())
	ctx := testCtx(t)
	d := tf.f.Dropped
	if m, err := d.Mark(ctx, "f1"); err != nil || m != (FrameMark{}) {
		t.Fatalf("an unmarked frame: %+v, %v", m, err)
	}
	if err := d.MarkCopies(ctx, "f1"); err != nil {
		t.Fatal(err)
	}
	if m, _ := d.Mark(ctx, "f1"); !m.Copies || m.Dropped {
		t.Fatalf("a copied frame: %+v", m)
	}
	if err := d.Add(ctx, "f2"); err != nil {
		t.Fatal(err)
	}
	if err := d.MarkCopies(ctx, "f2"); err != nil {
		t.Fatal(err)
	}
	if m, _ := d.Mark(ctx, "f2"); !m.Dropped || m.Copies {
		t.Fatalf("a dropped frame marked copied: %+v", m)
	}
	if err := d.Revive(ctx, "f2"); err != nil {
		t.Fatal(err)
	}
	if m, _ := d.Mark(ctx, "f2"); m.Dropped || !m.Copies {
		t.Fatalf("a dropped frame revived, its dropped copies maybe queued: %+v", m)
	}
	if err := d.Remove(ctx, "f1"); err != nil {
		t.Fatal(err)
	}
	if m, _ := d.Mark(ctx, "f1"); m != (FrameMark{}) {
		t.Fatalf("a frame wanted again: %+v", m)
	}
}
