package coordinator

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/farm"
	"github.com/tilefarm/tilefarm/internal/queue"
)

// call sends a request to the handler and decodes the JSON body into out (if not nil).
func call(t *testing.T, srv *httptest.Server, method, path string, body []byte, out any) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s %s: decoding %q: %v", method, path, raw, err)
		}
	}
	return resp.StatusCode, raw
}

func expectError(t *testing.T, srv *httptest.Server, method, path string, body []byte, code int, kind string) APIError {
	t.Helper()
	var e APIError
	got, raw := call(t, srv, method, path, body, &e)
	if got != code || e.Kind != kind || e.Error == "" {
		t.Errorf("%s %s = %d %s, want %d with kind %q and a message", method, path, got, raw, code, kind)
	}
	return e
}

func marshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestHTTPSubmitAndErrors(t *testing.T) {
	h := newHarness(t, Config{})
	srv := httptest.NewServer(h.c.Handler())
	t.Cleanup(srv.Close)

	expectError(t, srv, "POST", "/v1/jobs", []byte(`{"bundle": {`), http.StatusBadRequest, "bad_input")
	expectError(t, srv, "POST", "/v1/jobs", []byte(`{"first": "one"}`), http.StatusBadRequest, "bad_input")
	bad := smallRequest(t, 9, 3, 64, 64, 32)
	if e := expectError(t, srv, "POST", "/v1/jobs", marshal(t, bad), http.StatusBadRequest, "bad_input"); !strings.Contains(e.Error, "reversed") {
		t.Errorf("bad input message %q does not say the range is reversed", e.Error)
	}

	req := smallRequest(t, 1, 2, 64, 64, 32)
	req.IdempotencyKey = "http-key"
	var res SubmitResult
	if code, raw := call(t, srv, "POST", "/v1/jobs", marshal(t, req), &res); code != http.StatusCreated || !res.Created || res.Status.JobID == "" {
		t.Fatalf("first POST = %d %s, want 201 with a created job", code, raw)
	}
	var again SubmitResult
	if code, raw := call(t, srv, "POST", "/v1/jobs", marshal(t, req), &again); code != http.StatusOK || again.Created || again.Status.JobID != res.Status.JobID {
		t.Errorf("repeated POST = %d %s, want 200 with the same job, not created", code, raw)
	}
	conflicting := req
	conflicting.SPP = 5
	expectError(t, srv, "POST", "/v1/jobs", marshal(t, conflicting), http.StatusConflict, "conflict")

	var st Status
	if code, raw := call(t, srv, "GET", "/v1/jobs/"+res.Status.JobID, nil, &st); code != http.StatusOK || st.JobID != res.Status.JobID || st.State != StateQueued || st.FramesTotal != 2 {
		t.Errorf("GET job = %d %s", code, raw)
	}
	var jobs []Status
	if code, raw := call(t, srv, "GET", "/v1/jobs", nil, &jobs); code != http.StatusOK || len(jobs) != 1 || jobs[0].JobID != res.Status.JobID {
		t.Errorf("GET jobs = %d %s, want the one job", code, raw)
	}
	expectError(t, srv, "GET", "/v1/jobs/job-doesnotexist", nil, http.StatusNotFound, "not_found")
	expectError(t, srv, "GET", "/v1/jobs/job-doesnotexist/frames/1/png", nil, http.StatusNotFound, "not_found")

	framePath := func(frame, format string) string {
		return fmt.Sprintf("/v1/jobs/%s/frames/%s/%s", res.Status.JobID, frame, format)
	}
	expectError(t, srv, "GET", framePath("1", "png"), nil, http.StatusConflict, "not_ready")
	expectError(t, srv, "GET", framePath("2", "png"), nil, http.StatusConflict, "not_ready")
	expectError(t, srv, "GET", framePath("3", "png"), nil, http.StatusBadRequest, "bad_input")
	expectError(t, srv, "GET", framePath("one", "png"), nil, http.StatusBadRequest, "bad_input")
	expectError(t, srv, "GET", framePath("1", "jpg"), nil, http.StatusBadRequest, "bad_input")

	if code, _ := call(t, srv, "GET", "/healthz", nil, nil); code != http.StatusOK {
		t.Errorf("GET /healthz = %d", code)
	}
	if code, raw := call(t, srv, "GET", "/metrics", nil, nil); code != http.StatusOK || !strings.Contains(string(raw), "tilefarm_") {
		t.Errorf("GET /metrics = %d, no tilefarm_ metrics", code)
	}
	expectError(t, srv, "POST", "/v1/dlq/x/requeue", nil, http.StatusBadRequest, "bad_input")
	expectError(t, srv, "POST", "/v1/dlq/999/requeue", nil, http.StatusNotFound, "not_found")
}

func TestHTTPBusy(t *testing.T) {
	h := newHarness(t, Config{MaxQueued: 1})
	for i := range 2 {
		if _, err := h.farm.Publish(h.ctx, queue.SubjectRender, fmt.Sprintf("filler-%d", i), []byte("{}"), nil); err != nil {
			t.Fatalf("Publish: %v", err)
		}
	}
	srv := httptest.NewServer(h.c.Handler())
	t.Cleanup(srv.Close)
	expectError(t, srv, "POST", "/v1/jobs", marshal(t, smallRequest(t, 1, 1, 32, 32, 32)), http.StatusServiceUnavailable, "busy")
}

func TestHTTPFrameOutputOfCompletedFrame(t *testing.T) {
	h := newHarness(t, Config{})
	srv := httptest.NewServer(h.c.Handler())
	t.Cleanup(srv.Close)
	jobID, fks := eventJob(t, h, 4, 4)
	for i, tk := range tileKeys(t, h.frame(t, fks[0])) {
		h.apply(t, tileEvent(fmt.Sprintf("c%d", i), farm.EventTileCompleted, h.tile(t, tk)))
	}
	path := fmt.Sprintf("/v1/jobs/%s/frames/4/png", jobID)
	// Assembling is not completed: still not ready.
	expectError(t, srv, "GET", path, nil, http.StatusConflict, "not_ready")

	name, ok := farm.FrameOutputName("png")
	if !ok {
		t.Fatal("no output name for png")
	}
	want := []byte("\x89PNG pretend frame bytes")
	if _, err := finalize.Promote(h.ctx, h.objects, farm.FrameManifestKey(fks[0], "png"), "att-1", "test-build",
		[]finalize.Output{{Name: name, Data: want}}, nil); err != nil {
		t.Fatalf("Promote: %v", err)
	}
	h.apply(t, farm.Event{ID: "done", Type: farm.EventFrameCompleted, FrameKey: fks[0], Formats: []string{"png"}})
	code, body := call(t, srv, "GET", path, nil, nil)
	if code != http.StatusOK || !bytes.Equal(body, want) {
		t.Errorf("GET completed frame = %d %q, want 200 with the promoted bytes", code, body)
	}
}
