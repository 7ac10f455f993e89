package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/faults"
	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/internal/scene/jsonscene"
	"github.com/tilefarm/tilefarm/internal/wire"
	"github.com/tilefarm/tilefarm/render"
)

// An attempt's log keeps its newest lines within both bounds, oldest first.
func TestAttemptLogKeepsTheNewestLinesWithinItsBounds(t *testing.T) {
	a := &attemptLog{}
	for i := range 30 {
		a.add(fmt.Sprintf("line %d", i))
	}
	got := a.tail()
	if len(got) != maxAttemptLines || got[0] != "line 10" || got[len(got)-1] != "line 29" {
		t.Fatalf("tail of 30 short lines = %q, want lines 10-29", got)
	}
	long := strings.Repeat("x", 3*maxAttemptLine)
	a.add(long, long, long, long, long, "last")
	got = a.tail()
	size := 0
	for _, l := range got {
		size += len(l) + 1
		if len(l) > maxAttemptLine+3 {
			t.Fatalf("a line of %d bytes kept, want at most %d", len(l), maxAttemptLine)
		}
	}
	if size > maxAttemptLogBytes || got[len(got)-1] != "last" || len(got) < 2 {
		t.Fatalf("tail of long lines: %d lines, %d bytes, last %q; want the newest within %d bytes", len(got), size, got[len(got)-1], maxAttemptLogBytes)
	}
}

// A failed attempt's event quotes what the worker logged about it, debug lines included and
// its own failure line with the class last, and the worker's log has that line at warn.
func TestFailureEventQuotesTheAttemptsLog(t *testing.T) {
	h := newRunHarness(t)
	job := h.job()
	w, _ := h.worker(t, Config{Faults: faults.Plan{PanicTile: &faults.TileAt{Frame: job.Frame, Rect: job.Rect}}})
	h.deliver(t, w, job)
	ev := onlyEvent(t, h.events(t), wire.EventTileFailed)
	if ev.Code != "panic" || len(ev.Log) < 2 {
		t.Fatalf("tile.failed = %+v, want class panic and the attempt's log", ev)
	}
	last := ev.Log[len(ev.Log)-1]
	if !strings.Contains(last, `msg="retrying later"`) || !strings.Contains(last, "class=panic") || !strings.Contains(last, "injected fault") {
		t.Fatalf("last line of the attempt's log %q, want the retry with its class and error", last)
	}
	if !strings.Contains(ev.Log[0], "level=DEBUG") || !strings.Contains(ev.Log[0], `msg="rendering tile"`) {
		t.Fatalf("first line of the attempt's log %q, want the debug line that began the render", ev.Log[0])
	}
	if strings.Contains(strings.Join(ev.Log, "\n"), "attempt_id=") {
		t.Fatalf("the attempt's log repeats the delivery's ids: %q", ev.Log)
	}
	if !strings.Contains(h.logs.String(), "class=panic") {
		t.Fatalf("the worker's log does not give the failure's class:\n%s", h.logs)
	}
}

// A renderer's output carried by its error (a Blender process's last lines) is quoted in the
// failure event, before the worker's failure line.
func TestFailureEventQuotesTheRenderersOutput(t *testing.T) {
	h := newRunHarness(t)
	job := h.job()
	w, _ := h.workerWith(t, Config{}, scene.Kinds{failingKind{}})
	h.deliver(t, w, job)
	ev := onlyEvent(t, h.events(t), wire.EventTileFailed)
	log := strings.Join(ev.Log, "\n")
	at := strings.Index(log, "renderer: Fra:1 Mem:11.03M | Rendering 1 / 2 samples")
	if at < 0 || !strings.Contains(log, "renderer: Error: out of memory") || strings.LastIndex(log, `msg="retrying later"`) < at {
		t.Fatalf("tile.failed log:\n%s\nwant the renderer's lines, then the retry", log)
	}
}

