package coordinator

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/client"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/failure"
	"github.com/tilefarm/tilefarm/internal/wire"
)

// A submission writes O(frames) records: its job, one record per frame and one outbox record
// per frame, whatever the tile count. The same frames in 8 px tiles (48 per frame) and in 64
// px tiles (1 per frame) write exactly as many records.
func TestSubmitWritesRecordsPerFrameNotPerTile(t *testing.T) {
	counts := map[int]map[string]int{}
	for _, size := range []int{8, 64} {
		h := newHarness(t, Config{})
		res := h.submit(t, h.request(1, 5, 64, 48, size))
		if !res.Created || res.Status.FramesTotal != 5 || res.Status.TilesTotal != 5*tileCount(64, 48, size) {
			t.Fatalf("tile size %d: %+v", size, res.Status)
		}
		c, err := h.st.Counts(h.ctx)
		if err != nil {
			t.Fatal(err)
		}
		counts[size] = c
		if c["jobs"] != 1 || c["frames"] != 5 || c["outbox"] != 5 || c["tiles"] != 0 || c["failures"] != 0 {
			t.Fatalf("tile size %d wrote %v; want 1 job, 5 frames, 5 outbox records and nothing per tile", size, c)
		}
		for _, r := range h.outbox(t) {
			if r.Kind != coorddb.OutboxTiles || r.Tiles != nil || r.JobID != res.Status.JobID {
				t.Fatalf("outbox record %+v, want one for every tile of its frame", r)
			}
		}
	}
	for bucket, n := range counts[8] {
		if counts[64][bucket] != n {
			t.Fatalf("bucket %s: %d records with 48 tiles per frame, %d with 1", bucket, n, counts[64][bucket])
		}
	}
}

// Property: a job with a frame step has frames First, First+Step, ... up to Last and no others:
// its status lists them, its outbox dispatches them, and another frame of its range is not its.
func TestSubmitFrameStep(t *testing.T) {
	h := newHarness(t, Config{})
	req := h.request(1, 6, 64, 48, 64)
	req.Step = 2
	res := h.submit(t, req)
	var frames []int
	for _, f := range res.Status.Frames {
		frames = append(frames, f.Frame)
	}
	if !slices.Equal(frames, []int{1, 3, 5}) || res.Status.FramesTotal != 3 || res.Status.FrameStep != 2 || res.Status.TilesTotal != 3 {
		t.Fatalf("status %+v with frames %v, want frames 1, 3, 5", res.Status, frames)
	}
	if n := len(h.outbox(t)); n != 3 {
		t.Fatalf("%d outbox records, want one per frame of the job", n)
	}
	if _, err := h.c.FrameOutput(h.ctx, res.Status.JobID, 2, "png"); !errors.Is(err, api.ErrBadInput) {
		t.Fatalf("frame 2 of a job of every other frame: %v, want bad input", err)
	}
	every := h.submit(t, h.request(1, 6, 64, 48, 64))
	if every.Status.JobID == res.Status.JobID || every.Status.FramesTotal != 6 || every.Status.FrameStep != 0 {
		t.Fatalf("the job of every frame %+v: want another job of 6 frames", every.Status)
	}
	req.Step = 1
	if one := h.submit(t, req); one.Status.JobID != every.Status.JobID || one.Created {
		t.Fatalf("a step of 1 made job %s, want the job of every frame %s", one.Status.JobID, every.Status.JobID)
	}
}

// tileCount is ceil(w/size)*ceil(h/size), computed independently of tiles.Split.
func tileCount(w, h, size int) int { return ((w + size - 1) / size) * ((h + size - 1) / size) }

