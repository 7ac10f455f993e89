package coordinator

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/tilefarm/tilefarm/internal/farm"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/store"
)

func TestSubmitWritesJobFramesTilesAndOneOutboxRecordPerTile(t *testing.T) {
	h := newHarness(t, Config{})
	const w, ht, size, first, last = 100, 50, 32, 3, 5
	perFrame := tileCount(w, ht, size) // 4 x 2
	req := smallRequest(t, first, last, w, ht, size)
	res := h.submit(t, req)

	if !res.Created {
		t.Error("first submission: Created = false")
	}
	st := res.Status
	if st.FramesTotal != last-first+1 || st.TilesTotal != perFrame*(last-first+1) || st.TilesCompleted != 0 {
		t.Errorf("status frames %d tiles %d/%d, want %d frames, %d tiles, 0 completed",
			st.FramesTotal, st.TilesCompleted, st.TilesTotal, last-first+1, perFrame*(last-first+1))
	}
	if st.State != StateQueued || ExitCode(st.State) != 42 {
		t.Errorf("new job state %q (exit %d), want queued (42)", st.State, ExitCode(st.State))
	}
	if st.FirstFrame != first || st.LastFrame != last || st.Camera != "orbit" || st.Scene != "scene.json" {
		t.Errorf("status identity = frames %d-%d camera %q scene %q", st.FirstFrame, st.LastFrame, st.Camera, st.Scene)
	}
	if st.SceneVersion != req.Bundle.Version() {
		t.Errorf("scene version %s, want the bundle's %s", st.SceneVersion, req.Bundle.Version())
	}

	// The scene is stored once, content-addressed, before anything can be dispatched.
	if _, err := h.objects.Stat(h.ctx, farm.SceneKey(req.Bundle.Version())); err != nil {
		t.Errorf("scene bundle not stored: %v", err)
	}

	j := h.job(t, st.JobID)
	if len(j.FrameKeys) != last-first+1 || j.TileSize != size || j.Settings.Width != w || j.Settings.Height != ht || j.Settings.SPP != 2 {
		t.Errorf("stored job = %+v", j)
	}
	if !slices.Equal(j.Formats, []string{"png"}) {
		t.Errorf("job formats %v, want [png]", j.Formats)
	}
	if g, err := h.jobByKey(t, j.IdempotencyKey); err != nil || g != j.ID {
		t.Errorf("idempotency index: %s, %v; want %s", g, err, j.ID)
	}

	// Every tile of every frame, and exactly one outbox record for each, nothing else.
	recs := h.outbox(t)
	if len(recs) != perFrame*(last-first+1) {
		t.Fatalf("outbox has %d records, want %d (one per tile)", len(recs), perFrame*(last-first+1))
	}
	byID := map[string]store.OutboxRecord{}
	for _, r := range recs {
		if r.Subject != queue.SubjectRender {
			t.Errorf("outbox record %s on subject %q, want %q", r.MsgID, r.Subject, queue.SubjectRender)
		}
		if _, dup := byID[r.MsgID]; dup {
			t.Errorf("two outbox records with msg id %s", r.MsgID)
		}
		byID[r.MsgID] = r
	}
	seenFrameKeys := map[string]bool{}
	for i, fk := range j.FrameKeys {
		if seenFrameKeys[fk] {
			t.Errorf("frame key %s repeated", fk)
		}
		seenFrameKeys[fk] = true
		f := h.frame(t, fk)
		if f.Frame != first+i || f.State != store.FrameQueued || !slices.Equal(f.JobIDs, []string{j.ID}) {
			t.Errorf("frame %d: number %d state %q jobs %v", first+i, f.Frame, f.State, f.JobIDs)
		}
		if len(tileKeys(t, f)) != perFrame {
			t.Fatalf("frame %d has %d tiles, want %d", f.Frame, len(tileKeys(t, f)), perFrame)
		}
		covered := make([]int, w*ht)
		for _, tk := range tileKeys(t, f) {
			tl := h.tile(t, tk)
			if tl.State != store.TileQueued || tl.FrameKey != fk || tl.Attempts != 0 {
				t.Errorf("tile %s: state %q frame %s attempts %d", tk, tl.State, tl.FrameKey, tl.Attempts)
			}
			r, ok := byID[tk]
			if !ok {
				t.Errorf("tile %s has no outbox record", tk)
				continue
			}
			var job farm.TileJob
			if err := json.Unmarshal(r.Data, &job); err != nil {
				t.Fatalf("decoding tile job: %v", err)
			}
			if job.TileKey != tk || job.FrameKey != fk || job.Frame != f.Frame || job.JobID != j.ID ||
				job.SceneVersion != j.SceneVersion || job.Rect != tl.Rect || job.Settings != j.Settings || job.InputHash == "" {
				t.Errorf("tile job for %s = %+v", tk, job)
			}
			rc := tl.Rect
			if rc.X0 < 0 || rc.Y0 < 0 || rc.X1 > w || rc.Y1 > ht || rc.X1-rc.X0 > size || rc.Y1-rc.Y0 > size || rc.X1 <= rc.X0 || rc.Y1 <= rc.Y0 {
				t.Errorf("tile %s rect %+v outside a %dx%d frame of %d px tiles", tk, rc, w, ht, size)
			}
			for y := max(rc.Y0, 0); y < min(rc.Y1, ht); y++ {
				for x := max(rc.X0, 0); x < min(rc.X1, w); x++ {
					covered[y*w+x]++
				}
			}
		}
		for p, n := range covered {
			if n != 1 {
				t.Fatalf("frame %d pixel (%d,%d) covered by %d tiles, want 1", f.Frame, p%w, p/w, n)
			}
		}
	}
}