// A completed tile's event says how long its attempt rendered it, and the worker logs the
// completion at info with its tile and render seconds.
func TestCompletionSaysHowLongTheTileRendered(t *testing.T) {
	h := newRunHarness(t)
	job := h.job()
	w, _ := h.worker(t, Config{Faults: faults.Plan{PassDelay: 5 * time.Millisecond}}) // 5 ms a pass, 8 passes
	h.deliver(t, w, job)
	ev := onlyEvent(t, h.events(t), wire.EventTileCompleted)
	if ev.RenderMillis < 40 {
		t.Fatalf("tile.completed render_ms = %d, want at least the 8 passes' 40 ms of delay", ev.RenderMillis)
	}
	line := ""
	for _, l := range strings.Split(h.logs.String(), "\n") {
		if strings.Contains(l, `msg="tile promoted"`) {
			line = l
		}
	}
	for _, want := range []string{"level=INFO", "job_id=job-test", "frame=1", "tile=0", "render_seconds=", "samples_recovered=0", "attempt_id=" + ev.Attempt} {
		if !strings.Contains(line, want) {
			t.Fatalf("completion log line %q lacks %s", line, want)
		}
	}
}

// onlyEvent returns the one event of type typ.
func onlyEvent(t *testing.T, evs []wire.Event, typ string) wire.Event {
	t.Helper()
	var out []wire.Event
	for _, ev := range evs {
		if ev.Type == typ {
			out = append(out, ev)
		}
	}
	if len(out) != 1 {
		t.Fatalf("%d %s events among %+v, want 1", len(out), typ, evs)
	}
	return out[0]
}

// workerWith is worker with the kinds of scene it loads.
func (h *runHarness) workerWith(t *testing.T, cfg Config, kinds scene.Kinds) (*Worker, *metrics.Worker) {
	t.Helper()
	m := metrics.NewWorker(metrics.NewRegistry())
	cfg.Name = "w1"
	w, err := New(cfg, Deps{Queue: h.queue, Objects: h.objects, Checkpoints: h.ckpts, Metrics: m,
		Scenes: newScenes(t, h.objects, "", kinds),
		Log:    slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	return w, m
}

// failingKind is the JSON scene whose tiles fail as a renderer process does, with its output.
type failingKind struct{ jsonscene.Kind }

func (failingKind) Load(context.Context, *bundle.Bundle, string, string) (scene.Renderer, error) {
	return failingRenderer{}, nil
}

type failingRenderer struct{ scene.Renderer }

func (failingRenderer) NewTile(context.Context, render.Settings, int, render.Rect) (scene.Tile, error) {
	return failingTile{}, nil
}

type failingTile struct{ scene.Tile }

func (failingTile) Next() int { return 0 }
func (failingTile) Render(context.Context, int, int) error {
	return fmt.Errorf("rendering samples [0,1): %w", &outputErr{errors.New("renderer process failed: exit status 1"),
		[]string{"Fra:1 Mem:11.03M | Rendering 1 / 2 samples", "Error: out of memory"}})
}

type outputErr struct {
	err error
	out []string
}

func (e *outputErr) Error() string            { return e.err.Error() }
func (e *outputErr) RendererOutput() []string { return e.out }

// The slot-seconds the heartbeat reports count the slots held, never more than the worker
// has: three tiles in hand on two slots hold two.
func TestActivityCountsBusySlots(t *testing.T) {
	before := time.Now()
	a := newActivity(2)
	for _, id := range []string{"a1", "a2", "a3"} {
		a.start(id, api.WorkerTile{})
	}
	time.Sleep(50 * time.Millisecond)
	_, _, _, busy, _ := a.snapshot()
	elapsed := time.Since(before).Seconds()
	if busy < 2*0.05 || busy > 2*elapsed {
		t.Fatalf("busy slot-seconds after 50 ms with 3 tiles on 2 slots = %v, want between 0.1 and %v", busy, 2*elapsed)
	}
	for _, id := range []string{"a1", "a2", "a3"} {
		a.end(id)
	}
	_, _, _, held, _ := a.snapshot()
	time.Sleep(20 * time.Millisecond)
	if _, _, _, later, _ := a.snapshot(); later != held {
		t.Fatalf("busy slot-seconds went from %v to %v while no tile was held", held, later)
	}
}