func TestSubmitSameRequestAgainReturnsExistingJob(t *testing.T) {
	h := newHarness(t, Config{})
	a := h.submit(t, h.request(1, 3, 32, 32, 16))
	before := len(h.outbox(t))
	b := h.submit(t, h.request(1, 3, 32, 32, 16))
	if b.Created || b.Status.JobID != a.Status.JobID {
		t.Fatalf("resubmission: created %v, job %s (first %s)", b.Created, b.Status.JobID, a.Status.JobID)
	}
	if n := len(h.outbox(t)); n != before {
		t.Fatalf("resubmission added %d outbox records", n-before)
	}
	// Another tile size is a scheduling hint, not another request.
	c := h.submit(t, h.request(1, 3, 32, 32, 8))
	if c.Created || c.Status.JobID != a.Status.JobID {
		t.Fatalf("resubmission with another tile size made job %s", c.Status.JobID)
	}
}

func TestSubmitSameKeyDifferentPayloadConflicts(t *testing.T) {
	h := newHarness(t, Config{})
	req := h.request(1, 2, 32, 32, 16)
	req.IdempotencyKey = "shot-42"
	h.submit(t, req)
	req.Last = 3
	_, err := h.c.Submit(h.ctx, req)
	if !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "shot-42") {
		t.Fatalf("same key, other frames: %v, want a conflict naming the key", err)
	}
}

// Overlapping jobs share frames: the second job dispatches only the frames the first did not
// ask for.
func TestSubmitOverlappingJobsShareFrames(t *testing.T) {
	h := newHarness(t, Config{})
	a := h.submit(t, h.request(1, 3, 32, 32, 16))
	h.relay(t)
	b := h.submit(t, h.request(2, 5, 32, 32, 16))
	recs := h.outbox(t)
	if len(recs) != 2 {
		t.Fatalf("second job dispatched %d frames, want 2 (frames 4 and 5)", len(recs))
	}
	for _, r := range recs {
		if r.FrameKey != h.job(t, b.Status.JobID).FrameKey(4) && r.FrameKey != h.job(t, b.Status.JobID).FrameKey(5) {
			t.Fatalf("dispatched frame %s, which job %s already asked for", r.FrameKey, a.Status.JobID)
		}
	}
	f := h.frame(t, h.job(t, b.Status.JobID).FrameKey(2))
	if !slices.Equal(f.JobIDs, []string{a.Status.JobID, b.Status.JobID}) {
		t.Fatalf("shared frame has jobs %v", f.JobIDs)
	}
}

// A frame completed by an earlier job is reused: a new job asking for it is completed at once
// and no frame is dispatched, only the new job's preview movie.
func TestSubmitReusesCompletedFrame(t *testing.T) {
	h := newHarness(t, Config{})
	_, fk := h.submitFrame(t, 32, 32, 16)
	h.completeTiles(t, fk)
	h.apply(t, wire.Event{ID: "done", Type: wire.EventFrameAssembled, FrameKey: fk, Formats: []string{"png"}})
	h.relay(t)
	req := h.request(1, 1, 32, 32, 16)
	req.IdempotencyKey = "again"
	b := h.submit(t, req)
	if !b.Created || b.Status.State != api.JobCompleted || b.Status.TilesCompleted != b.Status.TilesTotal {
		t.Fatalf("new job for a completed frame: %+v", b.Status)
	}
	if recs := h.outbox(t); len(recs) != 1 || recs[0].Kind != coorddb.OutboxMovie || recs[0].JobID != b.Status.JobID {
		t.Fatalf("reusing a completed frame dispatched %+v, want the new job's movie alone", recs)
	}
}

