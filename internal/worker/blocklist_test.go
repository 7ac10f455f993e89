package worker

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/internal/scene/jsonscene"
	"github.com/tilefarm/tilefarm/internal/wire"
)

// named is a worker of the harness called name, logging into the harness's log.
func (h *runHarness) named(t *testing.T, name string, cfg Config) *Worker {
	t.Helper()
	cfg.Name = name
	w, err := New(cfg, Deps{Queue: h.queue, Objects: h.objects, Checkpoints: h.ckpts, Metrics: metrics.NewWorker(metrics.NewRegistry()),
		Scenes: newScenes(t, h.objects, "", scene.Kinds{jsonscene.Kind{}}),
		Log:    slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// Property: a worker that blocklisted a job stops being a candidate for its tiles, so an idle
// healthy worker takes the tile whichever pull JetStream serves first, and the blocklisting
// worker hands it back at most once.
func TestBlocklistingWorkerLeavesTheTileToAnIdleOne(t *testing.T) {
	h := newRunHarness(t)
	bad := h.named(t, "w-bad", Config{Concurrency: 2})
	good := h.named(t, "w-good", Config{Concurrency: 1})
	job := h.job()
	bad.act.blocked = append(bad.act.blocked, job.JobID)
	ctx, cancel := context.WithCancel(h.ctx)
	var wg sync.WaitGroup
	for _, w := range []*Worker{bad, good} {
		wg.Go(func() { _ = w.Run(ctx) })
	}
	defer func() { cancel(); wg.Wait() }()
	time.Sleep(300 * time.Millisecond) // every slot pulling
	data, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.queue.Publish(h.ctx, queue.SubjectRender, job.TileKey, data, nil); err != nil {
		t.Fatal(err)
	}
	var by string
	for deadline := time.Now().Add(30 * time.Second); by == "" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		for _, ev := range h.events(t) {
			if ev.Type == wire.EventTileCompleted && ev.TileKey == job.TileKey {
				by = ev.Worker
			}
		}
	}
	handBacks := strings.Count(h.logs.String(), "handing back a tile of a blocklisted job")
	t.Logf("completed by %q after %d hand-backs", by, handBacks)
	if by != "w-good" {
		t.Fatalf("the tile was completed by %q, not the idle healthy worker, after %d hand-backs by the worker that blocklisted its job", by, handBacks)
	}
	if handBacks > 1 {
		t.Fatalf("the worker that blocklisted the job handed its tile back %d times: it stayed a candidate", handBacks)
	}
}