func (h *harness) jobByKey(t *testing.T, key string) (string, error) {
	t.Helper()
	var id string
	err := h.st.View(h.ctx, func(tx *store.Tx) error {
		j, err := tx.JobByIdempotencyKey(key)
		if err == nil {
			id = j.ID
		}
		return err
	})
	return id, err
}

func TestSubmitSameRequestAgainReturnsExistingJob(t *testing.T) {
	h := newHarness(t, Config{})
	req := smallRequest(t, 1, 2, 64, 64, 32)
	first := h.submit(t, req)
	before := h.outbox(t)

	again := h.submit(t, smallRequest(t, 1, 2, 64, 64, 32))
	if again.Created {
		t.Error("resubmission: Created = true")
	}
	if again.Status.JobID != first.Status.JobID {
		t.Errorf("resubmission job %s, want %s", again.Status.JobID, first.Status.JobID)
	}
	// Tile size is a scheduling hint, not part of the payload: same job, nothing enqueued.
	other := h.submit(t, smallRequest(t, 1, 2, 64, 64, 16))
	if other.Created || other.Status.JobID != first.Status.JobID || other.Status.TilesTotal != first.Status.TilesTotal {
		t.Errorf("resubmission with another tile size: created %v job %s tiles %d; want the existing job with %d tiles",
			other.Created, other.Status.JobID, other.Status.TilesTotal, first.Status.TilesTotal)
	}
	after := h.outbox(t)
	if len(after) != len(before) || len(before) != 2*tileCount(64, 64, 32) {
		t.Fatalf("outbox grew from %d to %d records on resubmission (want %d both times)", len(before), len(after), 2*tileCount(64, 64, 32))
	}
	for i := range before {
		if after[i].Seq != before[i].Seq || after[i].MsgID != before[i].MsgID {
			t.Errorf("outbox record %d changed: %+v -> %+v", i, before[i], after[i])
		}
	}
	if n := h.jobCount(t); n != 1 {
		t.Errorf("%d jobs stored, want 1", n)
	}
	if f := h.frame(t, h.job(t, first.Status.JobID).FrameKeys[0]); len(f.JobIDs) != 1 {
		t.Errorf("frame job ids %v after resubmission, want one", f.JobIDs)
	}
}

