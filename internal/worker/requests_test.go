package worker

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/wire"
	"github.com/tilefarm/tilefarm/objstore"
)

// maxStoreRequestsPerTile is what the first dispatch of a tile may cost in store requests,
// from its delivery to its frame's assembly (docs/design.md, "Store requests of a tile"): its
// upload, its manifest, and one read by the assembly.
const maxStoreRequestsPerTile = 3

// Property: the first dispatch of a tile, delivered once, costs at most three store requests
// naming the tile (no manifest check, no remote checkpoint lookup, no read-back; the assembly
// reads the object its worker reported, not the manifest), and the frame assembled from it
// holds the tile's pixels. Requests of the frame as a whole (its scene, its own manifests)
// are not the tile's and are reported beside.
func TestFirstDispatchCostsThreeStoreRequestsPerTile(t *testing.T) {
	h := newRunHarness(t)
	counting := objstore.NewCounting(h.objects)
	w, _ := h.workerOn(t, Config{}, counting)
	job := h.job()
	job.First = true
	h.deliver(t, w, job)
	var completed *wire.Event
	for _, ev := range h.events(t) {
		if ev.Type == wire.EventTileCompleted && ev.TileKey == job.TileKey {
			completed = &ev
		}
	}
	if completed == nil || completed.Object == nil {
		t.Fatalf("no tile.completed reporting the promoted object:\n%s", h.logs)
	}
	asm := wire.AssembleJob{JobID: job.JobID, FrameKey: job.FrameKey, SceneVersion: job.SceneVersion, Settings: job.Settings,
		Frame: job.Frame, TileSize: 32, Formats: []string{"png"}, TileBuild: completed.Object.Build,
		TileObjects: []string{completed.Object.Attempt + ":" + completed.Object.SHA256}}
	data, err := json.Marshal(asm)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.queue.Publish(h.ctx, queue.SubjectAssemble, "assemble:"+job.FrameKey, data, nil); err != nil {
		t.Fatal(err)
	}
	msg, err := h.queue.Sources(queue.Capabilities{}).FetchAssembly(h.ctx, 2*time.Second)
	if err != nil || msg == nil {
		t.Fatalf("FetchAssembly = %v, %v", msg, err)
	}
	w.handle(h.ctx, msg)
	if !strings.Contains(h.logs.String(), `msg="frame assembled"`) {
		t.Fatalf("the frame was not assembled:\n%s", h.logs)
	}
	var tile, frame []objstore.Request
	for _, r := range counting.Requests() {
		if strings.Contains(r.Key, job.TileKey) {
			tile = append(tile, r)
		} else {
			frame = append(frame, r)
		}
	}
	t.Logf("store requests: %d naming the tile %v; %d of the frame %v", len(tile), tile, len(frame), frame)
	if len(tile) > maxStoreRequestsPerTile {
		t.Fatalf("the first dispatch of a tile cost %d store requests, more than %d: %v", len(tile), maxStoreRequestsPerTile, tile)
	}
	if !slices.ContainsFunc(tile, func(r objstore.Request) bool { return r.Kind == "Get" }) {
		t.Fatalf("the assembly never read the tile: %v", tile)
	}
	// It read the object its worker reported, not the manifest (the e2e tests check the
	// frames it assembles so against the reference, pixel for pixel).
	if strings.Contains(h.logs.String(), "reading the tile through its manifest") ||
		slices.Contains(tile, objstore.Request{Kind: "Get", Key: finalize.ManifestKey(layout.TileManifestKey(job.FrameKey, job.TileKey))}) {
		t.Fatalf("the assembly read the tile's manifest: %v\n%s", tile, h.logs)
	}
}

// Property: a stale first copy of a tile, left queued in its old band when its job moved to
// another, is checked as a redelivery is once its frame is marked (queue.Dropped.MarkCopies):
// the tile promoted from its new copy is acked as a duplicate, not rendered again.
func TestStaleFirstCopyOfAMovedFrameIsChecked(t *testing.T) {
	h := newRunHarness(t)
	w, _ := h.worker(t, Config{})
	job := h.job()
	job.First = true
	h.deliver(t, w, job)
	if n := strings.Count(h.logs.String(), `msg="tile promoted"`); n != 1 {
		t.Fatalf("%d promotions of the first copy:\n%s", n, h.logs)
	}
	if err := h.queue.Dropped.MarkCopies(h.ctx, job.FrameKey); err != nil {
		t.Fatal(err)
	}
	stale := job
	stale.JobID = "job-stale" // a message of its own, not absorbed by the dedup window
	data, err := json.Marshal(stale)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.queue.Publish(h.ctx, queue.SubjectRender, job.TileKey+":copy", data, nil); err != nil {
		t.Fatal(err)
	}
	msg, err := h.queue.Sources(queue.Capabilities{}).FetchTile(h.ctx, 2*time.Second)
	if err != nil || msg == nil {
		t.Fatalf("FetchTile = %v, %v", msg, err)
	}
	w.handle(h.ctx, msg)
	if n := strings.Count(h.logs.String(), `msg="tile promoted"`); n != 1 || !strings.Contains(h.logs.String(), "tile already promoted; acking duplicate delivery") {
		t.Fatalf("the stale copy was rendered again (%d promotions):\n%s", n, h.logs)
	}
}
