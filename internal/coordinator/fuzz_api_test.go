package coordinator

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/client"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/scene/jsonscene"
	"github.com/tilefarm/tilefarm/internal/wire"
	"github.com/tilefarm/tilefarm/objstore"
	"github.com/tilefarm/tilefarm/raster"
)

// fuzzMaxTiles bounds the tiles of a job FuzzAPI lets through to Submit, as fuzzMaxFrames
// bounds its frames. FuzzAPI relays the outbox after every request (as the relay loop would,
// and so that PUT /v1/jobs/{id}/priority, which waits for the outbox, does not wait out its
// timeout), and relaying a job publishes one message per tile: a valid job of a million tiles
// is a legitimate submission that would take minutes to publish. Such inputs are skipped;
// larger ones are still sent (they are refused before anything is written).
const fuzzMaxTiles = 4096

// fuzzAPIHarness is the coordinator FuzzAPI sends every request to, holding something for each
// route to find: a finished job whose frame has an output with named files and tiles with PNGs,
// a job still queued, a job to cancel, a dead letter, a live worker, a small scene uploaded
// besides the shot and one not uploaded yet, to upload (its file is stored), a file not
// uploaded yet and a scene naming it. Every name in it is derived from fixed inputs, so the
// checked-in corpus finds the same jobs, scenes, files and dead letter in every run.
type fuzzAPIHarness struct {
	*harness
	done, queued, cancel string // job ids
	small                []byte // a scene's encoded manifest, not uploaded (its file is)
	smallVersion         string
	uploaded             string         // the version of a small scene, uploaded
	tri                  api.ContentRef // the small scenes' file, uploaded
	content              []byte         // a file's content, not uploaded
	contentRef           api.ContentRef
	lacking              []byte // the manifest of a scene naming content, not uploaded
	lackingVersion       string
}

// The idempotency keys of the harness's jobs: identity.JobID derives their ids.
const (
	fuzzDoneKey   = "fuzz-api-done"
	fuzzQueuedKey = "fuzz-api-queued"
	fuzzCancelKey = "fuzz-api-cancel"
)