func TestSubmitSameKeyDifferentPayloadConflicts(t *testing.T) {
	h := newHarness(t, Config{})
	req := smallRequest(t, 1, 2, 64, 64, 32)
	req.IdempotencyKey = "nightly-shot-010"
	first := h.submit(t, req)
	before := h.outbox(t)

	for name, mutate := range map[string]func(*SubmitRequest){
		"spp":     func(r *SubmitRequest) { r.SPP = 3 },
		"frames":  func(r *SubmitRequest) { r.Last = 3 },
		"camera":  func(r *SubmitRequest) { r.Camera = "top" },
		"formats": func(r *SubmitRequest) { r.Formats = []string{"png", "exr"} },
		"project": func(r *SubmitRequest) { r.Project = "other" },
	} {
		r := smallRequest(t, 1, 2, 64, 64, 32)
		r.IdempotencyKey = req.IdempotencyKey
		mutate(&r)
		_, err := h.c.Submit(h.ctx, r)
		if !errors.Is(err, ErrConflict) {
			t.Errorf("%s changed under the same key: err = %v, want ErrConflict", name, err)
			continue
		}
		if !strings.Contains(err.Error(), req.IdempotencyKey) || !strings.Contains(err.Error(), first.Status.JobID) {
			t.Errorf("conflict error %q should name the key and the existing job", err)
		}
	}
	if after := h.outbox(t); len(after) != len(before) {
		t.Errorf("outbox grew from %d to %d records on conflicts", len(before), len(after))
	}
	if n := h.jobCount(t); n != 1 {
		t.Errorf("%d jobs stored after conflicts, want 1", n)
	}
	// The same key with the same payload is still fine.
	if res := h.submit(t, req); res.Created || res.Status.JobID != first.Status.JobID {
		t.Errorf("same key and payload: created %v job %s, want existing %s", res.Created, res.Status.JobID, first.Status.JobID)
	}
}

func TestSubmitOverlappingJobsShareFrames(t *testing.T) {
	h := newHarness(t, Config{})
	const w, ht, size = 64, 48, 32
	perFrame := tileCount(w, ht, size)
	a := h.submit(t, smallRequest(t, 1, 3, w, ht, size))
	nA := len(h.outbox(t))
	b := h.submit(t, smallRequest(t, 2, 5, w, ht, size))
	if !b.Created || b.Status.JobID == a.Status.JobID {
		t.Fatalf("overlapping job: created %v id %s (first %s), want a new job", b.Created, b.Status.JobID, a.Status.JobID)
	}
	recs := h.outbox(t)
	if got, want := len(recs)-nA, 2*perFrame; got != want {
		t.Errorf("overlapping job added %d outbox records, want %d (only frames 4 and 5 are new)", got, want)
	}
	ja, jb := h.job(t, a.Status.JobID), h.job(t, b.Status.JobID)
	if jb.FrameKeys[0] != ja.FrameKeys[1] || jb.FrameKeys[1] != ja.FrameKeys[2] {
		t.Fatalf("frames 2-3 have different keys in the two jobs")
	}
	for _, fk := range jb.FrameKeys[:2] {
		f := h.frame(t, fk)
		if !slices.Equal(sortedCopy(f.JobIDs), sortedCopy([]string{ja.ID, jb.ID})) {
			t.Errorf("shared frame %d job ids %v, want both jobs", f.Frame, f.JobIDs)
		}
		if len(tileKeys(t, f)) != perFrame {
			t.Errorf("shared frame %d has %d tiles, want %d", f.Frame, len(tileKeys(t, f)), perFrame)
		}
	}
	newTiles := map[string]bool{}
	for _, r := range recs[nA:] {
		var job farm.TileJob
		if err := json.Unmarshal(r.Data, &job); err != nil {
			t.Fatal(err)
		}
		if job.Frame != 4 && job.Frame != 5 {
			t.Errorf("second job enqueued a tile of frame %d, which the first job already has", job.Frame)
		}
		newTiles[r.MsgID] = true
	}
	if len(newTiles) != 2*perFrame {
		t.Errorf("second job's records name %d distinct tiles, want %d", len(newTiles), 2*perFrame)
	}
	if b.Status.TilesTotal != 4*perFrame || b.Status.FramesTotal != 4 {
		t.Errorf("second job totals: %d frames, %d tiles; want 4, %d", b.Status.FramesTotal, b.Status.TilesTotal, 4*perFrame)
	}
}

