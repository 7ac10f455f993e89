package worker

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tilefarm/tilefarm/checkpoint"
	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/failure"
	"github.com/tilefarm/tilefarm/internal/faults"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/logtest"
	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/internal/natstest"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/internal/scene/jsonscene"
	"github.com/tilefarm/tilefarm/internal/wire"
	"github.com/tilefarm/tilefarm/objstore"
	"github.com/tilefarm/tilefarm/raster"
	"github.com/tilefarm/tilefarm/render"
)

// runHarness runs one worker against a real in-process JetStream and a filesystem store, one
// delivery at a time, so a test can set the stage before a tile and look at everything after.
type runHarness struct {
	ctx     context.Context
	queue   *queue.Queue
	js      jetstream.JetStream
	objects *objstore.FSStore
	ckpts   *checkpoint.Local
	bundle  *bundle.Bundle
	scene   *render.Scene
	st      render.Settings
	logs    *logtest.Buffer
}

func newRunHarness(t *testing.T) *runHarness {
	t.Helper()
	return newRunHarnessWith(t, queue.DefaultConfig())
}

// newRunHarnessWith is newRunHarness on a farm set up with cfg.
func newRunHarnessWith(t *testing.T, cfg queue.Config) *runHarness {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	_, js, _ := natstest.InProcess(t)
	f, err := queue.Setup(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	objects, err := objstore.NewFSStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ckpts, err := checkpoint.OpenLocal(filepath.Join(t.TempDir(), "checkpoints.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ckpts.Close() })
	b, err := jsonscene.ReadFile(ctx, "../../examples/cornell/scene.json")
	if err != nil {
		t.Fatal(err)
	}
	storeScene(t, objects, b)
	scene, err := render.ParseScene(b.Scene, b.Assets(t.Context(), 0))
	if err != nil {
		t.Fatal(err)
	}
	st, err := scene.Resolve(render.Overrides{Width: 32, Height: 32, SPP: 8})
	if err != nil {
		t.Fatal(err)
	}
	return &runHarness{ctx: ctx, queue: f, js: js, objects: objects, ckpts: ckpts, bundle: b, scene: scene, st: st, logs: &logtest.Buffer{}}
}

// job is the tile job of the frame's only 32 px tile, as the relay derives it.
func (h *runHarness) job() wire.TileJob {
	r := render.Rect{X1: 32, Y1: 32}
	sv := h.bundle.Version()
	fk := identity.FrameKey(sv, h.st.Camera, 1, identity.SettingsHash(h.st))
	return wire.TileJob{JobID: "job-test", TileKey: identity.TileKey(fk, r), FrameKey: fk, Index: 0, SceneVersion: sv,
		Settings: h.st, Frame: 1, Rect: r, InputHash: identity.InputHash(sv, h.st, 1, r)}
}

func (h *runHarness) worker(t *testing.T, cfg Config) (*Worker, *metrics.Worker) {
	t.Helper()
	return h.workerOn(t, cfg, h.objects)
}

// workerOn is worker on another view of the harness's store (a counting one, say).
func (h *runHarness) workerOn(t *testing.T, cfg Config, objects objstore.Store) (*Worker, *metrics.Worker) {
	t.Helper()
	m := metrics.NewWorker(metrics.NewRegistry())
	cfg.Name = "w1"
	w, err := New(cfg, Deps{Queue: h.queue, Objects: objects, Checkpoints: h.ckpts, Metrics: m,
		Scenes: newScenes(t, objects, "", scene.Kinds{jsonscene.Kind{}}),
		Log:    slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	return w, m
}

// publish publishes job to TILES.
func (h *runHarness) publish(t *testing.T, job wire.TileJob) {
	t.Helper()
	data, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.queue.Publish(h.ctx, queue.SubjectRender, job.TileKey, data, nil); err != nil {
		t.Fatal(err)
	}
}

// publishAndFetch publishes job to TILES and takes its delivery.
func (h *runHarness) publishAndFetch(t *testing.T, job wire.TileJob) jetstream.Msg {
	t.Helper()
	h.publish(t, job)
	msg, err := h.queue.Sources(queue.Capabilities{}).FetchTile(h.ctx, 2*time.Second)
	if err != nil || msg == nil {
		t.Fatalf("FetchTile = %v, %v", msg, err)
	}
	return msg
}

// deliver publishes job to TILES and has w handle its delivery.
func (h *runHarness) deliver(t *testing.T, w *Worker, job wire.TileJob) {
	t.Helper()
	w.handle(h.ctx, h.publishAndFetch(t, job))
}

// events returns every event in EVENTS.
func (h *runHarness) events(t *testing.T) []wire.Event {
	t.Helper()
	info, err := h.queue.Events.Info(h.ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []wire.Event
	for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
		raw, err := h.queue.Events.GetMsg(h.ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		var ev wire.Event
		if err := json.Unmarshal(raw.Data, &ev); err != nil {
			t.Fatal(err)
		}
		out = append(out, ev)
	}
	return out
}

// reference renders the job's tile from scratch.
func (h *runHarness) reference(t *testing.T, job wire.TileJob, to int) *render.Tile {
	t.Helper()
	tile, err := render.NewTile(h.scene, job.Settings, job.Frame, job.Rect)
	if err != nil {
		t.Fatal(err)
	}
	if err := tile.Render(h.ctx, 0, to); err != nil {
		t.Fatal(err)
	}
	return tile
}

// putCheckpoint stores a remote checkpoint of job's tile holding st, made by build, as a
// worker that rendered part of the tile would have left it.
func (h *runHarness) putCheckpoint(t *testing.T, job wire.TileJob, st render.State, build string) {
	t.Helper()
	codec, err := checkpoint.NewCodec()
	if err != nil {
		t.Fatal(err)
	}
	data, err := codec.Encode(checkpoint.Checkpoint{TileKey: job.TileKey, FrameKey: job.FrameKey, InputHash: job.InputHash,
		Next: st.Next, Sum: st.Sum, Build: build, SavedAt: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.objects.Put(h.ctx, layout.CheckpointKey(job.TileKey), data); err != nil {
		t.Fatal(err)
	}
}

// promoted returns the promoted float pixels of the job's tile.
func (h *runHarness) promoted(t *testing.T, job wire.TileJob) []float32 {
	t.Helper()
	m, err := finalize.ReadManifest(h.ctx, h.objects, layout.TileManifestKey(job.FrameKey, job.TileKey))
	if err != nil {
		t.Fatalf("tile manifest: %v", err)
	}
	data, err := finalize.ReadObject(h.ctx, h.objects, m, layout.TileOutputName)
	if err != nil {
		t.Fatal(err)
	}
	pix, err := raster.DecodeTile(data, 32*32*3)
	if err != nil {
		t.Fatal(err)
	}
	return pix
}

func samePixels(t *testing.T, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d floats, want %d", len(got), len(want))
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("float %d = %v, want %v (bit for bit)", i, got[i], want[i])
		}
	}
}

// The manifest is checked again after the lease: a duplicate takes the lease just after the holder promoted and released it. The
// manifest is checked again right after the lease is taken: the duplicate renders nothing and
// acks, and the promoted pixels are the holder's.
func TestManifestCheckedAgainAfterTheLease(t *testing.T) {
	h := newRunHarness(t)
	job := h.job()
	want := h.reference(t, job, job.Settings.SPP).Pixels()
	holderDone := false
	w, m := h.worker(t, Config{Faults: faults.Plan{BeforeLease: func(j wire.TileJob) {
		// The holder promotes between the duplicate's first manifest check and its lease.
		if _, err := finalize.Promote(h.ctx, h.objects, layout.TileManifestKey(j.FrameKey, j.TileKey), "holder", identity.BuildFingerprint(),
			[]finalize.Output{{Name: layout.TileOutputName, Data: raster.EncodeTile(want)}}, nil); err != nil {
			t.Error(err)
		}
		holderDone = true
	}}})
	h.deliver(t, w, job)
	if !holderDone {
		t.Fatal("the fault never ran: the duplicate did not reach its lease")
	}
	for _, ev := range h.events(t) {
		if ev.Type == wire.EventTileStarted {
			t.Fatalf("the duplicate started rendering a promoted tile: %+v", ev)
		}
	}
	if got := testutil.ToFloat64(m.SamplesRendered); got != 0 {
		t.Fatalf("the duplicate rendered %v samples", got)
	}
	if got := testutil.ToFloat64(m.DuplicatesSuppressed.WithLabelValues(metrics.LayerManifestCheck)); got != 1 {
		t.Fatalf("manifest-check duplicates = %v, want 1", got)
	}
	if n, _, _ := h.queue.Depth(h.ctx); n != 0 {
		t.Fatalf("TILES holds %d messages: the duplicate was not acked", n)
	}
	if owner, _, err := h.queue.Leases.Owner(h.ctx, job.TileKey); err != nil || owner != "" {
		t.Fatalf("lease still held by %q (%v)", owner, err)
	}
	samePixels(t, h.promoted(t, job), want)
}

// A remote checkpoint of the right tile and inputs, made by another build, is
// discarded: its floats are never resumed. One made by this build is.
func TestCheckpointOfAnotherBuildIsDiscarded(t *testing.T) {
	for _, c := range []struct {
		name    string
		build   string
		resumed bool
	}{{"other build", "go1.0 other/v9 render/pt-0", false}, {"same build", identity.BuildFingerprint(), true}} {
		t.Run(c.name, func(t *testing.T) {
			h := newRunHarness(t)
			job := h.job()
			half := h.reference(t, job, job.Settings.SPP/2).Export()
			sum := half.Sum
			if !c.resumed {
				// A foreign build's floats differ; make it obvious if they were used.
				sum = make([]float64, len(half.Sum))
				for i := range sum {
					sum[i] = 1e6
				}
			}
			h.putCheckpoint(t, job, render.State{Next: half.Next, Sum: sum}, c.build)
			w, m := h.worker(t, Config{})
			h.deliver(t, w, job)
			var started *wire.Event
			for _, ev := range h.events(t) {
				if ev.Type == wire.EventTileStarted {
					started = &ev
				}
			}
			if started == nil {
				t.Fatal("no tile.started event")
			}
			wantRecovered := 0
			if c.resumed {
				wantRecovered = half.Next
			}
			if started.SamplesRecovered != wantRecovered || int(testutil.ToFloat64(m.SamplesRecovered)) != wantRecovered {
				t.Fatalf("samples recovered %d (metric %v), want %d", started.SamplesRecovered, testutil.ToFloat64(m.SamplesRecovered), wantRecovered)
			}
			if !c.resumed && !strings.Contains(h.logs.String(), "discarding checkpoint made by another build") {
				t.Fatalf("the foreign checkpoint was not reported discarded:\n%s", h.logs.String())
			}
			samePixels(t, h.promoted(t, job), h.reference(t, job, job.Settings.SPP).Pixels())
		})
	}
}

// A message that is not a tile job at all is dead-lettered at once with its error, without
// taking the worker down.
func TestUndecodableJobIsDeadLettered(t *testing.T) {
	h := newRunHarness(t)
	w, _ := h.worker(t, Config{})
	if _, err := h.queue.Publish(h.ctx, queue.SubjectRender, "garbage", []byte("{not json"), nil); err != nil {
		t.Fatal(err)
	}
	msg, err := h.queue.Sources(queue.Capabilities{}).FetchTile(h.ctx, 2*time.Second)
	if err != nil || msg == nil {
		t.Fatalf("FetchTile = %v, %v", msg, err)
	}
	w.handle(h.ctx, msg)
	dls, err := h.queue.ListDeadLetters(h.ctx)
	if err != nil || len(dls) != 1 || !strings.Contains(dls[0].Reason, "decoding tile job") {
		t.Fatalf("dead letters %+v (%v), want the undecodable job with its error", dls, err)
	}
}

// Property: only lost deliveries count toward the MaxDeliver safety net (docs/design.md,
// "Failures, deliveries and the failure budget"). A tile handed back more often than
// MaxDeliver renders when a worker takes it; a tile whose deliveries were lost MaxDeliver
// times (its workers killed before a word) is dead-lettered as max_deliveries by the next
// worker, unrendered.
func TestOnlyLostDeliveriesSpendTheSafetyNet(t *testing.T) {
	cfg := queue.DefaultConfig()
	cfg.MaxDeliver, cfg.AckWait = 2, time.Second
	h := newRunHarnessWith(t, cfg)
	w, _ := h.worker(t, Config{})
	src := h.queue.Sources(queue.Capabilities{})
	fetch := func(id string) jetstream.Msg {
		t.Helper()
		msg, err := src.FetchTile(h.ctx, 5*time.Second)
		if err != nil || msg == nil || msg.Headers().Get(jetstream.MsgIDHeader) != id {
			t.Fatalf("FetchTile = %v, %v; want %s", msg, err, id)
		}
		return msg
	}

	handed := h.job()
	data, _ := json.Marshal(handed)
	if _, err := h.queue.Publish(h.ctx, queue.SubjectRender, handed.TileKey, data, nil); err != nil {
		t.Fatal(err)
	}
	for range cfg.MaxDeliver + 1 {
		h.queue.HandBack(h.ctx, fetch(handed.TileKey), 0)
	}
	w.handle(h.ctx, fetch(handed.TileKey))
	if got, want := h.promoted(t, handed), h.reference(t, handed, h.st.SPP).Pixels(); !slices.Equal(got, want) {
		t.Fatal("the tile handed back more than MaxDeliver times was not rendered as the reference")
	}

	lost := h.job()
	lost.Rect = render.Rect{X1: 16, Y1: 16}
	lost.TileKey = identity.TileKey(lost.FrameKey, lost.Rect)
	data, _ = json.Marshal(lost)
	if _, err := h.queue.Publish(h.ctx, queue.SubjectRender, lost.TileKey, data, nil); err != nil {
		t.Fatal(err)
	}
	for range cfg.MaxDeliver {
		fetch(lost.TileKey) // and never a word: the ack-wait runs out
	}
	w.handle(h.ctx, fetch(lost.TileKey))
	dls, err := h.queue.ListDeadLetters(h.ctx)
	if err != nil || len(dls) != 1 || dls[0].MsgID != lost.TileKey || !strings.Contains(dls[0].Reason, "max deliveries exceeded") {
		t.Fatalf("dead letters %+v (%v), want the tile whose deliveries were lost", dls, err)
	}
	var dead *wire.Event
	for _, ev := range h.events(t) {
		if ev.Type == wire.EventTileFailed && ev.TileKey == lost.TileKey {
			dead = &ev
		}
	}
	if dead == nil || !dead.Terminal || dead.Code != failure.CodeMaxDeliveries {
		t.Fatalf("failure event of the lost tile: %+v", dead)
	}
	if ok, err := finalize.ManifestExists(h.ctx, h.objects, layout.TileManifestKey(lost.FrameKey, lost.TileKey)); err != nil || ok {
		t.Fatalf("the tile whose deliveries were lost was rendered (%v)", err)
	}
}

// Property: a worker stops a tile once its lease's TTL has passed on its own clock without a
// renewal getting through, whatever the network says: here every renewal is stuck (as behind a
// link that drops packets), and the tile's context ends as a lost lease within the TTL.
func TestLeaseExpiresOnTheWorkersClock(t *testing.T) {
	cfg := queue.DefaultConfig()
	cfg.LeaseTTL = 600 * time.Millisecond
	h := newRunHarnessWith(t, cfg)
	w, _ := h.worker(t, Config{})
	lease, err := h.queue.Leases.Acquire(h.ctx, "tile-cut-off", "w1/a1")
	if err != nil {
		t.Fatal(err)
	}
	msg := h.publishAndFetch(t, h.job())
	hb := w.startHeartbeat(h.ctx, msg, lease, slog.New(slog.DiscardHandler))
	hb.mu.Lock() // no renewal gets through from now on
	start := time.Now()
	select {
	case <-hb.ctx.Done():
	case <-time.After(5 * cfg.LeaseTTL):
		hb.mu.Unlock()
		t.Fatal("the tile's context outlived its lease by far")
	}
	hb.mu.Unlock()
	if took := time.Since(start); took > 2*cfg.LeaseTTL { // the bound is one TTL; a noisy machine gets a second
		t.Fatalf("the tile stopped %v after its last renewal, its lease lives %v", took, cfg.LeaseTTL)
	}
	if err := hb.stop(); !errors.Is(err, queue.ErrLeaseLost) {
		t.Fatalf("stop = %v, want a lost lease", err)
	}
}