func newFuzzAPIHarness(tb testing.TB) *fuzzAPIHarness {
	tb.Helper()
	h := &fuzzAPIHarness{harness: newFuzzHarness(tb, Config{})}
	submit := func(key string, first, last int) string {
		req := h.request(first, last, 32, 18, 16)
		req.IdempotencyKey = key
		res, err := h.c.Submit(h.ctx, req)
		if err != nil {
			tb.Fatalf("Submit %s: %v", key, err)
		}
		return res.Status.JobID
	}
	h.done = submit(fuzzDoneKey, 1, 1)
	h.queued = submit(fuzzQueuedKey, 2, 3)
	h.cancel = submit(fuzzCancelKey, 4, 4)
	if err := h.relayAll(); err != nil {
		tb.Fatal(err)
	}

	// Frame 1 of the finished job: every tile rendered and promoted, and its PNG output with
	// an index naming one more file, as a Blender scene's own output has.
	var f *coorddb.Frame
	err := h.st.View(h.ctx, func(tx *coorddb.Tx) error {
		j, err := tx.Job(h.done)
		if err != nil {
			return err
		}
		f, err = tx.Frame(j.FrameKey(1))
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	ft, err := f.Tiles()
	if err != nil {
		tb.Fatal(err)
	}
	var evs []wire.Event
	for i, t := range ft {
		n := (t.Rect.X1 - t.Rect.X0) * (t.Rect.Y1 - t.Rect.Y0) * 3
		if _, err := finalize.Promote(h.ctx, h.objects, layout.TileManifestKey(f.Key, t.Key), "attempt1", identity.BuildFingerprint(),
			[]finalize.Output{{Name: layout.TileOutputName, Data: raster.EncodeTile(make([]float32, n))}}, nil); err != nil {
			tb.Fatalf("promoting tile %d: %v", i, err)
		}
		evs = append(evs, wire.Event{ID: fmt.Sprintf("fuzz-api-tile-%d", i), Type: wire.EventTileCompleted, TileKey: t.Key, TileIndex: i,
			FrameKey: f.Key, Seq: uint64(i + 1), Delivery: 1, Attempt: "attempt1", Worker: "w1", Time: time.Now().UTC()})
	}
	index, _ := json.Marshal(layout.FrameIndex{Name: "//render/shot_0001.png", Files: []string{"render/depth/depth_0001.png"}})
	name, _ := layout.FrameOutputName("png")
	if _, err := finalize.Promote(h.ctx, h.objects, layout.FrameManifestKey(f.Key, "png"), "attempt1", identity.BuildFingerprint(),
		[]finalize.Output{{Name: name, Data: []byte("frame 1")}, {Name: layout.FrameFileName(0), Data: []byte("depth 1")},
			{Name: layout.FrameIndexName, Data: index}}, nil); err != nil {
		tb.Fatalf("promoting frame 1: %v", err)
	}
	evs = append(evs, wire.Event{ID: "fuzz-api-assembled", Type: wire.EventFrameAssembled, FrameKey: f.Key, Formats: []string{"png"}, Time: time.Now().UTC()})
	if err := h.c.applyEvents(h.ctx, evs); err != nil {
		tb.Fatalf("applyEvents: %v", err)
	}

	// A dead letter (DLQ sequence 1): the first tile a worker of the shot's build fetches.
	build := jsonscene.Build()
	m, err := h.queue.Sources(queue.Capabilities{Builds: []string{build}}).FetchTile(h.ctx, 5*time.Second)
	if err != nil || m == nil {
		tb.Fatalf("fetching a tile to dead-letter: %v (message %v)", err, m)
	}
	if err := h.queue.DeadLetterNow(h.ctx, m, "fuzz"); err != nil {
		tb.Fatalf("DeadLetterNow: %v", err)
	}
	if err := h.queue.Workers.Beat(h.ctx, api.Worker{Name: "w1", Host: "h", Slots: 2, LastSeen: time.Now().UTC(), Builds: []string{build},
		Tags: []string{"gpu"}, Blocklisted: []string{}}); err != nil {
		tb.Fatal(err)
	}

	smallScene := []byte(`{"settings": {"camera": "c", "width": 8, "height": 6},` +
		` "cameras": [{"name": "c", "position": [0,0,3], "look_at": [0,0,0]}], "materials": [{"name": "m", "type": "diffuse"}],` +
		` "objects": [{"type": "mesh", "file": "tri.obj", "material": "m"}]}`)
	small := bundle.FromMemory("scene.json", smallScene, map[string][]byte{"tri.obj": []byte("v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 3\n")})
	h.small, h.smallVersion = small.Encode(), small.Version()
	h.tri = api.ContentRef{SHA256: small.Files["tri.obj"].SHA256, Size: small.Files["tri.obj"].Size}
	// The same scene under another version is uploaded, with its file: submissions may name it.
	uploaded := bundle.FromMemory("other.json", bytes.Replace(smallScene, []byte(`"width": 8`), []byte(`"width": 4`), 1),
		map[string][]byte{"tri.obj": []byte("v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 3\n")})
	h.uploaded = uploaded.Version()
	if _, err := client.UploadScene(h.ctx, h.c, uploaded, 0, nil); err != nil {
		tb.Fatalf("UploadScene: %v", err)
	}
	// A file not uploaded, and the small scene with it as its mesh: its manifest is refused
	// until the file is uploaded.
	h.content = []byte("v 0 0 0\nv 2 0 0\nv 0 2 0\nf 1 2 3\n")
	lacking := bundle.FromMemory("lacking.json", smallScene, map[string][]byte{"tri.obj": h.content})
	h.contentRef = api.ContentRef{SHA256: lacking.Files["tri.obj"].SHA256, Size: lacking.Files["tri.obj"].Size}
	h.lacking, h.lackingVersion = lacking.Encode(), lacking.Version()

	// GET /v1/events streams until the server stops its streams: stopped from the start, a
	// stream sends every job once and ends.
	h.c.StopStreams()
	return h
}

// relayAll publishes everything pending in the outbox, as the relay loop does.
func (h *fuzzAPIHarness) relayAll() error {
	for {
		recs, err := h.st.PendingOutbox(h.ctx, relayRecords)
		if err != nil {
			return err
		}
		if len(recs) == 0 {
			return nil
		}
		if err := h.c.publishRecords(h.ctx, h.js, recs); err != nil {
			return fmt.Errorf("publishRecords: %w", err)
		}
	}
}

// hugeSubmission reports whether body decodes, as the handler decodes it, to a request the
// coordinator would accept as a job of more than fuzzMaxFrames frames or fuzzMaxTiles tiles
// (planSubmission only reads).
func (h *fuzzAPIHarness) hugeSubmission(body []byte) bool {
	if skipSubmission(body) {
		return true
	}
	var req api.SubmitRequest
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&req); err != nil {
		return false
	}
	j, tiles, _, err := h.c.planSubmission(h.ctx, req)
	return err == nil && (j.Frames() > fuzzMaxFrames || tiles*j.Frames() > fuzzMaxTiles)
}

// rawRequest is the bytes of an HTTP/1.1 request as a client sends them: the request line's
// target is path, with query after a "?" when there is one; header holds header lines
// (Content-Type, Accept, Transfer-Encoding, ...) and, unless it declares its own Content-Length
// or Transfer-Encoding, body goes with its length.
func rawRequest(method, path, query, header string, body []byte) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s", method, path)
	if query != "" {
		fmt.Fprintf(&b, "?%s", query)
	}
	b.WriteString(" HTTP/1.1\r\nHost: coordinator\r\n")
	b.WriteString(header)
	if header != "" && !strings.HasSuffix(header, "\n") {
		b.WriteString("\r\n")
	}
	if l := strings.ToLower(header); !strings.Contains(l, "content-length") && !strings.Contains(l, "transfer-encoding") {
		fmt.Fprintf(&b, "Content-Length: %d\r\n", len(body))
	}
	b.WriteString("\r\n")
	b.Write(body)
	return b.Bytes()
}