func TestSubmitReusesCompletedFrame(t *testing.T) {
	h := newHarness(t, Config{})
	const w, ht, size = 32, 32, 32 // one tile per frame
	a := h.submit(t, smallRequest(t, 1, 1, w, ht, size))
	fk := h.job(t, a.Status.JobID).FrameKeys[0]
	tk := tileKeys(t, h.frame(t, fk))[0]
	h.apply(t, farm.Event{ID: "c1", Type: farm.EventTileCompleted, TileKey: tk, FrameKey: fk, Attempt: "a1", Worker: "w"})
	h.apply(t, farm.Event{ID: "f1", Type: farm.EventFrameCompleted, FrameKey: fk, Formats: []string{"png"}})
	nBefore := len(h.outbox(t))

	b := h.submit(t, smallRequest(t, 1, 2, w, ht, size))
	if !b.Created {
		t.Fatal("second job not created")
	}
	if got := len(h.outbox(t)) - nBefore; got != 1 {
		t.Errorf("second job enqueued %d tiles, want 1 (frame 1 is already completed)", got)
	}
	st := b.Status
	if st.FramesCompleted != 1 || st.TilesCompleted != 1 || st.Frames[0].State != store.FrameCompleted {
		t.Errorf("second job sees %d frames, %d tiles completed (frame 1 %q); want the reused frame completed",
			st.FramesCompleted, st.TilesCompleted, st.Frames[0].State)
	}
	if st.State != StateRendering {
		t.Errorf("half-reused job state %q, want %q", st.State, StateRendering)
	}
}

// TestSubmitSharedFrameGetsRequestedFormats: a second job asking for EXR of a frame that an
// earlier PNG-only job created (and that is not assembled yet) must get its EXR: the shared
// frame's formats, which decide what the assembler encodes, must include every job's formats.
func TestSubmitSharedFrameGetsRequestedFormats(t *testing.T) {
	h := newHarness(t, Config{})
	a := h.submit(t, smallRequest(t, 1, 1, 32, 32, 32))
	reqB := smallRequest(t, 1, 1, 32, 32, 32)
	reqB.Formats = []string{"exr"}
	reqB.IdempotencyKey = "exr-delivery" // see TestSubmitOtherFormatWithoutKeyIsNoConflict for the derived key
	b := h.submit(t, reqB)
	if !b.Created || b.Status.JobID == a.Status.JobID {
		t.Fatalf("exr job: created %v id %s; want a new job", b.Created, b.Status.JobID)
	}
	f := h.frame(t, h.job(t, b.Status.JobID).FrameKeys[0])
	if !slices.Contains(f.Formats, "exr") {
		t.Errorf("shared frame formats %v: job %s asked for exr but the assembler will not produce it", f.Formats, b.Status.JobID)
	}
}

