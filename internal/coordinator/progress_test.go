package coordinator

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/wire"
	"github.com/tilefarm/tilefarm/render"
)

// testClock is a coordinator clock a test moves by hand.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// progressJob submits one 64x64 frame of the shot in four 32-px tiles at spp samples and
// subscribes the coordinator's tracker to progress reports, as its Run does.
func (h *harness) progressJob(t *testing.T, spp int) (jobID, fk string) {
	t.Helper()
	req := h.request(1, 1, 64, 64, 32)
	req.SPP = spp
	res := h.submit(t, req)
	h.relay(t)
	sub, err := h.queue.SubscribeProgress(h.c.progress.receive)
	if err != nil {
		t.Fatalf("SubscribeProgress: %v", err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return res.Status.JobID, h.job(t, res.Status.JobID).FrameKey(1)
}

// report publishes a progress report through the farm, as a worker does.
func (h *harness) report(t *testing.T, r wire.Progress) {
	t.Helper()
	if r.Time.IsZero() {
		r.Time = time.Now().UTC()
	}
	if r.Worker == "" {
		r.Worker = "w1"
	}
	h.publishRaw(t, marshal(t, r))
}

func (h *harness) publishRaw(t *testing.T, data []byte) {
	t.Helper()
	if err := h.queue.PublishProgress(data); err != nil {
		t.Fatalf("PublishProgress: %v", err)
	}
}

// waitSamples waits until the job's status shows want samples done. Reports published on one
// connection arrive in order, so once a report is counted every report before it was handled.
func (h *harness) waitSamples(t *testing.T, jobID string, want int64) api.Status {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := h.status(t, jobID)
		if st.SamplesDone == want {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("samples_done = %d of %d, want %d", st.SamplesDone, st.SamplesTotal, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// fakeTile is a valid tile key no frame has: the tracker takes it, a status caps what it adds.
func fakeTile(i int) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("tile %d", i)))
	return hex.EncodeToString(sum[:])
}

// Progress reports move samples_done while tiles render; a completed tile counts whole once,
// however late its last report arrives; a failed attempt's reports stop counting but its
// retry's do.
func TestProgressMovesSamplesDone(t *testing.T) {
	h := newHarness(t, Config{})
	jobID, fk := h.progressJob(t, 8)
	f := h.frame(t, fk)
	ft := frameTiles(t, f)
	rep := func(i, samples int, worker string, at time.Time) {
		h.report(t, wire.Progress{JobID: jobID, FrameKey: fk, TileKey: ft[i].Key, Samples: samples, SPP: 8, Worker: worker, Time: at})
	}

	st := h.status(t, jobID)
	if st.SamplesTotal != 4*8 || st.SamplesDone != 0 || len(st.Frames) != 1 || st.Frames[0].SamplesTotal != 4*8 {
		t.Fatalf("before any report: samples %d/%d, frames %+v", st.SamplesDone, st.SamplesTotal, st.Frames)
	}
	rep(0, 3, "w1", time.Time{})
	h.waitSamples(t, jobID, 3)
	rep(0, 6, "w1", time.Time{})
	rep(1, 2, "w2", time.Time{})
	if st := h.waitSamples(t, jobID, 8); st.Frames[0].SamplesDone != 8 || st.TilesCompleted != 0 {
		t.Fatalf("frame samples %d, tiles completed %d", st.Frames[0].SamplesDone, st.TilesCompleted)
	}

	// Tile 0 completes: it counts its 8 samples, not 8 plus its last report.
	h.apply(t, tileEvent(t, f, 0, wire.EventTileCompleted, 1, 1))
	if st := h.status(t, jobID); st.SamplesDone != 8+2 || st.TilesCompleted != 1 {
		t.Fatalf("after tile 0 completed: samples_done %d, tiles %d; want 10, 1", st.SamplesDone, st.TilesCompleted)
	}
	// A report of tile 0 sent before its completion but arriving after it is not counted; the
	// report of tile 2 after it is, so once it shows the late one was handled.
	rep(0, 7, "w1", time.Now().Add(-time.Second))
	rep(2, 1, "w3", time.Time{})
	h.waitSamples(t, jobID, 8+2+1)

	// Tile 1's attempt on w2 fails: its samples no longer count, nor does a report w2 sent
	// before failing; the retry's reports do, from another worker or from w2 later.
	failedAt := time.Now().UTC()
	ev := tileEvent(t, f, 1, wire.EventTileFailed, 2, 1)
	ev.Worker, ev.Time, ev.Code, ev.Error = "w2", failedAt, "render", "boom"
	h.apply(t, ev)
	if st := h.status(t, jobID); st.SamplesDone != 8+1 {
		t.Fatalf("after tile 1 failed: samples_done %d, want 9", st.SamplesDone)
	}
	rep(1, 5, "w2", failedAt.Add(-time.Millisecond))
	rep(2, 2, "w3", time.Time{})
	h.waitSamples(t, jobID, 8+2)
	rep(1, 4, "w2", failedAt.Add(time.Second))
	h.waitSamples(t, jobID, 8+2+4)

	// Every tile completed: exactly the total, whatever was reported.
	for i := 1; i < 4; i++ {
		h.apply(t, tileEvent(t, f, i, wire.EventTileCompleted, uint64(10+i), 1))
	}
	if st := h.status(t, jobID); st.SamplesDone != st.SamplesTotal || st.TilesCompleted != 4 {
		t.Fatalf("all tiles completed: samples %d/%d, tiles %d", st.SamplesDone, st.SamplesTotal, st.TilesCompleted)
	}
	if n := h.c.progress.len(); n != 0 {
		t.Fatalf("%d tiles still in progress after every tile completed", n)
	}
}

// What is not a well-formed report is ignored, and never panics the coordinator.
func TestProgressIgnoresGarbage(t *testing.T) {
	h := newHarness(t, Config{})
	jobID, fk := h.progressJob(t, 8)
	tk := frameTiles(t, h.frame(t, fk))[0].Key
	good := wire.Progress{FrameKey: fk, TileKey: tk, Samples: 4, SPP: 8, Worker: "w1", Time: time.Now().UTC()}
	for _, c := range []struct {
		name string
		data string
		edit func(*wire.Progress)
	}{
		{name: "empty", data: " "},
		{name: "not json", data: "samples=4"},
		{name: "json array", data: `[1,2,3]`},
		{name: "truncated", data: `{"frame_key":"` + fk},
		{name: "samples overflow", data: `{"frame_key":"` + fk + `","tile_key":"` + tk + `","samples":1e30,"spp":8}`},
		{name: "samples a string", data: `{"frame_key":"` + fk + `","tile_key":"` + tk + `","samples":"4","spp":8}`},
		{name: "no keys", edit: func(p *wire.Progress) { p.FrameKey, p.TileKey = "", "" }},
		{name: "uppercase frame key", edit: func(p *wire.Progress) { p.FrameKey = strings.ToUpper(fk) }},
		{name: "short tile key", edit: func(p *wire.Progress) { p.TileKey = tk[:63] }},
		{name: "long tile key", edit: func(p *wire.Progress) { p.TileKey = tk + "0" }},
		{name: "non-hex tile key", edit: func(p *wire.Progress) { p.TileKey = "g" + tk[1:] }},
		{name: "path in frame key", edit: func(p *wire.Progress) { p.FrameKey = "../" + fk[3:] }},
		{name: "samples beyond spp", edit: func(p *wire.Progress) { p.Samples = 9 }},
		{name: "negative samples", edit: func(p *wire.Progress) { p.Samples = -1 }},
		{name: "no spp", edit: func(p *wire.Progress) { p.Samples, p.SPP = 0, 0 }},
		{name: "negative spp", edit: func(p *wire.Progress) { p.Samples, p.SPP = -4, -8 }},
		{name: "spp beyond the limit", edit: func(p *wire.Progress) { p.Samples, p.SPP = render.MaxSPP+1, render.MaxSPP+1 }},
	} {
		data := []byte(c.data)
		if c.edit != nil {
			p := good
			c.edit(&p)
			data = marshal(t, p)
		}
		h.c.progress.receive(data) // directly, nil and all, and through NATS
		h.publishRaw(t, data)
		if n := h.c.progress.len(); n != 0 {
			t.Fatalf("%s: the tracker took %q (%d tiles)", c.name, data, n)
		}
	}
	h.c.progress.receive(nil)
	// The good report after them all is the first to count.
	h.report(t, good)
	h.waitSamples(t, jobID, 4)
	if n := h.c.progress.len(); n != 1 {
		t.Fatalf("%d tiles in progress after garbage and one good report, want 1", n)
	}
	// A tile no frame of the job has, or forged reports of many, never take a frame beyond
	// what its tiles not completed can hold.
	for i := range 10 {
		h.report(t, wire.Progress{FrameKey: fk, TileKey: fakeTile(i), Samples: 8, SPP: 8})
	}
	h.waitSamples(t, jobID, 4*8)
}

// A tile whose worker stops reporting (it died) stops counting after progressTTL and is
// dropped by the next sweep; a fresh report counts again.
func TestProgressExpires(t *testing.T) {
	h := newHarness(t, Config{})
	clock := &testClock{t: time.Now().UTC()}
	h.c.now = clock.now
	jobID, fk := h.progressJob(t, 8)
	tk := frameTiles(t, h.frame(t, fk))[0].Key
	h.report(t, wire.Progress{FrameKey: fk, TileKey: tk, Samples: 5, SPP: 8})
	h.waitSamples(t, jobID, 5)

	for _, c := range []struct {
		advance time.Duration
		want    int64
	}{
		{progressTTL - time.Second, 5},
		{time.Second, 0},
	} {
		clock.advance(c.advance)
		if st := h.status(t, jobID); st.SamplesDone != c.want {
			t.Fatalf("samples_done %d at +%v, want %d", st.SamplesDone, c.advance, c.want)
		}
	}
	h.c.progress.mu.Lock()
	h.c.progress.sweep(clock.now())
	h.c.progress.mu.Unlock()
	if n := h.c.progress.len(); n != 0 {
		t.Fatalf("%d tiles in progress after a sweep of expired reports", n)
	}
	h.report(t, wire.Progress{FrameKey: fk, TileKey: tk, Samples: 6, SPP: 8})
	h.waitSamples(t, jobID, 6)
}

// The tracker holds at most max tiles in progress and max ended tiles per generation,
// whatever is sent; expired tiles make room again.
func TestProgressMemoryCap(t *testing.T) {
	h := newHarness(t, Config{})
	clock := &testClock{t: time.Now().UTC()}
	h.c.now = clock.now
	const limit = 3
	h.c.progress.max = limit
	jobID, fk := h.progressJob(t, 8)
	ft := frameTiles(t, h.frame(t, fk))

	for i := range 4 {
		h.report(t, wire.Progress{FrameKey: fk, TileKey: ft[i].Key, Samples: 1, SPP: 8})
	}
	// An update of a tile held is taken at the cap; a new tile is not.
	h.report(t, wire.Progress{FrameKey: fk, TileKey: ft[0].Key, Samples: 5, SPP: 8})
	h.waitSamples(t, jobID, 5+1+1)
	if n := h.c.progress.len(); n != limit {
		t.Fatalf("%d tiles in progress, want the cap %d", n, limit)
	}

	// Once the held tiles expire, a new one is taken and the expired ones are swept.
	clock.advance(progressTTL + time.Second)
	h.report(t, wire.Progress{FrameKey: fk, TileKey: ft[3].Key, Samples: 2, SPP: 8})
	h.waitSamples(t, jobID, 2)
	if n := h.c.progress.len(); n != 1 {
		t.Fatalf("%d tiles in progress after the others expired, want 1", n)
	}

	// Ended tiles: each generation stays within the cap however many tiles complete.
	evs := make([]wire.Event, 0, 10*limit)
	for i := range 10 * limit {
		tk := fakeTile(i)
		h.report(t, wire.Progress{FrameKey: fk, TileKey: tk, Samples: 1, SPP: 8})
		evs = append(evs, wire.Event{Type: wire.EventTileCompleted, FrameKey: fk, TileKey: tk})
	}
	h.report(t, wire.Progress{FrameKey: fk, TileKey: ft[3].Key, Samples: 3, SPP: 8})
	h.waitSamples(t, jobID, 3+2) // tile 3 and the two fake tiles that found room
	h.c.progress.finished(evs)
	p := h.c.progress
	p.mu.Lock()
	ended, old := len(p.ended), len(p.endedOld)
	p.mu.Unlock()
	if ended > limit || old > limit {
		t.Fatalf("%d and %d ended tiles held, want at most %d each", ended, old, limit)
	}
}

// The coordinator's Run receives progress reports; the HTTP API serves the samples.
func TestRunWatchesProgress(t *testing.T) {
	h := newHarness(t, Config{})
	req := h.request(1, 1, 64, 64, 32)
	req.SPP = 8
	res := h.submit(t, req)
	fk := h.job(t, res.Status.JobID).FrameKey(1)
	tk := frameTiles(t, h.frame(t, fk))[0].Key
	h.run(t)

	// Run subscribes in its own time: report until a report is seen.
	deadline := time.Now().Add(10 * time.Second)
	for h.status(t, res.Status.JobID).SamplesDone != 3 {
		if time.Now().After(deadline) {
			t.Fatal("no progress report seen by a running coordinator")
		}
		h.report(t, wire.Progress{FrameKey: fk, TileKey: tk, Samples: 3, SPP: 8})
		time.Sleep(20 * time.Millisecond)
	}

	srv := httptest.NewServer(h.c.Handler())
	t.Cleanup(srv.Close)
	var got map[string]any
	if code, raw, _ := call(t, srv, "GET", "/v1/jobs/"+res.Status.JobID, nil, &got); code != http.StatusOK {
		t.Fatalf("GET job = %d %s", code, raw)
	}
	if got["samples_total"] != float64(32) || got["samples_done"] != float64(3) {
		t.Fatalf("GET job: samples_total %v, samples_done %v; want 32, 3", got["samples_total"], got["samples_done"])
	}
	var jobs []api.Status
	if code, raw, _ := call(t, srv, "GET", "/v1/jobs", nil, &jobs); code != http.StatusOK || len(jobs) != 1 || jobs[0].SamplesDone != 3 {
		t.Fatalf("GET jobs = %d %s", code, raw)
	}
	raw, err := json.Marshal(h.status(t, res.Status.JobID).Frames[0])
	if err != nil || !strings.Contains(string(raw), `"samples_total":32,"samples_done":3`) {
		t.Fatalf("frame status JSON %s (%v) lacks its samples", raw, err)
	}
}
