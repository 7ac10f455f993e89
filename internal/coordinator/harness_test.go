package coordinator

import (
	"context"
	"log/slog"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/farm"
	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/store"
)

// shotScene is the animated example scene; it has cameras "orbit" (default) and "top".
const shotScene = "../../examples/shot/scene.json"

// harness is a coordinator on a real embedded JetStream server, a real bbolt file and a
// filesystem object store, all in temp dirs. Its loops are not running: tests drive Submit,
// applyEvent and relay directly, so the outbox can be inspected before anything publishes it.
type harness struct {
	c       *Coordinator
	st      *store.Store
	objects *finalize.FSStore
	farm    *queue.Farm
	m       *metrics.Metrics
	ctx     context.Context
}

func newHarness(t *testing.T, cfg Config) *harness {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	dir := t.TempDir()
	e, err := queue.StartEmbedded(ctx, filepath.Join(dir, "jetstream"), "")
	if err != nil {
		t.Fatalf("StartEmbedded: %v", err)
	}
	t.Cleanup(e.Shutdown)
	nc, err := e.Connect(t.Name())
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream.New: %v", err)
	}
	f, err := queue.Setup(ctx, js, queue.DefaultConfig())
	if err != nil {
		t.Fatalf("queue.Setup: %v", err)
	}
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	f.Log = log
	objects, err := finalize.NewFSStore(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatalf("NewFSStore: %v", err)
	}
	st, err := store.Open(filepath.Join(dir, "coordinator.db"))
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(func() { _ = st.Close() })
	m := metrics.New()
	return &harness{c: New(cfg, st, f, nc, objects, m, log), st: st, objects: objects, farm: f, m: m, ctx: ctx}
}

// shotBundle reads the example scene with its mesh.
func shotBundle(t *testing.T) *farm.Bundle {
	t.Helper()
	b, err := farm.ReadBundle(shotScene)
	if err != nil {
		t.Fatalf("ReadBundle: %v", err)
	}
	return b
}

// smallRequest asks for frames first-last of the shot at width x height in size-px tiles.
func smallRequest(t *testing.T, first, last, width, height, size int) SubmitRequest {
	t.Helper()
	return SubmitRequest{Bundle: shotBundle(t), First: first, Last: last, Width: width, Height: height,
		SPP: 2, TileSize: size, Formats: []string{"png"}}
}

func (h *harness) submit(t *testing.T, req SubmitRequest) SubmitResult {
	t.Helper()
	res, err := h.c.Submit(h.ctx, req)
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	return res
}

func (h *harness) outbox(t *testing.T) []store.OutboxRecord {
	t.Helper()
	recs, err := h.st.PendingOutbox(h.ctx, 1<<20)
	if err != nil {
		t.Fatalf("PendingOutbox: %v", err)
	}
	return recs
}

func (h *harness) job(t *testing.T, id string) *store.Job {
	t.Helper()
	var j *store.Job
	err := h.st.View(h.ctx, func(tx *store.Tx) error {
		var err error
		j, err = tx.Job(id)
		return err
	})
	if err != nil {
		t.Fatalf("job %s: %v", id, err)
	}
	return j
}

func (h *harness) frame(t *testing.T, key string) *store.Frame {
	t.Helper()
	var f *store.Frame
	err := h.st.View(h.ctx, func(tx *store.Tx) error {
		var err error
		f, err = tx.Frame(key)
		return err
	})
	if err != nil {
		t.Fatalf("frame %s: %v", key, err)
	}
	return f
}

func (h *harness) tile(t *testing.T, key string) *store.Tile {
	t.Helper()
	var tl *store.Tile
	err := h.st.View(h.ctx, func(tx *store.Tx) error {
		var err error
		tl, err = tx.Tile(key)
		return err
	})
	if err != nil {
		t.Fatalf("tile %s: %v", key, err)
	}
	return tl
}

func (h *harness) status(t *testing.T, jobID string) Status {
	t.Helper()
	st, err := h.c.Status(h.ctx, jobID)
	if err != nil {
		t.Fatalf("Status(%s): %v", jobID, err)
	}
	return st
}

func (h *harness) jobCount(t *testing.T) int {
	t.Helper()
	var n int
	err := h.st.View(h.ctx, func(tx *store.Tx) error {
		jobs, err := tx.Jobs()
		n = len(jobs)
		return err
	})
	if err != nil {
		t.Fatalf("Jobs: %v", err)
	}
	return n
}

func (h *harness) apply(t *testing.T, ev farm.Event) {
	t.Helper()
	if ev.Time.IsZero() {
		ev.Time = time.Now().UTC()
	}
	if err := h.c.applyEvent(h.ctx, ev); err != nil {
		t.Fatalf("applyEvent(%s %s): %v", ev.Type, ev.ID, err)
	}
}

// tileCount is ceil(w/size)*ceil(h/size), computed independently of tiles.Split.
func tileCount(w, h, size int) int { return ((w + size - 1) / size) * ((h + size - 1) / size) }

func sortedCopy(s []string) []string {
	c := append([]string(nil), s...)
	sort.Strings(c)
	return c
}

// tileKeys derives a frame's tile keys, in Split order.
func tileKeys(t *testing.T, f *store.Frame) []string {
	t.Helper()
	ft, err := f.Tiles()
	if err != nil {
		t.Fatalf("tiles of frame %s: %v", f.Key, err)
	}
	keys := make([]string, len(ft))
	for i, x := range ft {
		keys[i] = x.Key
	}
	return keys
}