// TestSubmitOtherFormatWithoutKeyIsNoConflict: an artist who rendered PNGs and now asks for
// the same frames as EXR, without an explicit idempotency key, gave no key that could conflict.
// The derived key leaves formats out while payload_hash covers them, so today this is reported as
// "idempotency key ... already names job ... with a different request" (exit 1), and
// `coordinator render --out x_####.exr` after a PNG render in the same --data fails.
func TestSubmitOtherFormatWithoutKeyIsNoConflict(t *testing.T) {
	h := newHarness(t, Config{})
	a := h.submit(t, smallRequest(t, 1, 1, 32, 32, 32))
	req := smallRequest(t, 1, 1, 32, 32, 32)
	req.Formats = []string{"exr"}
	res, err := h.c.Submit(h.ctx, req)
	if errors.Is(err, ErrConflict) {
		t.Fatalf("asking for exr of a job first submitted as png, with no idempotency key: %v", err)
	}
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	if res.Status.JobID == a.Status.JobID && !slices.Contains(h.job(t, res.Status.JobID).Formats, "exr") {
		t.Errorf("exr request returned png-only job %s", res.Status.JobID)
	}
}

func TestSubmitBadInputWritesNothing(t *testing.T) {
	h := newHarness(t, Config{})
	cases := map[string]func(*SubmitRequest){
		"reversed range":    func(r *SubmitRequest) { r.First, r.Last = 5, 2 },
		"too many frames":   func(r *SubmitRequest) { r.First, r.Last = 1, MaxFramesPerJob+1 },
		"unknown camera":    func(r *SubmitRequest) { r.Camera = "dolly" },
		"negative tile":     func(r *SubmitRequest) { r.TileSize = -1 },
		"huge tile":         func(r *SubmitRequest) { r.TileSize = 1 << 20 },
		"unknown format":    func(r *SubmitRequest) { r.Formats = []string{"png", "jpg"} },
		"absurd spp":        func(r *SubmitRequest) { r.SPP = 1 << 30 },
		"negative spp":      func(r *SubmitRequest) { r.SPP = -4 },
		"absurd resolution": func(r *SubmitRequest) { r.Width, r.Height = 1<<20, 1<<20 },
		"no bundle":         func(r *SubmitRequest) { r.Bundle = nil },
		"missing asset":     func(r *SubmitRequest) { r.Bundle.Assets = map[string][]byte{} },
		"garbage scene":     func(r *SubmitRequest) { r.Bundle.Scene = []byte("{not json") },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			r := smallRequest(t, 1, 2, 64, 64, 32)
			mutate(&r)
			res, err := h.c.Submit(h.ctx, r)
			if !errors.Is(err, ErrBadInput) {
				t.Fatalf("err = %v (result %+v), want ErrBadInput", err, res)
			}
			if strings.TrimSpace(strings.TrimPrefix(err.Error(), ErrBadInput.Error()+":")) == "" {
				t.Errorf("error %q does not say what is wrong", err)
			}
		})
	}
	if n := h.jobCount(t); n != 0 {
		t.Errorf("%d jobs stored after bad submissions", n)
	}
	if recs := h.outbox(t); len(recs) != 0 {
		t.Errorf("%d outbox records after bad submissions", len(recs))
	}
	if objs, err := h.objects.List(h.ctx, ""); err != nil || len(objs) != 0 {
		t.Errorf("object store after bad submissions: %v, %v; want empty", objs, err)
	}
}

// TestSubmitZeroTileSizeMeansDefault pins down what an omitted tile size does over the API:
// the CLI rejects --tile 0, but a request without tile_size gets 64 px tiles.
func TestSubmitZeroTileSizeMeansDefault(t *testing.T) {
	h := newHarness(t, Config{})
	res := h.submit(t, smallRequest(t, 1, 1, 130, 70, 0))
	if want := tileCount(130, 70, 64); res.Status.TilesTotal != want {
		t.Errorf("tile size 0: %d tiles, want %d (64 px default)", res.Status.TilesTotal, want)
	}
	if j := h.job(t, res.Status.JobID); j.TileSize != 64 {
		t.Errorf("stored tile size %d, want 64", j.TileSize)
	}
}