// Bad input is refused with a clear message and writes nothing.
func TestSubmitBadInputWritesNothing(t *testing.T) {
	h := newHarness(t, Config{})
	cases := map[string]func(r *api.SubmitRequest){
		"reversed":         func(r *api.SubmitRequest) { r.First, r.Last = 5, 2 },
		"negative frame":   func(r *api.SubmitRequest) { r.First = -1 },
		"too many frames":  func(r *api.SubmitRequest) { r.First, r.Last = 0, MaxFramesPerJob },
		"unknown camera":   func(r *api.SubmitRequest) { r.Camera = "nope" },
		"huge resolution":  func(r *api.SubmitRequest) { r.Width = 1 << 20 },
		"zero spp":         func(r *api.SubmitRequest) { r.SPP = -3 },
		"tile size":        func(r *api.SubmitRequest) { r.TileSize = -4 },
		"too many tiles":   func(r *api.SubmitRequest) { r.Width, r.Height, r.TileSize, r.Last = 4096, 4096, 1, 1 },
		"unknown format":   func(r *api.SubmitRequest) { r.Formats = []string{"gif"} },
		"blend of a json":  func(r *api.SubmitRequest) { r.Formats = []string{"blend"} },
		"negative step":    func(r *api.SubmitRequest) { r.Step = -2 },
		"missing scene":    func(r *api.SubmitRequest) { r.SceneVersion = strings.Repeat("ab", 32) },
		"not a version":    func(r *api.SubmitRequest) { r.SceneVersion = "../../etc/passwd" },
		"huge idem key":    func(r *api.SubmitRequest) { r.IdempotencyKey = strings.Repeat("k", 1<<20) },
		"huge project":     func(r *api.SubmitRequest) { r.Project = strings.Repeat("p", 4096) },
		"empty everything": func(r *api.SubmitRequest) { *r = api.SubmitRequest{} },
	}
	for name, mod := range cases {
		t.Run(name, func(t *testing.T) {
			req := h.request(1, 2, 32, 32, 16)
			mod(&req)
			_, err := h.c.Submit(h.ctx, req)
			if !errors.Is(err, api.ErrBadInput) {
				t.Fatalf("Submit = %v, want bad input", err)
			}
			if len(err.Error()) > 600 {
				t.Fatalf("error message of %d bytes echoes the input", len(err.Error()))
			}
		})
	}
	c, err := h.st.Counts(h.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for bucket, n := range c {
		if n != 0 {
			t.Errorf("bad submissions left %d records in %s", n, bucket)
		}
	}
}

// A scene's manifest is validated before anything is stored: it must hash to the version it is
// uploaded under, decode (canonical, within the farm's limits), name only files the farm has
// (uploaded first), parse with its files as read from the store, and name nothing its scene
// does not reference.
func TestPutSceneRejectsBadBundles(t *testing.T) {
	h := newHarness(t, Config{})
	good := shotBundle(t)
	// Every file uploaded, as the files of a bundle's content: only the manifest is wrong.
	extra := memBundle(t, good, map[string][]byte{"secrets.txt": []byte("not referenced")})
	putContent(t, h, []byte("not referenced"))
	broken := bundle.FromMemory("x.json", []byte(`{"cameras": [`), nil)
	// The shot with a mesh whose content was never uploaded.
	lacking := memBundle(t, good, map[string][]byte{"torus.obj": []byte("v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 3\n")})
	// The shot with a mesh that does not parse, uploaded: the kind's check reads it from the store.
	badMesh := memBundle(t, good, map[string][]byte{"torus.obj": []byte("v 0 0 0\nf 1 2 9\n")})
	putContent(t, h, []byte("v 0 0 0\nf 1 2 9\n"))
	// A mesh of the right hash under another size: the farm does not have that file.
	resized := memBundle(t, good, nil)
	torus := resized.Files["torus.obj"]
	torus.Size++
	resized.Files["torus.obj"] = torus
	var indented bytes.Buffer
	if err := json.Indent(&indented, good.Encode(), "", " "); err != nil {
		t.Fatal(err)
	}
	tooMany := memBundle(t, good, map[string][]byte{"a.obj": nil, "b.obj": nil})
	strict := newHarness(t, Config{SceneLimits: bundle.Limits{Files: 2}})
	for name, c := range map[string]struct {
		h       *harness
		version string
		raw     []byte
		want    string
	}{
		"wrong version":  {h, strings.Repeat("0", 64), good.Encode(), "hashes to"},
		"not a manifest": {h, good.Version(), []byte("PK\x03\x04 zip file"), "bad scene manifest"},
		"truncated":      {h, good.Version(), good.Encode()[:100], "bad scene manifest"},
		"not canonical":  {h, good.Version(), indented.Bytes(), "canonical"},
		"other format":   {h, good.Version(), bytes.Replace(good.Encode(), []byte(bundle.Format), []byte("tilefarm-scene/1"), 1), "format"},
		"too many files": {strict, tooMany.Version(), tooMany.Encode(), "files exceed"},
		"not uploaded":   {h, lacking.Version(), lacking.Encode(), "does not have"},
		"another size":   {h, resized.Version(), resized.Encode(), "does not have"},
		"unreferenced":   {h, extra.Version(), extra.Encode(), "not referenced"},
		"broken scene":   {h, broken.Version(), broken.Encode(), "scene"},
		"broken mesh":    {h, badMesh.Version(), badMesh.Encode(), "torus.obj"},
		"version syntax": {h, "ABC", good.Encode(), "sha256"},
	} {
		t.Run(name, func(t *testing.T) {
			err := c.h.c.PutScene(c.h.ctx, c.version, c.raw)
			if !errors.Is(err, api.ErrBadInput) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("PutScene = %v, want bad input mentioning %q", err, c.want)
			}
			for _, v := range []string{c.version, extra.Version(), lacking.Version(), badMesh.Version(), resized.Version(), tooMany.Version()} {
				if v == good.Version() {
					continue // the harness's scene, stored
				}
				if ok, _ := c.h.c.HasScene(c.h.ctx, v); ok {
					t.Fatalf("a rejected manifest was stored (%s)", v)
				}
			}
		})
	}
	// Its files uploaded, the manifest that lacked them is stored.
	if _, err := client.UploadScene(h.ctx, h.c, lacking, 0, nil); err != nil {
		t.Fatalf("uploading the scene with its mesh: %v", err)
	}
	if ok, err := h.c.HasScene(h.ctx, lacking.Version()); !ok || err != nil {
		t.Fatalf("HasScene after the upload = %v, %v", ok, err)
	}
}

