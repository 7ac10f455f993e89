package coordinator

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/wire"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The relay publishes every tile of a frame record with its tile key as dedup id, in tile
// order, and deletes the record; publishing the same record again (a crash before the delete)
// is absorbed by the dedup window and counted.
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
		if job.Index != n%6 || job.TileKey != ft.Key || raw.Header.Get(jetstream.MsgIDHeader) != ft.Key ||
			job.InputHash != identity.InputHash(f.SceneVersion, f.Settings, f.Frame, ft.Rect) || job.JobID != res.Status.JobID {
			t.Fatalf("message %d: %+v with id %s", n+1, job, raw.Header.Get(jetstream.MsgIDHeader))
		}
	}
	// A crash after the PubAcks and before the delete republishes the records.
	if err := h.c.publishRecords(h.ctx, h.js, recs); err != nil {
		t.Fatal(err)
	}
	if info, _ := h.queue.Tiles.Info(h.ctx); info.State.Msgs != 12 {
		t.Fatalf("republishing stored %d messages, want still 12", info.State.Msgs)
	}
	if got := testutil.ToFloat64(h.m.DuplicatesSuppressed.WithLabelValues(metrics.LayerPublishDedup)); got != 12 {
		t.Fatalf("publish dedup counted %v, want 12", got)
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
