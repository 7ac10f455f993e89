package coordinator

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/wire"
	"github.com/tilefarm/tilefarm/render"
)

// newFuzzHarness is a harness with no deadline (a fuzz run may be long) and no log (the fuzzed
// paths warn about every forged input).
func newFuzzHarness(tb testing.TB, cfg Config) *harness {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	return buildHarness(tb, ctx, cfg, queue.DefaultConfig(), slog.New(slog.DiscardHandler))
}

// fuzzMaxFrames bounds the frame ranges FuzzSubmitRequest lets through to Submit. A valid job
// of up to MaxFramesPerJob frames is a legitimate submission that writes one record per frame
// and answers with a status listing each: thousands of them would only slow the fuzzer down
// and grow the database, so such inputs are skipped. Ranges beyond the limit are still sent
// (they are refused before anything is written).
const fuzzMaxFrames = 64

// skipSubmission reports whether body decodes, as the handler decodes it, to a request for a
// frame range longer than fuzzMaxFrames but within MaxFramesPerJob.
func skipSubmission(body []byte) bool {
	var req api.SubmitRequest
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&req); err != nil || req.SceneFrames {
		return false
	}
	if req.First < 0 || req.Last > render.MaxFrame || req.Last < req.First { // refused; no overflow below
		return false
	}
	n := req.Last - req.First + 1
	return n > fuzzMaxFrames && n <= MaxFramesPerJob
}

