package coordinator

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/client"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/internal/natstest"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/internal/scene/jsonscene"
	"github.com/tilefarm/tilefarm/internal/wire"
	"github.com/tilefarm/tilefarm/objstore"
	"github.com/tilefarm/tilefarm/raster"
	"github.com/tilefarm/tilefarm/tiles"
)

// shotScene is the animated example scene; it has cameras "orbit" (default) and "top".
const shotScene = "../../examples/shot/scene.json"

// harness is a coordinator on a real embedded JetStream server, a real bbolt file and a
// filesystem object store, all in temp dirs. Its loops are not running: tests drive Submit,
// the relay, events, the watcher and the reconciler directly, so each step can be inspected.
type harness struct {
	c       *Coordinator
	st      *coorddb.DB
	objects *countingStore
	queue   *queue.Queue
	js      jetstream.JetStream
	m       *metrics.Coordinator
	ctx     context.Context
	version string // the shot scene, uploaded
}

// countingStore counts List calls, so tests can check what the reconciler costs.
type countingStore struct {
	objstore.Store
	lists atomic.Int64
}

func (s *countingStore) List(ctx context.Context, prefix string) ([]objstore.ObjectInfo, error) {
	s.lists.Add(1)
	return s.Store.List(ctx, prefix)
}

func newHarness(t *testing.T, cfg Config) *harness {
	t.Helper()
	return newHarnessQueue(t, cfg, queue.DefaultConfig())
}

func newHarnessQueue(t *testing.T, cfg Config, qcfg queue.Config) *harness {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return buildHarness(t, ctx, cfg, qcfg, slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})))
}

// buildHarness assembles a harness for any testing.TB (a fuzz target builds one on its
// *testing.F and every input shares it), with the shot scene uploaded.
func buildHarness(tb testing.TB, ctx context.Context, cfg Config, qcfg queue.Config, log *slog.Logger) *harness {
	tb.Helper()
	dir := tb.TempDir()
	nc, js, _ := natstest.InProcess(tb)
	f, err := queue.Setup(ctx, js, qcfg)
	if err != nil {
		tb.Fatalf("queue.Setup: %v", err)
	}
	f.Log = log
	fs, err := objstore.NewFSStore(filepath.Join(dir, "store"))
	if err != nil {
		tb.Fatalf("NewFSStore: %v", err)
	}
	objects := &countingStore{Store: fs}
	st, err := coorddb.Open(filepath.Join(dir, "coordinator.db"))
	if err != nil {
		tb.Fatalf("coorddb.Open: %v", err)
	}
	tb.Cleanup(func() { _ = st.Close() })
	m := metrics.NewCoordinator(metrics.NewRegistry())
	h := &harness{c: New(cfg, Deps{DB: st, Queue: f, Kinds: scene.Kinds{jsonscene.Kind{}}, NATS: nc, Objects: objects, Metrics: m, Log: log}),
		st: st, objects: objects, queue: f, js: js, m: m, ctx: ctx}
	// A harness not run is its farm's only coordinator: it writes its records directly and
	// serves writes (run hands both to terms of leadership).
	st.SetJournal(nil)
	h.c.journal.leading.Store(true)
	b, err := jsonscene.ReadFile(ctx, shotScene)
	if err != nil {
		tb.Fatalf("ReadFile: %v", err)
	}
	h.version = b.Version()
	if _, err := client.UploadScene(ctx, h.c, b, 0, nil); err != nil {
		tb.Fatalf("PutScene: %v", err)
	}
	return h
}

// shotBundle reads the example scene with its mesh.
func shotBundle(t *testing.T) *bundle.Bundle {
	t.Helper()
	b, err := jsonscene.ReadFile(t.Context(), shotScene)
	if err != nil {
		t.Fatalf("ReadFile: %v", err)
	}
	return b
}

