package coordinator

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/internal/store"
)

// waitOutboxEmpty polls until the relay has drained the outbox.
func waitOutboxEmpty(t *testing.T, h *harness) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		n, err := h.st.OutboxLen(h.ctx)
		if err != nil {
			t.Fatalf("OutboxLen: %v", err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("outbox still has %d records after 20s", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func dedupCount(t *testing.T, m *metrics.Metrics) float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetValue() == metrics.LayerPublishDedup && mt.GetCounter() != nil {
					return mt.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func TestRelayPublishesOutboxInOrderWithTileKeyMsgID(t *testing.T) {
	h := newHarness(t, Config{})
	h.submit(t, smallRequest(t, 1, 2, 64, 64, 32))
	recs := h.outbox(t)

	ctx, cancel := context.WithCancel(h.ctx)
	done := make(chan error, 1)
	go func() { done <- h.c.relay(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay returned %v after cancel, want nil", err)
		}
	})

	waitOutboxEmpty(t, h)
	depth, _, err := h.farm.Depth(h.ctx)
	if err != nil {
		t.Fatalf("Depth: %v", err)
	}
	if depth != uint64(len(recs)) {
		t.Fatalf("TILES holds %d messages, want %d (one per outbox record)", depth, len(recs))
	}
	for i, r := range recs {
		msg, err := h.farm.Tiles.GetMsg(h.ctx, uint64(i+1))
		if err != nil {
			t.Fatalf("GetMsg(%d): %v", i+1, err)
		}
		if msg.Subject != r.Subject || msg.Header.Get(jetstream.MsgIDHeader) != r.MsgID || string(msg.Data) != string(r.Data) {
			t.Errorf("stream message %d = %s %s, want outbox record %d (%s %s)", i+1, msg.Subject, msg.Header.Get(jetstream.MsgIDHeader), i, r.Subject, r.MsgID)
		}
	}

	// A crash after the PubAck but before the delete leaves the records to publish again:
	// JetStream's dedup window answers Duplicate and nothing is enqueued twice.
	err = h.st.Update(h.ctx, func(tx *store.Tx) error {
		for _, r := range recs[:3] {
			if err := tx.AddOutbox(r.Subject, r.MsgID, r.Data); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("re-adding records: %v", err)
	}
	h.c.kickRelay()
	waitOutboxEmpty(t, h)
	if depth2, _, err := h.farm.Depth(h.ctx); err != nil || depth2 != depth {
		t.Errorf("TILES depth %d after republishing, want %d (deduplicated)", depth2, depth)
	}
	if got := dedupCount(t, h.m); got != 3 {
		t.Errorf("publish-dedup counter = %v, want 3", got)
	}
}