// FuzzSubmitRequest: whatever body a client POSTs to /v1/jobs, the answer is never a 5xx
// (every client mistake is a 4xx with a kind and a message), its body is valid JSON, and a 200
// or 201 carries the job's id (201 exactly when the call created the job) and counters that add
// up. Every input goes to one coordinator, so earlier inputs' jobs are there too: resubmissions
// and idempotency conflicts are part of what is fuzzed.
func FuzzSubmitRequest(f *testing.F) {
	h := newFuzzHarness(f, Config{})
	handler := h.c.Handler()

	marshalReq := func(r api.SubmitRequest) []byte {
		b, err := json.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	valid := h.request(1, 1, 32, 18, 16)
	f.Add(marshalReq(valid))
	f.Add(marshalReq(valid)) // the same again: 200 with the same job
	keyed := h.request(1, 2, 32, 18, 16)
	keyed.IdempotencyKey, keyed.Project = "fuzz-key", "fuzz"
	f.Add(marshalReq(keyed))
	keyed.Last = 3 // same key, other payload: 409
	f.Add(marshalReq(keyed))
	all := h.request(0, 0, 16, 9, 8)
	all.SceneFrames, all.Camera, all.Formats = true, "top", []string{"exr", "png16", "png", "exr"}
	f.Add(marshalReq(all))
	v := fmt.Sprintf("%q", h.version)
	keyedID := fmt.Sprintf("%q", identity.JobID(keyed.IdempotencyKey))
	for _, body := range []string{
		``, `{`, `}`, `null`, `[]`, `""`, `0`, `{"scene_version": `, `{"first": "one"}`, `{}`,
		`{"scene_version": ` + v + `, "first": 1, "last": 1} trailing`,
		`{"scene_version": ` + v + `, "first": 1, "last": 1, "width": 32, "height": 18}{"first": 2}`,
		// Huge numbers.
		`{"scene_version": ` + v + `, "first": 1e400, "last": 1}`,
		`{"scene_version": ` + v + `, "first": 0, "last": 9223372036854775807}`,
		`{"scene_version": ` + v + `, "first": -9223372036854775808, "last": 9223372036854775807}`,
		`{"scene_version": ` + v + `, "first": 1, "last": 1, "width": 99999999999999999999}`,
		`{"scene_version": ` + v + `, "first": 1, "last": 1, "width": 16384, "height": 16384, "tile_size": 1}`,
		`{"scene_version": ` + v + `, "first": 1, "last": 1, "width": 8192, "height": 8192, "tile_size": 8}`,
		`{"scene_version": ` + v + `, "first": 1, "last": 1, "spp": 2147483648, "tile_size": 1099511627776}`,
		`{"scene_version": ` + v + `, "first": 1000000000, "last": 1000000000, "width": 8, "height": 8}`,
		`{"scene_version": ` + v + `, "first": 0, "last": 99999, "width": 8, "height": 8}`,
		`{"scene_version": ` + v + `, "first": 0, "last": 100000, "width": 8, "height": 8}`,
		`{"scene_version": ` + v + `, "first": 1, "last": 20, "width": 8192, "height": 8192, "tile_size": 64}`,
		`{"scene_version": ` + v + `, "first": 1, "last": 1, "priority": -9223372036854775808, "width": 4, "height": 4}`,
		// Negative and reversed frames, other bad settings.
		`{"scene_version": ` + v + `, "first": -1, "last": 1}`,
		`{"scene_version": ` + v + `, "first": -5, "last": -1}`,
		`{"scene_version": ` + v + `, "first": 3, "last": 1}`,
		`{"scene_version": ` + v + `, "first": 1, "last": 1, "width": -1, "height": 0, "spp": -3, "tile_size": -16}`,
		`{"scene_version": ` + v + `, "first": 1, "last": 1, "tile_size": 4097}`,
		`{"scene_version": ` + v + `, "first": 1, "last": 1, "camera": "nope"}`,
		// Unknown formats, wrong types.
		`{"scene_version": ` + v + `, "first": 1, "last": 1, "formats": ["gif"]}`,
		`{"scene_version": ` + v + `, "first": 1, "last": 1, "formats": "png"}`,
		`{"scene_version": ` + v + `, "first": 1, "last": 1, "formats": [null, ""]}`,
		`{"scene_version": ` + v + `, "first": 1.5, "last": true}`,
		`{"scene_version": ` + v + `, "first": 1, "last": 1, "scene_frames": "yes"}`,
		// Scene versions: unknown, malformed, upper case.
		`{"scene_version": "` + strings.Repeat("0", 64) + `", "first": 1, "last": 1}`,
		`{"scene_version": "` + strings.ToUpper(h.version) + `", "first": 1, "last": 1}`,
		`{"scene_version": "../../etc/passwd", "first": 1, "last": 1}`,
		`{"scene_version": "\u0000", "first": 1, "last": 1}`,
		// Limits on strings.
		`{"scene_version": ` + v + `, "first": 1, "last": 1, "idempotency_key": "` + strings.Repeat("k", MaxIdempotencyKey+1) + `"}`,
		`{"scene_version": ` + v + `, "first": 1, "last": 1, "project": "` + strings.Repeat("p", MaxProjectName+1) + `"}`,
		`{"scene_version": ` + v + `, "first": 1, "last": 1, "width": 8, "height": 8, "project": "\xff\xfe", "idempotency_key": "\u2028"}`,
		// Jobs to wait for: unknown, known (the keyed job's), not a list, too long, itself.
		`{"scene_version": ` + v + `, "first": 1, "last": 1, "after": ["job-000000000000000000000000"]}`,
		`{"scene_version": ` + v + `, "first": 5, "last": 6, "width": 8, "height": 8, "after": [` + keyedID + `], "after_frames": ` + keyedID + `}`,
		`{"scene_version": ` + v + `, "first": 1, "last": 1, "after": "job-000000000000000000000000"}`,
		`{"scene_version": ` + v + `, "first": 1, "last": 1, "after_frames": "` + strings.Repeat("j", 4096) + `"}`,
		`{"scene_version": ` + v + `, "first": 1, "last": 2, "width": 32, "height": 18, "tile_size": 16, "idempotency_key": "fuzz-key", "project": "fuzz", "after": [` + keyedID + `]}`,
	} {
		f.Add([]byte(body))
	}

	f.Fuzz(func(t *testing.T, body []byte) {
		if skipSubmission(body) {
			return
		}
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/jobs", bytes.NewReader(body)))
		code, raw := rec.Code, rec.Body.Bytes()
		if code >= 500 {
			t.Fatalf("POST /v1/jobs = %d %s for body %q", code, raw, body)
		}
		if !json.Valid(raw) {
			t.Fatalf("POST /v1/jobs = %d with a body that is not JSON: %q", code, raw)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Fatalf("POST /v1/jobs = %d with Content-Type %q", code, ct)
		}
		switch code {
		case http.StatusOK, http.StatusCreated:
			var res api.SubmitResult
			if err := json.Unmarshal(raw, &res); err != nil {
				t.Fatalf("decoding the %d answer %s: %v", code, raw, err)
			}
			st := res.Status
			if st.JobID == "" {
				t.Fatalf("%d without a job id: %s", code, raw)
			}
			if res.Created != (code == http.StatusCreated) {
				t.Fatalf("%d with created=%v", code, res.Created)
			}
			if st.FramesTotal != st.LastFrame-st.FirstFrame+1 || len(st.Frames) != st.FramesTotal ||
				st.TilesCompleted+st.TilesFailed > st.TilesTotal || st.TilesTotal <= 0 {
				t.Fatalf("%d with a status that does not add up: %s", code, raw)
			}
			if !slices.Contains([]api.JobState{api.JobQueued, api.JobRendering, api.JobCompleted, api.JobFailed, api.JobWaiting, api.JobBlocked}, st.State) {
				t.Fatalf("%d with job state %q", code, st.State)
			}
		default:
			if code < 400 {
				t.Fatalf("POST /v1/jobs = %d %s, want 200, 201 or a 4xx", code, raw)
			}
			var e api.ErrorBody
			if err := json.Unmarshal(raw, &e); err != nil || e.Error == "" || e.Kind == "" {
				t.Fatalf("POST /v1/jobs = %d with an error body %s that has no message and kind (%v)", code, raw, err)
			}
		}
	})
}

// fuzzEventsHarness is the one coordinator FuzzEvents applies every input to: frame 1 of the
// shot at 32x18 in 16 px tiles (4 tiles), submitted and dispatched.
type fuzzEventsHarness struct {
	*harness
	jobID string
	frame *coorddb.Frame // as submitted: its key, tile count and settings
}

func newFuzzEventsHarness(tb testing.TB) *fuzzEventsHarness {
	tb.Helper()
	h := newFuzzHarness(tb, Config{})
	res, err := h.c.Submit(h.ctx, h.request(1, 1, 32, 18, 16))
	if err != nil {
		tb.Fatalf("Submit: %v", err)
	}
	for {
		recs, err := h.st.PendingOutbox(h.ctx, relayRecords)
		if err != nil {
			tb.Fatal(err)
		}
		if len(recs) == 0 {
			break
		}
		if err := h.c.publishRecords(h.ctx, h.js, recs); err != nil {
			tb.Fatalf("publishRecords: %v", err)
		}
	}
	var fr *coorddb.Frame
	err = h.st.View(h.ctx, func(tx *coorddb.Tx) error {
		j, err := tx.Job(res.Status.JobID)
		if err != nil {
			return err
		}
		fr, err = tx.Frame(j.FrameKey(1))
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	return &fuzzEventsHarness{harness: h, jobID: res.Status.JobID, frame: fr}
}

// snapshot is what FuzzEvents checks after every event: the job's status, the frame record and
// the state of each tile as the tile table has it.
type snapshot struct {
	status api.Status
	frame  *coorddb.Frame
	tiles  []coorddb.TileState
}

func (h *fuzzEventsHarness) snapshot(tb testing.TB) snapshot {
	tb.Helper()
	var s snapshot
	err := h.st.View(h.ctx, func(tx *coorddb.Tx) error {
		j, err := tx.Job(h.jobID)
		if err != nil {
			return err
		}
		if s.status, err = jobStatus(tx, j, tx.Frame); err != nil {
			return err
		}
		if s.frame, err = tx.Frame(h.frame.Key); err != nil {
			return err
		}
		table, err := tx.TileTable(s.frame)
		if err != nil {
			return err
		}
		for i := range s.frame.TilesTotal {
			st, _ := table.Get(i)
			s.tiles = append(s.tiles, st)
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("reading the job back: %v", err)
	}
	return s
}

// check asserts that a snapshot is internally consistent, and that nothing final in prev was
// undone: a completed tile stays completed, a completed job stays completed.
func (s snapshot) check(t *testing.T, prev snapshot) {
	t.Helper()
	f := s.frame
	completed, dead := 0, 0
	for i, st := range s.tiles {
		switch st {
		case coorddb.TileCompleted:
			completed++
		case coorddb.TileDeadLettered:
			dead++
		case coorddb.TileQueued, coorddb.TileRendering, coorddb.TileFailedRetryable:
		default:
			t.Fatalf("tile %d in state %s", i, st)
		}
		if prev.tiles != nil && prev.tiles[i] == coorddb.TileCompleted && st != coorddb.TileCompleted {
			t.Fatalf("completed tile %d is now %s", i, st)
		}
	}
	if f.TilesTotal != prev.frame.TilesTotal || f.TilesTotal != len(s.tiles) {
		t.Fatalf("frame has %d tiles, had %d", f.TilesTotal, prev.frame.TilesTotal)
	}
	if f.TilesCompleted != completed || f.TilesFailed != dead {
		t.Fatalf("frame counts %d completed and %d failed tiles; its tile table has %d and %d", f.TilesCompleted, f.TilesFailed, completed, dead)
	}
	if f.State != f.Derive() {
		t.Fatalf("frame stored as %s but its counters say %s", f.State, f.Derive())
	}
	st := s.status
	if st.TilesTotal != f.TilesTotal || st.TilesCompleted < 0 || st.TilesFailed < 0 ||
		st.TilesCompleted > st.TilesTotal || st.TilesFailed > st.TilesTotal || st.TilesCompleted+st.TilesFailed > st.TilesTotal {
		t.Fatalf("job counts %d completed and %d failed of %d tiles", st.TilesCompleted, st.TilesFailed, st.TilesTotal)
	}
	if st.TileAttempts < prev.status.TileAttempts {
		t.Fatalf("tile attempts went down from %d to %d", prev.status.TileAttempts, st.TileAttempts)
	}
	if !slices.Contains([]api.JobState{api.JobQueued, api.JobRendering, api.JobCompleted, api.JobFailed}, st.State) {
		t.Fatalf("job state %q", st.State)
	}
	if len(st.Frames) != 1 || !slices.Contains([]api.FrameState{"queued", "rendering", "assembling", "completed", "failed"}, st.Frames[0].State) {
		t.Fatalf("frame states %+v", st.Frames)
	}
	if prev.status.State == api.JobCompleted && st.State != api.JobCompleted {
		t.Fatalf("completed job is now %s", st.State)
	}
}

// FuzzEvents: events are untrusted input from workers. Whatever event decodes is applied
// without a panic and without an error (one naming a frame or tile the coordinator does not
// have is ignored), and the job stays internally consistent: its counters match its tile table
// and its states, the frame's stored state is the one its counters derive, and nothing final is
// undone. Every input is applied to the same job, so inputs build on each other as a worker's
// events do; a failure found after many inputs may need those before it to reproduce.
func FuzzEvents(f *testing.F) {
	h := newFuzzEventsHarness(f)
	fr := h.frame
	ft, err := fr.Tiles()
	if err != nil {
		f.Fatal(err)
	}
	ev := func(i int, typ string, seq, d uint64) wire.Event {
		return wire.Event{ID: fmt.Sprintf("%s:%d:%d:%d", typ, i, seq, d), Type: typ, TileKey: ft[i].Key, TileIndex: i,
			FrameKey: fr.Key, Seq: seq, Delivery: d, Attempt: fmt.Sprintf("a%d-%d", seq, d), Worker: "w1"}
	}
	var seeds []wire.Event
	for i := range ft {
		seq := uint64(i + 1)
		failed, terminal := ev(i, wire.EventTileFailed, seq, 1), ev(i, wire.EventTileFailed, seq, 2)
		failed.Code, failed.Error = "render", "boom"
		terminal.Terminal, terminal.Code, terminal.Error = true, "invalid_scene", strings.Repeat("x", 2000)
		seeds = append(seeds, ev(i, wire.EventTileStarted, seq, 1), failed, ev(i, wire.EventTileStarted, seq, 2), terminal,
			ev(i, wire.EventTileCompleted, seq, 3))
	}
	recovered := ev(0, wire.EventTileStarted, 9, 1)
	recovered.SamplesRecovered = 1 << 40
	rendered := ev(1, wire.EventTileCompleted, 9, 1)
	rendered.SamplesRendered = -7
	wrongKey := ev(0, wire.EventTileCompleted, 1, 1)
	wrongKey.TileKey = ft[1].Key
	outOfRange := ev(0, wire.EventTileCompleted, 1, 1)
	outOfRange.TileIndex = len(ft)
	negative := ev(0, wire.EventTileStarted, 1, 1)
	negative.TileIndex = -1
	unknownFrame := ev(0, wire.EventTileCompleted, 1, 1)
	unknownFrame.FrameKey = strings.Repeat("e", 64)
	noFrame := ev(0, wire.EventTileStarted, 1, 1)
	noFrame.FrameKey = ""
	seeds = append(seeds, recovered, rendered, wrongKey, outOfRange, negative, unknownFrame, noFrame,
		wire.Event{ID: "fa", Type: wire.EventFrameAssembled, FrameKey: fr.Key, Formats: []string{"png"}},
		wire.Event{ID: "fa2", Type: wire.EventFrameAssembled, FrameKey: fr.Key, Formats: []string{"exr", "gif", ""}},
		wire.Event{ID: "ff", Type: wire.EventFrameFailed, FrameKey: fr.Key, Terminal: true, Formats: []string{"png16"}, Error: "encode"},
		wire.Event{ID: "ff2", Type: wire.EventFrameFailed, FrameKey: fr.Key, Formats: []string{"png"}},
		wire.Event{ID: "fu", Type: wire.EventFrameAssembled, FrameKey: strings.Repeat("0", 64), Formats: []string{"png"}},
		wire.Event{ID: "t", Type: "tile.exploded", FrameKey: fr.Key},
		wire.Event{ID: "mr", Type: wire.EventMovieReady, JobID: fr.JobIDs[0]},
		wire.Event{ID: "mf", Type: wire.EventMovieFailed, JobID: fr.JobIDs[0], Terminal: true, Error: strings.Repeat("y", 2000)},
		wire.Event{ID: "mu", Type: wire.EventMovieReady, JobID: "job-000000000000000000000000"},
		wire.Event{ID: "mn", Type: wire.EventMovieFailed, Terminal: true})
	for _, e := range seeds {
		b, err := json.Marshal(e)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	fk := fmt.Sprintf("%q", fr.Key)
	for _, raw := range []string{
		``, `{`, `null`, `[]`, `"tile.started"`, `{"type": 7}`, `{}`,
		`{"type": "frame.completed", "frame_key": ` + fk + `, "formats": ["png"]}`, // the old name of frame.assembled
		`{"type": "tile.started", "frame_key": ` + fk + `, "tile_index": 1e3, "seq": -1}`,
		`{"type": "tile.started", "frame_key": ` + fk + `, "tile_index": 9223372036854775807, "seq": 18446744073709551615, "delivery": 18446744073709551615}`,
		`{"type": "tile.failed", "terminal": true, "frame_key": ` + fk + `, "tile_key": "` + ft[2].Key + `", "tile_index": 2, "seq": 18446744073709551615, "time": "9999-12-31T23:59:59-23:59"}`,
		`{"type": "tile.completed", "frame_key": ` + fk + `, "tile_key": "` + ft[3].Key + `", "tile_index": 3, "time": "not a time"}`,
		`{"type": "frame.failed", "terminal": true, "frame_key": ` + fk + `, "formats": null, "error": "\ud800"}`,
		"\x00\xff garbage",
	} {
		f.Add([]byte(raw))
	}

	prev := h.snapshot(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		var e wire.Event
		if err := json.Unmarshal(data, &e); err != nil {
			return
		}
		if err := h.c.applyEvents(h.ctx, []wire.Event{e}); err != nil {
			t.Fatalf("applying %s: %v", data, err)
		}
		s := h.snapshot(t)
		s.check(t, prev)
		prev = s
	})
}