func (h *harness) putScene(t *testing.T, b *bundle.Bundle) string {
	t.Helper()
	v := b.Version()
	if _, err := client.UploadScene(h.ctx, h.c, b, 0, nil); err != nil {
		t.Fatalf("PutScene: %v", err)
	}
	return v
}

// request asks for frames first-last of the shot at width x height in size-px tiles.
// run runs the coordinator until the test ends.
func (h *harness) run(t *testing.T) {
	h.c.journal.leading.Store(false)
	h.st.SetJournal(h.c.journal) // from now on only its terms of leadership write
	ctx, cancel := context.WithCancel(h.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = h.c.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
}

func (h *harness) request(first, last, width, height, size int) api.SubmitRequest {
	return api.SubmitRequest{SceneVersion: h.version, First: first, Last: last, Width: width, Height: height,
		SPP: 2, TileSize: size, Formats: []string{"png"}}
}

func (h *harness) submit(t *testing.T, req api.SubmitRequest) api.SubmitResult {
	t.Helper()
	res, err := h.c.Submit(h.ctx, req)
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	return res
}

// submitFrame submits frame 1 of the shot at width x height in size-px tiles, dispatches it
// and returns the submission and the frame's key.
func (h *harness) submitFrame(t *testing.T, width, height, size int) (api.SubmitResult, string) {
	t.Helper()
	res := h.submit(t, h.request(1, 1, width, height, size))
	h.relay(t)
	return res, h.job(t, res.Status.JobID).FrameKey(1)
}

func (h *harness) outbox(t *testing.T) []coorddb.OutboxRecord {
	t.Helper()
	recs, err := h.st.PendingOutbox(h.ctx, 1<<20)
	if err != nil {
		t.Fatalf("PendingOutbox: %v", err)
	}
	return recs
}

// relay publishes everything pending in the outbox, as the relay loop does.
func (h *harness) relay(t *testing.T) {
	t.Helper()
	for {
		recs, err := h.st.PendingOutbox(h.ctx, relayRecords)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			return
		}
		if err := h.c.publishRecords(h.ctx, h.js, recs); err != nil {
			t.Fatalf("publishRecords: %v", err)
		}
	}
}

func (h *harness) job(t *testing.T, id string) *coorddb.Job {
	t.Helper()
	var j *coorddb.Job
	err := h.st.View(h.ctx, func(tx *coorddb.Tx) (err error) {
		j, err = tx.Job(id)
		return err
	})
	if err != nil {
		t.Fatalf("job %s: %v", id, err)
	}
	return j
}

func (h *harness) frame(t *testing.T, key string) *coorddb.Frame {
	t.Helper()
	var f *coorddb.Frame
	err := h.st.View(h.ctx, func(tx *coorddb.Tx) (err error) {
		f, err = tx.Frame(key)
		return err
	})
	if err != nil {
		t.Fatalf("frame %s: %v", key, err)
	}
	return f
}