// serverRequest parses raw as net/http's server does; ok is false for a request the server
// answers itself without calling a handler (malformed, not HTTP/1, OPTIONS *, an Expect it
// refuses).
func serverRequest(raw []byte) (*http.Request, bool) {
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(raw)))
	if err != nil || req.ProtoMajor != 1 || (req.Method == http.MethodOptions && req.RequestURI == "*") {
		return nil, false
	}
	if e := req.Header.Get("Expect"); e != "" && !strings.EqualFold(e, "100-continue") {
		return nil, false
	}
	delete(req.Header, "Host")
	return req, true
}

// errReader reads as its error, or as the end of a body without one.
type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	return 0, io.EOF
}

// fuzzAPISeed is one request of FuzzAPI's seed corpus.
type fuzzAPISeed struct {
	method, path, query, header string
	body                        []byte
}

const (
	fuzzJSONHeader     = "Content-Type: application/json\r\n"
	fuzzManifestHeader = "Content-Type: " + api.ManifestType + "\r\n"
	fuzzContentHeader  = "Content-Type: " + api.ContentDataType + "\r\n"
)

// fuzzAPISeeds are, for every route of the API, a valid request and broken ones, plus requests
// no route serves.
func (h *fuzzAPIHarness) fuzzAPISeeds() []fuzzAPISeed {
	var seeds []fuzzAPISeed
	add := func(method, target, header string, body []byte) {
		path, query, _ := strings.Cut(target, "?")
		seeds = append(seeds, fuzzAPISeed{method, path, query, header, body})
	}
	get := func(target string) { add("GET", target, "", nil) }
	s := func(v string) []byte { return []byte(v) }

	// /metrics, /healthz, /v1/openapi.json.
	get("/metrics")
	add("GET", "/metrics", "Accept: application/openmetrics-text; version=1.0.0\r\nAccept-Encoding: gzip\r\n", nil)
	add("GET", "/metrics?name[]=x", "Accept: */*;q=abc\r\n", nil)
	add("POST", "/metrics", fuzzJSONHeader, s(`{}`))
	get("/healthz")
	add("DELETE", "/healthz", "", nil)
	get("/v1/openapi.json")
	add("HEAD", "/v1/openapi.json", "", nil)

	// Scenes: stored, not stored, not a version; manifests valid, under another version, of
	// garbage, truncated, without a length, too large, not canonical, naming a file not
	// uploaded, over a limit.
	shot, small := "/v1/scenes/"+h.version, "/v1/scenes/"+h.smallVersion
	var indented bytes.Buffer
	_ = json.Indent(&indented, h.small, "", "  ")
	add("HEAD", shot, "", nil)
	add("HEAD", small, "", nil)
	add("HEAD", "/v1/scenes/nothex", "", nil)
	add("HEAD", "/v1/scenes/"+strings.ToUpper(h.version), "", nil)
	add("PUT", small, fuzzManifestHeader, h.small)
	add("PUT", shot, fuzzManifestHeader, h.small)
	add("PUT", small, fuzzManifestHeader, s("garbage"))
	add("PUT", small, fuzzManifestHeader, h.small[:len(h.small)-1])
	add("PUT", small, fuzzManifestHeader+"Content-Length: "+strconv.Itoa(len(h.small)+10)+"\r\n", h.small)
	add("PUT", small, fuzzManifestHeader+"Transfer-Encoding: chunked\r\n", fmt.Appendf(nil, "%x\r\n%s\r\n0\r\n\r\n", len(h.small), h.small))
	add("PUT", small, fuzzManifestHeader+"Content-Length: 6000000000\r\n", nil)
	add("PUT", small, fuzzManifestHeader, indented.Bytes())
	add("PUT", small, fuzzManifestHeader, bytes.Replace(h.small, []byte(bundle.Format), []byte("tilefarm-scene/1"), 1))
	add("PUT", small, fuzzManifestHeader, bytes.Replace(h.small, []byte(`"tri.obj"`), []byte(`"../tri.obj"`), 1))
	add("PUT", small, fuzzManifestHeader, bytes.Replace(h.small, []byte(`"size":`), []byte(`"size":-`), 1))
	add("PUT", "/v1/scenes/"+h.lackingVersion, fuzzManifestHeader, h.lacking)
	add("PUT", "/v1/scenes/"+strings.Repeat("0", 64), fuzzManifestHeader, s(`{"format":"tilefarm-scene/2","name":"","scene":null,"files":{}}`))
	add("PUT", "/v1/scenes/..%2F..%2Fetc", fuzzManifestHeader, h.small)
	add("POST", small, fuzzManifestHeader, h.small)

	// A scene's files: which the farm lacks (valid, bad hashes, negative sizes, not JSON,
	// unknown fields, two values); uploads of one valid, again, of wrong bytes, of another
	// length, truncated, without a length, under a hash not hex, of an unclean path.
	missing := func(refs ...api.ContentRef) []byte {
		b, _ := json.Marshal(api.MissingContentRequest{Files: refs})
		return b
	}
	add("POST", "/v1/content/missing", fuzzJSONHeader, missing(h.tri, h.contentRef))
	add("POST", "/v1/content/missing", fuzzJSONHeader, missing(api.ContentRef{SHA256: h.tri.SHA256, Size: h.tri.Size + 1}))
	add("POST", "/v1/content/missing", fuzzJSONHeader, s(`{"files": []}`))
	add("POST", "/v1/content/missing", fuzzJSONHeader, s(`{"files": null}`))
	add("POST", "/v1/content/missing", fuzzJSONHeader, missing(api.ContentRef{SHA256: strings.ToUpper(h.tri.SHA256), Size: 1}))
	add("POST", "/v1/content/missing", fuzzJSONHeader, missing(api.ContentRef{SHA256: h.tri.SHA256, Size: -1}))
	add("POST", "/v1/content/missing", fuzzJSONHeader, s(`{"files": [{"sha256": "`+h.tri.SHA256+`", "size": 1e400}]}`))
	add("POST", "/v1/content/missing", fuzzJSONHeader, s(`{"files": [`))
	add("POST", "/v1/content/missing", fuzzJSONHeader, s(`{"hashes": []}`))
	add("POST", "/v1/content/missing", fuzzJSONHeader, s(`{"files": []} {}`))
	add("POST", "/v1/content/missing", fuzzJSONHeader+"Transfer-Encoding: chunked\r\n", s("5\r\n{\"fil\r\n0\r\n\r\n"))
	add("GET", "/v1/content/missing", "", nil)
	file := "/v1/content/" + h.contentRef.SHA256
	add("PUT", file, fuzzContentHeader, h.content)
	add("PUT", file, fuzzContentHeader, h.content)
	add("PUT", "/v1/content/"+h.tri.SHA256, fuzzContentHeader, h.content[:h.tri.Size])
	add("PUT", file, fuzzContentHeader, append(slices.Clone(h.content), '\n'))
	add("PUT", file, fuzzContentHeader, h.content[:len(h.content)-1])
	add("PUT", file, fuzzContentHeader+"Content-Length: "+strconv.Itoa(len(h.content)+10)+"\r\n", h.content)
	add("PUT", file, fuzzContentHeader+"Transfer-Encoding: chunked\r\n", fmt.Appendf(nil, "%x\r\n%s\r\n0\r\n\r\n", len(h.content), h.content))
	add("PUT", "/v1/content/"+strings.ToUpper(h.contentRef.SHA256), fuzzContentHeader, h.content)
	add("PUT", "/v1/content/missing", fuzzContentHeader, h.content)
	add("PUT", "/v1/content/..%2F..%2Fetc", fuzzContentHeader, h.content)
	add("PUT", "/v1/content/"+contentRef(nil).SHA256, "", nil)
	add("POST", file, fuzzContentHeader, h.content)

	// Submissions: new, again, a conflicting payload under the same key, broken ones.
	req := h.request(5, 6, 32, 18, 16)
	req.IdempotencyKey = "fuzz-api-new"
	valid, _ := json.Marshal(req)
	req.Last = 7
	conflicting, _ := json.Marshal(req)
	add("POST", "/v1/jobs", fuzzJSONHeader, valid)
	add("POST", "/v1/jobs", fuzzJSONHeader, valid)
	add("POST", "/v1/jobs", fuzzJSONHeader, conflicting)
	add("POST", "/v1/jobs", "Content-Type: text/plain\r\n", valid)
	add("POST", "/v1/jobs", fuzzJSONHeader, s(`{"scene_version": "`+h.version+`", "first": 1, "last": 1, "scene_frames": true, "step": 3, "preview": 2}`))
	add("POST", "/v1/jobs", fuzzJSONHeader, s(`{"scene_version": "`+h.version+`", "first": 1, "last": 1, "width": 16384, "height": 16384, "tile_size": 1}`))
	add("POST", "/v1/jobs", fuzzJSONHeader, s(`{"scene_version": "`+h.uploaded+`", "scene_frames": true, "formats": ["exr", "png16"], "spp": 1}`))
	add("POST", "/v1/jobs", fuzzJSONHeader, s(`{"scene_version": "`+h.uploaded+`", "first": 0, "last": 9, "step": 4, "preview": 3, "requires": ["gpu", "GPU"], "build": "x", "max_slots": 2}`))
	add("POST", "/v1/jobs", fuzzJSONHeader, s(`{"scene_version": "`+h.smallVersion+`", "first": 1, "last": 1}`))
	add("POST", "/v1/jobs", fuzzJSONHeader, s(`{"scene_version": `))
	add("POST", "/v1/jobs", fuzzJSONHeader, s(`{"scene_version": "`+h.version+`", "first": 1, "last": 1} {}`))
	add("POST", "/v1/jobs", fuzzJSONHeader, s(`{"scene_version": "`+h.version+`", "first": 1e400, "last": -1}`))
	add("POST", "/v1/jobs", fuzzJSONHeader+"Transfer-Encoding: chunked\r\n", s("5\r\n{\"fir\r\n0\r\n\r\n"))
	// Jobs too large to relay quickly, which FuzzAPI skips: chunked, 1000 frames; 65536 tiles.
	huge := `{"scene_version": "` + h.version + `", "first": 1, "last": 1000, "width": 32, "height": 18}`
	add("POST", "/v1/jobs", fuzzJSONHeader+"Transfer-Encoding: chunked\r\n", fmt.Appendf(nil, "%x\r\n%s\r\n0\r\n\r\n", len(huge), huge))
	add("POST", "/v1/jobs", fuzzJSONHeader, s(`{"scene_version": "`+h.version+`", "first": 1, "last": 1, "width": 4096, "height": 4096, "tile_size": 16}`))
	add("POST", "/v1/jobs", "", nil)

	// Jobs and statuses.
	get("/v1/jobs")
	get("/v1/jobs?state=failed&limit=-1")
	get("/v1/jobs/" + h.done)
	get("/v1/jobs/" + h.queued)
	get("/v1/jobs/job-000000000000000000000000")
	get("/v1/jobs/%00%ff")
	get("/v1/jobs/" + strings.Repeat("j", 4096))
	add("DELETE", "/v1/jobs/"+h.done, "", nil)

	// Frame outputs, files and indexes: served, not completed, not asked for, not numbers,
	// out of range, of unknown jobs.
	out := func(job, frame, format string) string { return "/v1/jobs/" + job + "/frames/" + frame + "/" + format }
	get(out(h.done, "1", "png"))
	get(out(h.done, "1", "png") + "?file=0")
	get(out(h.done, "1", "png") + "?file=1")
	get(out(h.done, "1", "png") + "?file=-1")
	get(out(h.done, "1", "png") + "?file=x&file=0")
	get(out(h.done, "1", "png") + "?file=99999999999999999999")
	get(out(h.done, "1", "exr"))
	get(out(h.done, "1", "gif"))
	get(out(h.done, "2", "png"))
	get(out(h.done, "-1", "png"))
	get(out(h.done, "99999999999999999999", "png"))
	get(out(h.done, "x", "png"))
	get(out(h.queued, "2", "png"))
	get(out("job-000000000000000000000000", "1", "png"))
	get(out(h.done, "1", "png") + "/index")
	get(out(h.queued, "3", "png") + "/index")
	get(out(h.done, "1", "exr") + "/index")
	get(out(h.done, "0x1", "png") + "/index")

	// Tiles and tile PNGs.
	tiles := func(job, frame string) string { return "/v1/jobs/" + job + "/frames/" + frame + "/tiles" }
	get(tiles(h.done, "1"))
	get(tiles(h.queued, "3"))
	get(tiles(h.done, "7"))
	get(tiles(h.done, "+1"))
	get(tiles("job-000000000000000000000000", "1"))
	get(tiles(h.done, "1") + "/0/png")
	get(tiles(h.done, "1") + "/3/png")
	get(tiles(h.done, "1") + "/4/png")
	get(tiles(h.done, "1") + "/-1/png")
	get(tiles(h.done, "1") + "/9223372036854775807/png")
	get(tiles(h.done, "1") + "/x/png")
	get(tiles(h.queued, "2") + "/0/png")
	get(tiles(h.done, "2") + "/0/png")

	// Cancelling, reprioritizing.
	add("POST", "/v1/jobs/"+h.cancel+"/cancel", "", nil)
	add("POST", "/v1/jobs/"+h.done+"/cancel", "", nil)
	add("POST", "/v1/jobs/job-000000000000000000000000/cancel", fuzzJSONHeader, s(`{}`))
	add("GET", "/v1/jobs/"+h.cancel+"/cancel", "", nil)
	prio := "/v1/jobs/" + h.queued + "/priority"
	add("PUT", prio, fuzzJSONHeader, s(`{"priority": 7}`))
	add("PUT", prio, fuzzJSONHeader, s(`{"priority": -7}`))
	add("PUT", prio, fuzzJSONHeader, s(`{"priority": 700}`))
	add("PUT", prio, fuzzJSONHeader, s(`{"priority": 1e400}`))
	add("PUT", prio, fuzzJSONHeader, s(`{"priority": "7"}`))
	add("PUT", prio, fuzzJSONHeader, s(`{"priority": null}`))
	add("PUT", prio, fuzzJSONHeader, s(`{}`))
	add("PUT", prio, fuzzJSONHeader, s(`{"priority": 1, "band": "high"}`))
	add("PUT", prio, fuzzJSONHeader, s(`{"priority": 1}{"priority": 2}`))
	add("PUT", prio, fuzzJSONHeader, nil)
	add("PUT", "/v1/jobs/"+h.done+"/priority", fuzzJSONHeader, s(`{"priority": -1}`))
	add("PUT", "/v1/jobs/job-000000000000000000000000/priority", fuzzJSONHeader, s(`{"priority": 1}`))

	// Workers, dead letters, requeues, the event stream.
	get("/v1/workers")
	add("POST", "/v1/workers", fuzzJSONHeader, s(`{"name": "w2"}`))
	get("/v1/dlq")
	add("POST", "/v1/dlq/1/requeue", "", nil)
	add("POST", "/v1/dlq/0/requeue", "", nil)
	add("POST", "/v1/dlq/-1/requeue", "", nil)
	add("POST", "/v1/dlq/seven/requeue", "", nil)
	add("POST", "/v1/dlq/18446744073709551615/requeue", "", nil)
	add("POST", "/v1/dlq/18446744073709551616/requeue", "", nil)
	add("POST", "/v1/dlq/4611686018427387904/requeue", "", nil)
	add("GET", "/v1/dlq/1/requeue", "", nil)
	get("/v1/events")
	add("GET", "/v1/events", "Accept: text/event-stream\r\nLast-Event-ID: 99\r\n", nil)

	// Nothing serves these: unknown paths, unclean paths, other methods, absolute targets.
	get("/")
	get("/v1/nope")
	get("/v1//jobs")
	get("/v1/jobs/../metrics")
	get("/v1/jobs/")
	add("PATCH", "/v1/jobs", fuzzJSONHeader, valid)
	add("OPTIONS", "/v1/jobs", "", nil)
	add("CONNECT", "coordinator:80", "", nil)
	get("http://coordinator/v1/jobs")
	return seeds
}

