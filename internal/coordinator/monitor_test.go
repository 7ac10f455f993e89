package coordinator

import (
	"bytes"
	"context"
	"errors"
	"image"
	"image/color"
	"image/png"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/wire"
)

// Each completed tile's render time, as its worker reported it, is kept in the frame's one
// record of the times bucket and served with the frame's tiles; the frame's sum is in status.
// A repeated completion changes nothing, and a completion taken back forgets its time.
func TestRenderTimesAreKeptPerFrame(t *testing.T) {
	h := newHarness(t, Config{})
	res, fk := h.submitFrame(t, 64, 64, 32) // 4 tiles
	job := res.Status.JobID
	h.completeTiles(t, fk) // tiles report 100, 200, 300 and 400 ms
	ft, err := h.c.FrameTiles(h.ctx, job, 1)
	if err != nil {
		t.Fatal(err)
	}
	for i, ti := range ft.Tiles {
		if ti.RenderMillis != uint32(100*(i+1)) {
			t.Fatalf("tile %d render_ms = %d, want %d", i, ti.RenderMillis, 100*(i+1))
		}
	}
	if got := h.status(t, job).Frames[0].RenderSeconds; got != 1.0 {
		t.Fatalf("frame render_seconds = %v, want 1.0 (the tiles' sum)", got)
	}
	counts, err := h.st.Counts(h.ctx)
	if err != nil || counts["times"] != 1 {
		t.Fatalf("times bucket holds %d records (%v), want one for the frame", counts["times"], err)
	}

	// A second completion of tile 2 (a duplicate's) keeps the first report.
	f := h.frame(t, fk)
	again := tileEvent(t, f, 2, wire.EventTileCompleted, 9, 1)
	again.RenderMillis = 9000
	h.apply(t, again)
	if got := h.status(t, job).Frames[0].RenderSeconds; got != 1.0 {
		t.Fatalf("render_seconds after a repeated completion = %v, want still 1.0", got)
	}
	// Tile 3's completion is taken back (its manifest not found): its time goes with it.
	if err := h.c.update(h.ctx, func(p *projection) error {
		_, err := p.tile(fk, tileUpdate{Index: 3, Change: coorddb.TileUnproven})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ft, _ = h.c.FrameTiles(h.ctx, job, 1)
	if ft.Tiles[3].RenderMillis != 0 || ft.Tiles[3].State != api.TileQueued || ft.Tiles[2].RenderMillis != 300 {
		t.Fatalf("after tile 3's completion was taken back: %+v", ft.Tiles)
	}
	if got := h.status(t, job).Frames[0].RenderSeconds; got != 0.6 {
		t.Fatalf("render_seconds after tile 3 was taken back = %v, want 0.6", got)
	}
}

// A tile's failed attempts are served with the lines their workers logged, counted in the
// frame's tiles, and a dead letter's page names its tile and carries the same attempts.
func TestFailedAttemptsAreServedWithTheirLogs(t *testing.T) {
	h := newHarness(t, Config{})
	res, fk := h.submitFrame(t, 64, 64, 32)
	job := res.Status.JobID
	f := h.frame(t, fk)
	failed := tileEvent(t, f, 1, wire.EventTileFailed, 1, 1)
	failed.Code, failed.Error = "panic", "panic: injected fault"
	failed.Log = []string{`time=12:00:00.000 level=DEBUG msg="rendering tile" tile=1`, "renderer: Error: out of memory",
		`time=12:00:01.000 level=WARN msg="retrying later" class=panic`}
	dead := tileEvent(t, f, 1, wire.EventTileFailed, 1, 2)
	dead.Code, dead.Error, dead.Terminal = "panic", "failed 2 times (limit 2): panic: injected fault", true
	dead.Log = []string{`time=12:00:02.000 level=ERROR msg=dead-lettering class=panic`}
	h.apply(t, failed, dead)

	ft, err := h.c.FrameTiles(h.ctx, job, 1)
	if err != nil {
		t.Fatal(err)
	}
	if ft.Tiles[1].Failures != 2 || ft.Tiles[0].Failures != 0 {
		t.Fatalf("failure counts of tiles 0 and 1 = %d, %d; want 0, 2", ft.Tiles[0].Failures, ft.Tiles[1].Failures)
	}
	tf, err := h.c.TileFailures(h.ctx, job, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(tf.Failures) != 2 || tf.State != api.TileDeadLettered || tf.TileKey != ft.Tiles[1].TileKey {
		t.Fatalf("tile failures = %+v, want two attempts of the dead-lettered tile", tf)
	}
	first, last := tf.Failures[0], tf.Failures[1]
	if first.Class != "panic" || first.Worker != "w1" || first.DeadLettered || !slices.Equal(first.Log, failed.Log) {
		t.Fatalf("first failed attempt = %+v, want the retried one with its log", first)
	}
	if !last.DeadLettered || !strings.Contains(last.Log[0], "dead-lettering") {
		t.Fatalf("last failed attempt = %+v, want the dead-lettering one", last)
	}
	if _, err := h.c.TileFailures(h.ctx, job, 1, 4); !errors.Is(err, api.ErrBadInput) {
		t.Fatalf("failures of tile 4 of a 4-tile frame: %v, want bad input", err)
	}
	if none, err := h.c.TileFailures(h.ctx, job, 1, 0); err != nil || len(none.Failures) != 0 || none.Failures == nil {
		t.Fatalf("failures of a tile that never failed = %+v, %v; want an empty list", none, err)
	}
}

// The box filter, computed by hand: a 330x10 image scales by 3 to 110x4, each pixel the
// rounded mean of its 3x3 block (the last row's blocks 3x1), opaque and translucent pixels
// alike in non-premultiplied 8-bit RGBA.
func TestThumbnailOfIsABoxFilter(t *testing.T) {
	img := image.NewRGBA(image.Rect(0, 0, 330, 10))
	for y := range 10 {
		for x := range 330 {
			img.SetRGBA(x, y, color.RGBA{uint8(x), uint8(y * 20), uint8((x + y) % 7), 0xff})
		}
	}
	img.SetRGBA(4, 0, color.RGBA{50, 50, 50, 0x80}) // premultiplied: non-premultiplied 99 or 100
	th := ThumbnailOf(img)
	if th.Bounds() != image.Rect(0, 0, 110, 4) {
		t.Fatalf("thumbnail of 330x10 is %v, want 110x4", th.Bounds())
	}
	mean := func(vals ...int) uint8 {
		sum := 0
		for _, v := range vals {
			sum += v
		}
		return uint8((sum + len(vals)/2) / len(vals))
	}
	// Pixel (5, 2): x 15-17, y 6-8.
	want := color.NRGBA{mean(15, 16, 17, 15, 16, 17, 15, 16, 17), mean(120, 120, 120, 140, 140, 140, 160, 160, 160),
		mean(21%7, 22%7, 23%7, 22%7, 23%7, 24%7, 23%7, 24%7, 25%7), 0xff}
	if got := th.NRGBAAt(5, 2); got != want {
		t.Fatalf("pixel (5,2) = %v, want %v", got, want)
	}
	// Pixel (7, 3): x 21-23, y 9 alone.
	if got := th.NRGBAAt(7, 3); got != (color.NRGBA{mean(21, 22, 23), 180, mean(30%7, 31%7, 32%7), 0xff}) {
		t.Fatalf("pixel (7,3) of the last, one-row band = %v", got)
	}
	// Pixel (1, 0) holds the translucent pixel, as color.NRGBAModel makes it non-premultiplied.
	odd := color.NRGBAModel.Convert(color.RGBA{50, 50, 50, 0x80}).(color.NRGBA)
	wantA := mean(255, 255, 0x80, 255, 255, 255, 255, 255, 255)
	if got := th.NRGBAAt(1, 0); got.A != wantA || got.R != mean(3, int(odd.R), 5, 3, 4, 5, 3, 4, 5) {
		t.Fatalf("pixel (1,0) = %v, want alpha %d and red %d", got, wantA, mean(3, int(odd.R), 5, 3, 4, 5, 3, 4, 5))
	}
	// A frame that fits is its own thumbnail.
	small := image.NewNRGBA(image.Rect(0, 0, 160, 90))
	small.Pix[7] = 9
	if th := ThumbnailOf(small); th.Bounds() != small.Bounds() || !slices.Equal(th.Pix, small.Pix) {
		t.Fatal("a 160x90 frame's thumbnail is not the frame")
	}
}

// A finished frame's thumbnail is its PNG scaled (ThumbnailOf), made once: asked again with the
// store down it is served from memory. A frame not finished is not ready.
func TestThumbnailIsTheFramesPNGScaled(t *testing.T) {
	h := newHarness(t, Config{})
	res, fk := h.submitFrame(t, 64, 64, 32)
	job := res.Status.JobID
	if _, err := h.c.Thumbnail(h.ctx, job, 1); !errors.Is(err, api.ErrNotReady) {
		t.Fatalf("thumbnail of a frame rendering: %v, want not ready", err)
	}
	frame := image.NewNRGBA(image.Rect(0, 0, 400, 200))
	for i := range frame.Pix {
		frame.Pix[i] = uint8(i * 7)
	}
	var pngData bytes.Buffer
	if err := png.Encode(&pngData, frame); err != nil {
		t.Fatal(err)
	}
	h.completeTiles(t, fk)
	if _, err := finalize.Promote(h.ctx, h.objects, layout.FrameManifestKey(fk, "png"), "attempt1", identity.BuildFingerprint(),
		[]finalize.Output{{Name: "frame.png", Data: pngData.Bytes()}}, nil); err != nil {
		t.Fatal(err)
	}
	h.apply(t, wire.Event{ID: "assembled", Type: wire.EventFrameAssembled, FrameKey: fk, Formats: []string{"png"}})
	data, err := h.c.Thumbnail(h.ctx, job, 1)
	if err != nil {
		t.Fatal(err)
	}
	got, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	want := ThumbnailOf(frame)
	if got.Bounds() != image.Rect(0, 0, 134, 67) || !slices.Equal(got.(*image.NRGBA).Pix, want.Pix) {
		t.Fatalf("thumbnail of a 400x200 frame: %v, want the frame's PNG scaled by 3 to 134x67", got.Bounds())
	}
	h.c.objects = faultyStore{Store: h.objects, fail: func(string) error { return errors.New("store down") }}
	defer func() { h.c.objects = h.objects }()
	if again, err := h.c.Thumbnail(h.ctx, job, 1); err != nil || !bytes.Equal(again, data) {
		t.Fatalf("thumbnail asked again with the store down: %v", err)
	}
}

// The workers page's detail: each live worker's busy slots at each heartbeat the directory's
// watch delivers, and its recent failures as the coordinator records them, also after a
// restart (read from the failure records); a worker gone is not listed.
func TestWorkersDetail(t *testing.T) {
	h := newHarness(t, Config{})
	ctx, stop := context.WithCancel(h.ctx)
	defer stop()
	go func() { _ = h.queue.Workers.Follow(ctx, h.c.fleet.beat) }()
	res, fk := h.submitFrame(t, 64, 64, 32)
	beat := func(name string, busy float64) {
		t.Helper()
		if err := h.queue.Workers.Beat(h.ctx, api.Worker{Name: name, Slots: 2, BusySlots: busy, LastSeen: time.Now().UTC(),
			Pools: []string{"any worker"}}); err != nil {
			t.Fatal(err)
		}
	}
	samples := func(name string) []api.BusySample {
		ws, err := h.c.WorkersDetail(h.ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range ws {
			if w.Name == name {
				return w.History
			}
		}
		return nil
	}
	for _, busy := range []float64{1.5, 0.25, 3} { // 3 of 2 slots is cut to 2
		n := len(samples("w1")) // before the beat, which the watch may deliver at once
		beat("w1", busy)
		for deadline := time.Now().Add(10 * time.Second); len(samples("w1")) == n; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the beat of %v never reached the history", busy)
			}
		}
	}
	got := samples("w1")
	if len(got) != 3 || got[0].Busy != 1.5 || got[1].Busy != 0.25 || got[2].Busy != 2 || !got[1].Time.After(got[0].Time) {
		t.Fatalf("w1's history = %+v, want 1.5, 0.25, 2 in time order", got)
	}
	f := h.frame(t, fk)
	ev := tileEvent(t, f, 3, wire.EventTileFailed, 1, 1)
	ev.Code, ev.Error = "panic", "panic: boom"
	h.apply(t, ev)
	ws, err := h.c.WorkersDetail(h.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 1 || len(ws[0].RecentFailures) != 1 {
		t.Fatalf("workers = %+v, want w1 with its failure", ws)
	}
	want := api.WorkerFailure{JobID: res.Status.JobID, Frame: 1, Tile: 3, Class: "panic", Error: "panic: boom", Time: ws[0].RecentFailures[0].Time}
	if ws[0].RecentFailures[0] != want || ws[0].Pools[0] != "any worker" {
		t.Fatalf("w1's failures = %+v, pools %v; want %+v", ws[0].RecentFailures, ws[0].Pools, want)
	}
	if plain, _ := h.c.Workers(h.ctx); plain[0].History != nil || plain[0].RecentFailures != nil {
		t.Fatalf("the plain worker list carries the detail: %+v", plain[0])
	}
	// A restarted coordinator reads the failures from its records, with those applied before
	// it read them once each.
	h.c.fleet = newFleetHistory()
	second := tileEvent(t, f, 2, wire.EventTileFailed, 2, 1)
	second.Code, second.Error = "retryable", "store down"
	h.apply(t, second)
	ws, _ = h.c.WorkersDetail(h.ctx)
	if got := ws[0].RecentFailures; len(got) != 2 || got[0].Tile != 3 || got[1].Tile != 2 {
		t.Fatalf("after a restart w1's failures = %+v, want the recorded one and the one applied since, once each", got)
	}
}

// A stream's look sends every job and frame first, then the frames and statuses that changed
// and nothing else; a job whose records did not change is not looked at again frame by frame,
// and one whose did is.
func TestStreamSendsWhatChanged(t *testing.T) {
	h := newHarness(t, Config{})
	a, fk := h.submitFrame(t, 64, 64, 32)
	b := h.submit(t, h.request(2, 3, 64, 64, 32))
	s := &streamState{jobs: map[string][]byte{}, frames: map[frameOfJob]api.FrameEvent{}, fingerprints: map[string]uint64{}}
	look := func() string {
		t.Helper()
		all, fps, err := h.c.jobsWithFrames(h.ctx)
		if err != nil {
			t.Fatal(err)
		}
		msg, err := s.next(all, fps)
		if err != nil {
			t.Fatal(err)
		}
		return string(msg)
	}
	first := look()
	if strings.Count(first, `"frame":`) != 3 || !strings.Contains(first, a.Status.JobID) || !strings.Contains(first, b.Status.JobID) {
		t.Fatalf("first message = %s, want both jobs and their 3 frames", first)
	}
	if again := look(); again != "" {
		t.Fatalf("a look with nothing changed sent %s", again)
	}
	h.apply(t, tileEvent(t, h.frame(t, fk), 0, wire.EventTileCompleted, 1, 1))
	msg := look()
	if !strings.Contains(msg, `"job_id":"`+a.Status.JobID+`","frame":1,`) || strings.Count(msg, `"frame":`) != 1 ||
		!strings.Contains(msg, `"tiles_completed":1`) || strings.Contains(msg, b.Status.JobID) {
		t.Fatalf("message after a tile of job A's frame 1 completed = %s, want that frame and job A alone", msg)
	}
}

// Fingerprinting every job in one pass over the frames gives each job the fingerprint its own
// lookups give, for jobs that share frames too, before and after a change.
func TestFingerprintsInOnePassAreEachJobs(t *testing.T) {
	h := newHarness(t, Config{})
	a := h.submit(t, h.request(1, 2, 64, 64, 32))
	h.submit(t, h.request(2, 3, 64, 64, 32)) // frame 2 is both jobs'
	check := func() []uint64 {
		t.Helper()
		var fps []uint64
		err := h.c.db.View(h.ctx, func(tx *coorddb.Tx) error {
			jobs, err := tx.Jobs()
			if err != nil {
				return err
			}
			fps = h.c.statuses.fingerprints(tx, jobs)
			for i, j := range jobs {
				if want := tx.Fingerprint(j); fps[i] != want {
					t.Errorf("job %s: one pass gives %x, its lookups %x", j.ID, fps[i], want)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return fps
	}
	before := check()
	h.relay(t)
	h.apply(t, tileEvent(t, h.frame(t, h.job(t, a.Status.JobID).FrameKey(2)), 0, wire.EventTileCompleted, 1, 1))
	after := check()
	if len(before) != 2 || before[0] == after[0] || before[1] == after[1] {
		t.Fatalf("fingerprints %x then %x: a change to the shared frame must change both jobs'", before, after)
	}
}

// A worker's failures from before its first heartbeat (it probes its renderers before it
// beats) are kept until it is listed, and forgotten only once older than the window.
func TestFailuresOfAWorkerNotListedYetAreKept(t *testing.T) {
	h := newFleetHistory()
	now := time.Now()
	h.failed([]workerFailure{{worker: "w1", f: api.WorkerFailure{Frame: 1, Tile: 2, Class: "panic", Time: now}}})
	h.detail(nil, now) // w1 has not beaten yet
	ws := []api.Worker{{Name: "w1"}}
	h.detail(ws, now.Add(time.Second))
	if len(ws[0].RecentFailures) != 1 || ws[0].RecentFailures[0].Tile != 2 {
		t.Fatalf("w1's failures once listed = %+v, want the one from before its first beat", ws[0].RecentFailures)
	}
	h.detail(nil, now.Add(fleetWindow+time.Minute)) // gone, and its failure old
	ws = []api.Worker{{Name: "w1"}}
	h.detail(ws, now.Add(fleetWindow+2*time.Minute))
	if len(ws[0].RecentFailures) != 0 {
		t.Fatalf("a failure older than the window of a worker gone is kept: %+v", ws[0].RecentFailures)
	}
}
