package queue

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Property: hand-backs are free. A message handed back more often than MaxDeliver is still
// delivered (the server counts no limit), its tally says why each delivery ended, and a dead
// letter copied by DeadLetterNow requeues under a fresh id with a fresh tally.
func TestHandBacksSpendNoDeliveriesAndDeadLettersRequeue(t *testing.T) {
	t.Parallel()
	cfg := fastConfig()
	cfg.MaxDeliver = 2
	tf := startFarm(t, cfg)
	ctx := testCtx(t)
	hdr := nats.Header{"Tile-Key": []string{"frame1.0_0_64_64"}}
	if _, err := tf.f.Publish(ctx, SubjectRender, "tile-dead", []byte("payload"), hdr); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	const handBacks = 5 // more than MaxDeliver
	for attempt := 1; attempt <= handBacks; attempt++ {
		m := mustFetch(t, tf.f, 3*time.Second)
		if d := deliveries(t, m); d != uint64(attempt) {
			t.Fatalf("attempt %d has delivery count %d", attempt, d)
		}
		tf.f.HandBack(ctx, m, 0)
	}
	if tally, err := tf.f.Failures.Count(ctx, "tile-dead"); err != nil || tally != (Tally{HandBacks: handBacks}) {
		t.Fatalf("tally after %d hand-backs = %+v, %v", handBacks, tally, err)
	}
	if n, err := tf.f.Failures.Add(ctx, "tile-dead"); err != nil || n != 1 {
		t.Fatalf("a failure after hand-backs counts %d, %v; want 1", n, err)
	}
	m := mustFetch(t, tf.f, 3*time.Second)
	if d := deliveries(t, m); d != handBacks+1 {
		t.Fatalf("delivery after %d hand-backs is number %d", handBacks, d)
	}
	seq, _ := m.Metadata()
	if err := tf.f.DeadLetterNow(ctx, m, reasonMaxDelivers); err != nil {
		t.Fatalf("DeadLetterNow: %v", err)
	}
	eventually(t, 5*time.Second, "dead message to leave TILES", func() bool { return tilesCount(t, tf.f) == 0 })
	list, err := tf.f.ListDeadLetters(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("ListDeadLetters = %v, %v; want 1", list, err)
	}
	dl := list[0]
	if dl.StreamSeq != seq.Sequence.Stream || dl.MsgID != "tile-dead" || dl.Subject != SubjectRender || dl.Reason != reasonMaxDelivers ||
		dl.Deliveries != handBacks+1 || string(dl.Data) != "payload" || nats.Header(dl.Header).Get("Tile-Key") != "frame1.0_0_64_64" ||
		dl.Time.IsZero() || len(dl.Header) != 1 {
		t.Fatalf("listed dead letter = %+v", dl)
	}

	// Requeue: back on TILES under a fresh id, gone from the DLQ, with a fresh tally.
	if _, err := tf.f.RequeueDeadLetter(ctx, dl.DLQSeq); err != nil {
		t.Fatalf("RequeueDeadLetter: %v", err)
	}
	if list, err := tf.f.ListDeadLetters(ctx); err != nil || len(list) != 0 {
		t.Fatalf("DLQ after requeue = %d entries, %v; want empty", len(list), err)
	}
	m = mustFetch(t, tf.f, 3*time.Second)
	wantID := fmt.Sprintf("tile-dead:requeue:%d", dl.DLQSeq)
	if string(m.Data()) != "payload" || m.Subject() != SubjectRender || m.Headers().Get(jetstream.MsgIDHeader) != wantID ||
		m.Headers().Get("Tile-Key") != "frame1.0_0_64_64" || m.Headers().Get(HeaderLastError) != "" || deliveries(t, m) != 1 {
		t.Fatalf("requeued message = %q on %q headers %v delivery %d", m.Data(), m.Subject(), m.Headers(), deliveries(t, m))
	}
	if tally, err := tf.f.Failures.Count(ctx, wantID); err != nil || tally != (Tally{}) {
		t.Fatalf("requeued message starts with tally %+v, %v", tally, err)
	}
	if err := m.DoubleAck(ctx); err != nil {
		t.Fatalf("DoubleAck: %v", err)
	}
	if _, err := tf.f.RequeueDeadLetter(ctx, dl.DLQSeq); !errors.Is(err, ErrDeadLetterNotFound) {
		t.Fatalf("second requeue = %v, want ErrDeadLetterNotFound", err)
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
	m, err := tf.f.Sources(Capabilities{}).FetchAssembly(ctx, 3*time.Second)
	if err != nil || m == nil {
		t.Fatalf("FetchAssembly = %v, %v", m, err)
	}
	md, _ := m.Metadata()
	if err := tf.f.DeadLetterNow(ctx, m, "invalid scene: unknown material"); err != nil {
		t.Fatalf("DeadLetterNow: %v", err)
	}
	eventually(t, 5*time.Second, "terminated message to leave TILES", func() bool { return tilesCount(t, tf.f) == 0 })
	if m, err := tf.f.Sources(Capabilities{}).FetchAssembly(ctx, 1500*time.Millisecond); err != nil || m != nil {
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
	// Copying the same TILES message again (a crash between copy and term) is deduplicated.
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