// FuzzAPI: whatever request a client sends the HTTP API, on any route (method, path, query,
// headers and body, framed as a client frames it on the wire), the coordinator never panics
// and never answers a 5xx; every error a route's handler answers is JSON in the API's error
// shape (exactly a message and a kind of the catalogue), so a client can always tell the
// artist what was wrong; and every JSON answer is valid JSON. Only net/http's own answers (no
// route: 404, wrong method: 405, redirects to the clean path) are not JSON. Whatever a content
// upload sends, what is stored under a hash hashes to it, and an upload answered 200 is stored.
//
// Every input goes to one coordinator, so inputs build on each other: uploads, submissions,
// cancellations, priority changes and requeues change what later requests find. Requests the
// server answers itself (malformed HTTP) never reach the handler and are skipped, as are
// submissions of jobs too large to relay quickly (fuzzMaxFrames, fuzzMaxTiles). The event
// stream (GET /v1/events) is fuzzed too: the harness's streams are stopped, so each request
// gets every job once and ends instead of streaming until the client goes.
func FuzzAPI(f *testing.F) {
	h := newFuzzAPIHarness(f)
	handler := h.c.Handler()
	mux := handler.(*http.ServeMux)
	for _, s := range h.fuzzAPISeeds() {
		f.Add(s.method, s.path, s.query, s.header, s.body)
	}

	f.Fuzz(func(t *testing.T, method, path, query, header string, body []byte) {
		req, ok := serverRequest(rawRequest(method, path, query, header, body))
		if !ok {
			return
		}
		_, pattern := mux.Handler(req)
		if pattern == "POST /v1/jobs" {
			// The body as the handler reads it: de-chunked, cut to its Content-Length.
			seen, err := io.ReadAll(req.Body)
			if h.hugeSubmission(seen) {
				return
			}
			req.Body = io.NopCloser(io.MultiReader(bytes.NewReader(seen), errReader{err}))
		}
		req = req.WithContext(h.ctx)
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		if err := h.relayAll(); err != nil {
			t.Fatalf("relaying after %s %s: %v", req.Method, req.RequestURI, err)
		}

		code, raw := rec.Code, rec.Body.Bytes()
		what := fmt.Sprintf("%s %q (route %q)", req.Method, req.RequestURI, pattern)
		if code >= 500 {
			t.Fatalf("%s = %d %s", what, code, raw)
		}
		if pattern == "PUT /v1/content/{sha256}" {
			h.checkContent(t, what, code, strings.TrimPrefix(req.URL.Path, "/v1/content/"))
		}
		ctype, _, _ := mime.ParseMediaType(rec.Header().Get("Content-Type"))
		if ctype == "application/json" && !json.Valid(raw) {
			t.Fatalf("%s = %d with a body that is not JSON: %q", what, code, raw)
		}
		if code < 400 || pattern == "" {
			return
		}
		if code == http.StatusNotFound && req.Method == http.MethodHead && pattern == "HEAD /v1/scenes/{version}" && len(raw) == 0 {
			return // the scene is not stored: the answer HEAD asks for
		}
		if ctype != "application/json" {
			t.Fatalf("%s = %d with Content-Type %q: %q, want a JSON error", what, code, rec.Header().Get("Content-Type"), raw)
		}
		var e api.ErrorBody
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&e); err != nil || e.Error == "" || api.OfKind(e.Kind) == nil {
			t.Fatalf("%s = %d with %s, want an error body of a message and a known kind (%v)", what, code, raw, err)
		}
	})
}

// checkContent asserts what is stored under the hash sha after an upload answered code: nothing,
// or bytes that hash to sha; and something, if the upload was answered 200.
func (h *fuzzAPIHarness) checkContent(t *testing.T, what string, code int, sha string) {
	t.Helper()
	if !validHash(sha) {
		return
	}
	data, err := h.objects.Get(h.ctx, layout.ContentKey(sha))
	switch {
	case errors.Is(err, objstore.ErrNotFound):
		if code == http.StatusOK {
			t.Fatalf("%s = 200, but nothing is stored under %s", what, sha)
		}
	case err != nil:
		t.Fatalf("reading content %s after %s: %v", sha, what, err)
	case contentRef(data).SHA256 != sha:
		t.Fatalf("after %s = %d, content %s holds %d bytes that hash to %s", what, code, sha, len(data), contentRef(data).SHA256)
	}
}