func TestSubmitDefaultFramesAndSettingsFromScene(t *testing.T) {
	h := newHarness(t, Config{})
	req := SubmitRequest{Bundle: shotBundle(t), SceneFrames: true, Width: 16, Height: 16, TileSize: 16, SPP: 1}
	res := h.submit(t, req)
	// examples/shot/scene.json declares frames 1-24 and camera "orbit".
	if res.Status.FirstFrame != 1 || res.Status.LastFrame != 24 || res.Status.FramesTotal != 24 || res.Status.Camera != "orbit" {
		t.Errorf("defaults: frames %d-%d (%d) camera %q; want the scene's 1-24, orbit",
			res.Status.FirstFrame, res.Status.LastFrame, res.Status.FramesTotal, res.Status.Camera)
	}
	j := h.job(t, res.Status.JobID)
	if j.Settings.MaxDepth != 6 || j.Settings.Seed != 7 {
		t.Errorf("settings %+v: want the scene's max_depth 6 and seed 7", j.Settings)
	}
	if len(h.outbox(t)) != 24 {
		t.Errorf("%d outbox records, want 24", len(h.outbox(t)))
	}
}

func TestSubmitBusyRefusesAndWritesNothing(t *testing.T) {
	h := newHarness(t, Config{MaxQueued: 1})
	for i := range 2 {
		if _, err := h.farm.Publish(h.ctx, queue.SubjectRender, fmt.Sprintf("filler-%d", i), []byte("{}"), nil); err != nil {
			t.Fatalf("Publish: %v", err)
		}
	}
	_, err := h.c.Submit(h.ctx, smallRequest(t, 1, 1, 32, 32, 32))
	if !errors.Is(err, ErrBusy) {
		t.Fatalf("Submit with 2 queued and MaxQueued 1: %v, want ErrBusy", err)
	}
	if n := h.jobCount(t); n != 0 {
		t.Errorf("%d jobs stored while busy", n)
	}
	if recs := h.outbox(t); len(recs) != 0 {
		t.Errorf("%d outbox records while busy", len(recs))
	}
}

// A cron job re-running submit for a job the farm already holds gets the job's state, not
// "busy", however full the queue is.
func TestResubmitWhileBusyReturnsTheJob(t *testing.T) {
	h := newHarness(t, Config{MaxQueued: 1})
	first := h.submit(t, smallRequest(t, 1, 1, 32, 32, 32))
	for i := range 2 {
		if _, err := h.farm.Publish(h.ctx, queue.SubjectRender, fmt.Sprintf("filler-%d", i), []byte("{}"), nil); err != nil {
			t.Fatalf("Publish: %v", err)
		}
	}
	again, err := h.c.Submit(h.ctx, smallRequest(t, 1, 1, 32, 32, 32))
	if err != nil || again.Created || again.Status.JobID != first.Status.JobID {
		t.Fatalf("resubmit while busy: %+v, %v; want job %s", again, err, first.Status.JobID)
	}
	if _, err := h.c.Submit(h.ctx, smallRequest(t, 2, 2, 32, 32, 32)); !errors.Is(err, ErrBusy) {
		t.Fatalf("a new job while busy: %v, want ErrBusy", err)
	}
}

func TestCheckFrameRange(t *testing.T) {
	const maxInt = int(^uint(0) >> 1)
	for _, c := range []struct {
		first, last int
		ok          bool
	}{
		{1, 24, true},
		{0, 0, true},
		{-5, 5, false},
		{1, MaxFramesPerJob, true},
		{1, MaxFramesPerJob + 1, false},
		{5, 2, false},
		{0, maxInt, false},
		{-maxInt - 1, maxInt, false},
		{-maxInt - 1, -maxInt - 1, false},
		{maxInt, maxInt, false},
	} {
		err := CheckFrameRange(c.first, c.last)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrBadInput)) {
			t.Errorf("CheckFrameRange(%d, %d) = %v, want ok=%v", c.first, c.last, err, c.ok)
		}
	}
}