// tileState returns tile i of frame fk as the projection has it.
func (h *harness) tileState(t *testing.T, fk string, i int) coorddb.TileState {
	t.Helper()
	var s coorddb.TileState
	err := h.st.View(h.ctx, func(tx *coorddb.Tx) error {
		f, err := tx.Frame(fk)
		if err != nil {
			return err
		}
		table, err := tx.TileTable(f)
		if err != nil {
			return err
		}
		s, _ = table.Get(i)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (h *harness) status(t *testing.T, jobID string) api.Status {
	t.Helper()
	st, err := h.c.Status(h.ctx, jobID)
	if err != nil {
		t.Fatalf("Status(%s): %v", jobID, err)
	}
	return st
}

func (h *harness) apply(t *testing.T, evs ...wire.Event) {
	t.Helper()
	for i := range evs {
		if evs[i].Time.IsZero() {
			evs[i].Time = time.Now().UTC()
		}
	}
	if err := h.c.applyEvents(h.ctx, evs); err != nil {
		t.Fatalf("applyEvents: %v", err)
	}
}

// frameTiles derives a frame's tiles.
func frameTiles(t *testing.T, f *coorddb.Frame) []tiles.FrameTile {
	t.Helper()
	ft, err := f.Tiles()
	if err != nil {
		t.Fatalf("tiles of frame %s: %v", f.Key, err)
	}
	return ft
}

// tileEvent is an event of type typ about tile i of frame f, on delivery d of message seq.
func tileEvent(t *testing.T, f *coorddb.Frame, i int, typ string, seq, d uint64) wire.Event {
	t.Helper()
	ft := frameTiles(t, f)
	return wire.Event{ID: fmt.Sprintf("%s:%d:%d:%d", typ, i, seq, d), Type: typ, TileKey: ft[i].Key, TileIndex: i,
		FrameKey: f.Key, Seq: seq, Delivery: d, Attempt: fmt.Sprintf("a%d-%d", seq, d), Worker: "w1"}
}

// completeTiles promotes every tile of frame fk and applies its tile.completed, as workers
// would, tile i reporting (i+1) x 100 ms of rendering.
func (h *harness) completeTiles(t *testing.T, fk string) {
	t.Helper()
	f := h.frame(t, fk)
	var evs []wire.Event
	for i := range frameTiles(t, f) {
		h.promoteTile(t, f, i)
		ev := tileEvent(t, f, i, wire.EventTileCompleted, uint64(i+1), 1)
		ev.RenderMillis = int64(100 * (i + 1))
		evs = append(evs, ev)
	}
	h.apply(t, evs...)
}

// promoteTile creates tile i's manifest in the store, as a worker would.
func (h *harness) promoteTile(t *testing.T, f *coorddb.Frame, i int) {
	t.Helper()
	ft := frameTiles(t, f)
	n := (ft[i].Rect.X1 - ft[i].Rect.X0) * (ft[i].Rect.Y1 - ft[i].Rect.Y0) * 3
	_, err := finalize.Promote(h.ctx, h.objects, layout.TileManifestKey(f.Key, ft[i].Key), "attempt1", identity.BuildFingerprint(),
		[]finalize.Output{{Name: layout.TileOutputName, Data: raster.EncodeTile(make([]float32, n))}}, nil)
	if err != nil {
		t.Fatalf("promoting tile %d: %v", i, err)
	}
}

// promoteFormat creates a frame output manifest, as an assembler would.
func (h *harness) promoteFormat(t *testing.T, fk, format string) {
	t.Helper()
	name, _ := layout.FrameOutputName(format)
	_, err := finalize.Promote(h.ctx, h.objects, layout.FrameManifestKey(fk, format), "attempt1", identity.BuildFingerprint(),
		[]finalize.Output{{Name: name, Data: []byte("frame " + format)}}, nil)
	if err != nil {
		t.Fatalf("promoting %s of frame %s: %v", format, fk, err)
	}
}

// outboxKinds counts pending outbox records by kind.
func (h *harness) outboxKinds(t *testing.T) map[coorddb.OutboxKind]int {
	t.Helper()
	out := map[coorddb.OutboxKind]int{}
	for _, r := range h.outbox(t) {
		out[r.Kind]++
	}
	return out
}

// workerSources are the consumers a worker of this coordinator's own build pulls from: where
// the harness's JSON jobs render.
func (h *harness) workerSources(t *testing.T) *queue.Sources {
	t.Helper()
	build := jsonscene.Build()
	return h.queue.Sources(queue.Capabilities{Builds: []string{build}})
}

// publishEvent publishes ev on the EVENTS stream as a worker does, stamped now, for tests that
// run the real event consumer.
func (h *harness) publishEvent(t *testing.T, ev wire.Event) {
	t.Helper()
	ev.Time = time.Now().UTC()
	data, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.queue.Publish(h.ctx, ev.Subject(), "", data, nil); err != nil {
		t.Fatal(err)
	}
}