// memBundle is b with its files read into memory, and files added or replaced by with.
func memBundle(t *testing.T, b *bundle.Bundle, with map[string][]byte) *bundle.Bundle {
	t.Helper()
	files := map[string][]byte{}
	for _, name := range b.Names() {
		files[name] = readFile(t, b, name)
	}
	maps.Copy(files, with)
	return bundle.FromMemory(b.Name, b.Scene, files)
}

// readFile reads the content of b's file name.
func readFile(t *testing.T, b *bundle.Bundle, name string) []byte {
	t.Helper()
	r, err := b.Open(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	data, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// putContent stores data as a scene's file, as an upload does, and returns what it is stored as.
func putContent(t *testing.T, h *harness, data []byte) api.ContentRef {
	t.Helper()
	ref := contentRef(data)
	if err := h.c.PutContent(h.ctx, ref, bytes.NewReader(data)); err != nil {
		t.Fatalf("PutContent: %v", err)
	}
	return ref
}

// contentRef is what data is uploaded as.
func contentRef(data []byte) api.ContentRef {
	sum := sha256.Sum256(data)
	return api.ContentRef{SHA256: hex.EncodeToString(sum[:]), Size: int64(len(data))}
}

// The pending-tiles limit refuses new work with when to retry, never a resubmission of a known
// job; a job that could never fit is bad input, not "busy" forever.
func TestSubmitBusyRefusesNewWorkButAnswersResubmission(t *testing.T) {
	h := newHarness(t, Config{MaxPendingTiles: 10})
	a := h.submit(t, h.request(1, 2, 32, 32, 16)) // 2 frames of 4 tiles
	h.relay(t)
	_, err := h.c.Submit(h.ctx, h.request(3, 4, 32, 32, 16))
	var busy *api.BusyError
	if !errors.As(err, &busy) || !errors.Is(err, api.ErrBusy) {
		t.Fatalf("Submit while busy = %v, want a BusyError", err)
	}
	if busy.Pending != 8 || busy.Adding != 8 || busy.Limit != 10 || busy.RetryAfter < time.Second {
		t.Errorf("busy = %+v, want 8 pending, 8 adding, limit 10 and a retry time", busy)
	}
	if _, err := h.c.Submit(h.ctx, h.request(5, 7, 32, 32, 16)); !errors.Is(err, api.ErrBadInput) {
		t.Errorf("a 12-tile job under a 10-tile limit = %v, want bad input", err)
	}
	again, err := h.c.Submit(h.ctx, h.request(1, 2, 32, 32, 16))
	if err != nil || again.Status.JobID != a.Status.JobID {
		t.Fatalf("resubmission while busy = %+v, %v", again.Status, err)
	}
}

func TestCheckFrameRange(t *testing.T) {
	for _, c := range []struct {
		first, last int
		ok          bool
	}{{1, 1, true}, {0, 99999, true}, {0, 100000, false}, {3, 2, false}, {-1, 4, false}} {
		err := CheckFrameRange(c.first, c.last)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, api.ErrBadInput)) {
			t.Errorf("CheckFrameRange(%d, %d) = %v", c.first, c.last, err)
		}
	}
}

// Property: admission holds under concurrent submissions: with --max-pending-tiles 10, eight
// 8-tile jobs submitted at once admit exactly one, and the pending tiles never pass the limit
// (the count and the job's write are one transaction).
func TestAdmissionHoldsUnderConcurrentSubmissions(t *testing.T) {
	h := newHarness(t, Config{MaxPendingTiles: 10})
	var wg sync.WaitGroup
	var created, busy atomic.Int32
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := h.c.Submit(h.ctx, h.request(10*i+1, 10*i+2, 32, 32, 16)) // 2 frames of 4 tiles
			switch {
			case errors.Is(err, api.ErrBusy):
				busy.Add(1)
			case err != nil:
				t.Errorf("submission %d: %v", i, err)
			case res.Created:
				created.Add(1)
			}
		}()
	}
	wg.Wait()
	if created.Load() != 1 || busy.Load() != 7 {
		t.Fatalf("%d admitted, %d refused as busy; want 1 and 7 under a limit of 10 pending tiles", created.Load(), busy.Load())
	}
	var pending int
	if err := h.c.db.View(h.ctx, func(tx *coorddb.Tx) (err error) { pending, err = pendingTiles(tx); return err }); err != nil || pending != 8 {
		t.Fatalf("%d pending tiles, %v; want the one admitted job's 8", pending, err)
	}
}

// Pending tiles are the tiles not completed of the frames a live job waits for, each frame
// once: a frame whose tiles are done, a dropped frame and a failed one wait for no rendering.
func TestPendingTilesCountsWhatWaits(t *testing.T) {
	h := newHarness(t, Config{})
	pending := func(when string, want int) {
		t.Helper()
		var got int
		err := h.c.db.View(h.ctx, func(tx *coorddb.Tx) (err error) {
			got, err = pendingTiles(tx)
			return err
		})
		if err != nil || got != want {
			t.Fatalf("%s: %d pending tiles, %v; want %d", when, got, err, want)
		}
	}
	a := h.submit(t, h.request(1, 2, 32, 32, 16)) // 2 frames of 4 tiles
	h.relay(t)
	pending("job A submitted", 8)
	ja := h.job(t, a.Status.JobID)
	h.completeTiles(t, ja.FrameKey(1))
	pending("frame 1's tiles completed", 4)
	b := h.submit(t, h.request(2, 3, 32, 32, 16)) // shares frame 2 with A
	h.relay(t)
	pending("job B shares frame 2", 8)
	if _, err := h.c.Cancel(h.ctx, b.Status.JobID); err != nil {
		t.Fatal(err)
	}
	pending("job B cancelled: frame 3 dropped, frame 2 still A's", 4)
	f2 := h.frame(t, ja.FrameKey(2))
	ev := tileEvent(t, f2, 0, wire.EventTileFailed, 1, 1)
	ev.Terminal, ev.Code, ev.Error = true, failure.CodeTerminal, "unknown material"
	h.apply(t, ev)
	pending("frame 2 failed", 0)
}
