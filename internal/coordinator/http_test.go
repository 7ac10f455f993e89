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

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/wire"
)

// call sends a request to the handler and decodes the JSON body into out (if not nil).
func call(t *testing.T, srv *httptest.Server, method, path string, body []byte, out any) (int, []byte, http.Header) {
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
	return resp.StatusCode, raw, resp.Header
}

func expectError(t *testing.T, srv *httptest.Server, method, path string, body []byte, code int, kind api.ErrorKind) api.ErrorBody {
	t.Helper()
	var e api.ErrorBody
	got, raw, _ := call(t, srv, method, path, body, &e)
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

// The API: scenes are uploaded once under their version, jobs name them; client mistakes get
// 4xx with a kind and a message, never a 500.
func TestHTTPSubmitAndErrors(t *testing.T) {
	h := newHarness(t, Config{})
	srv := httptest.NewServer(h.c.Handler())
	t.Cleanup(srv.Close)

	other := shotBundle(t)
	other.Scene = bytes.Replace(other.Scene, []byte(`"spp"`), []byte(` "spp"`), 1) // same scene, other version
	v := other.Version()
	if code, _, _ := call(t, srv, "HEAD", "/v1/scenes/"+v, nil, nil); code != http.StatusNotFound {
		t.Fatalf("HEAD of a scene never uploaded = %d, want 404", code)
	}
	if code, raw, _ := call(t, srv, "PUT", "/v1/scenes/"+v, other.Encode(), nil); code != http.StatusOK {
		t.Fatalf("PUT scene = %d %s", code, raw)
	}
	if code, _, _ := call(t, srv, "HEAD", "/v1/scenes/"+v, nil, nil); code != http.StatusOK {
		t.Fatalf("HEAD of an uploaded scene = %d, want 200", code)
	}
	expectError(t, srv, "PUT", "/v1/scenes/"+strings.Repeat("0", 64), other.Encode(), http.StatusBadRequest, "bad_input")
	expectError(t, srv, "PUT", "/v1/scenes/"+v, []byte("garbage"), http.StatusBadRequest, "bad_input")
	lacking := memBundle(t, other, map[string][]byte{"torus.obj": []byte("v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 3\n")})
	if e := expectError(t, srv, "PUT", "/v1/scenes/"+lacking.Version(), lacking.Encode(), http.StatusBadRequest, "bad_input"); !strings.Contains(e.Error, "torus.obj") {
		t.Errorf("a manifest naming a file not uploaded: %q does not name it", e.Error)
	}
	expectError(t, srv, "POST", "/v1/content/missing", []byte(`{"files": [{"sha256": "nothex", "size": 1}]}`), http.StatusBadRequest, "bad_input")
	expectError(t, srv, "POST", "/v1/content/missing", []byte(`{"files": `), http.StatusBadRequest, "bad_input")
	expectError(t, srv, "PUT", "/v1/content/nothex", []byte("x"), http.StatusBadRequest, "bad_input")
	expectError(t, srv, "PUT", "/v1/content/"+strings.Repeat("0", 64), []byte("x"), http.StatusBadRequest, "bad_input")
	if code, _, _ := call(t, srv, "HEAD", "/v1/scenes/nothex", nil, nil); code != http.StatusBadRequest {
		t.Fatalf("HEAD of a malformed version = %d, want 400", code)
	}

	expectError(t, srv, "POST", "/v1/jobs", []byte(`{"scene_version": `), http.StatusBadRequest, "bad_input")
	expectError(t, srv, "POST", "/v1/jobs", []byte(`{"first": "one"}`), http.StatusBadRequest, "bad_input")
	bad := h.request(9, 3, 64, 64, 32)
	if e := expectError(t, srv, "POST", "/v1/jobs", marshal(t, bad), http.StatusBadRequest, "bad_input"); !strings.Contains(e.Error, "reversed") {
		t.Errorf("bad input message %q does not say the range is reversed", e.Error)
	}
	big := append([]byte(`{"project": "`), bytes.Repeat([]byte("x"), 8<<20)...)
	if e := expectError(t, srv, "POST", "/v1/jobs", append(big, `"}`...), http.StatusRequestEntityTooLarge, "bad_input"); !strings.Contains(e.Error, "KiB limit") {
		t.Errorf("an oversized body's error %q does not name the limit", e.Error)
	}
	huge := h.request(1, 1, 64, 64, 32)
	huge.IdempotencyKey = strings.Repeat("k", 1<<20)
	expectError(t, srv, "POST", "/v1/jobs", marshal(t, huge), http.StatusBadRequest, "bad_input")

	req := h.request(1, 2, 64, 64, 32)
	req.SceneVersion = v
	req.IdempotencyKey = "http-key"
	var res api.SubmitResult
	if code, raw, _ := call(t, srv, "POST", "/v1/jobs", marshal(t, req), &res); code != http.StatusCreated || !res.Created || res.Status.JobID == "" {
		t.Fatalf("first POST = %d %s, want 201 with a created job", code, raw)
	}
	var again api.SubmitResult
	if code, raw, _ := call(t, srv, "POST", "/v1/jobs", marshal(t, req), &again); code != http.StatusOK || again.Created || again.Status.JobID != res.Status.JobID {
		t.Fatalf("second POST = %d %s, want 200 with the same job", code, raw)
	}
	req.Last = 3
	expectError(t, srv, "POST", "/v1/jobs", marshal(t, req), http.StatusConflict, "conflict")
	var st api.Status
	if code, raw, _ := call(t, srv, "GET", "/v1/jobs/"+res.Status.JobID, nil, &st); code != 200 || st.JobID != res.Status.JobID || st.State != api.JobQueued {
		t.Fatalf("GET job = %d %s", code, raw)
	}
	expectError(t, srv, "GET", "/v1/jobs/job-nope", nil, http.StatusNotFound, "not_found")
	expectError(t, srv, "GET", fmt.Sprintf("/v1/jobs/%s/frames/1/png", res.Status.JobID), nil, http.StatusConflict, "not_ready")
	expectError(t, srv, "GET", fmt.Sprintf("/v1/jobs/%s/frames/x/png", res.Status.JobID), nil, http.StatusBadRequest, "bad_input")
	expectError(t, srv, "GET", fmt.Sprintf("/v1/jobs/%s/frames/1/gif", res.Status.JobID), nil, http.StatusBadRequest, "bad_input")
	expectError(t, srv, "POST", "/v1/dlq/77/requeue", nil, http.StatusNotFound, "not_found")
	expectError(t, srv, "POST", "/v1/dlq/seven/requeue", nil, http.StatusBadRequest, "bad_input")
}

// A file's upload needs its length up front, a manifest's must be within the limit; too many
// file uploads at once are refused with 429 and Retry-After, and nothing is stored from a
// refused upload. Once the other uploads are done, the same upload is stored.
func TestHTTPSceneUploadLimits(t *testing.T) {
	h := newHarness(t, Config{MaxUploads: 1})
	srv := httptest.NewServer(h.c.Handler())
	t.Cleanup(srv.Close)
	mesh := []byte("v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 3\n")
	ref := contentRef(mesh)
	notStored := func(what string) {
		t.Helper()
		if missing, err := h.c.MissingContent(h.ctx, []api.ContentRef{ref}); err != nil || len(missing) != 1 {
			t.Fatalf("%s was stored: MissingContent = %v, %v", what, missing, err)
		}
	}

	req, _ := http.NewRequest("PUT", srv.URL+"/v1/content/"+ref.SHA256, io.NopCloser(bytes.NewReader(mesh)))
	req.ContentLength = -1 // chunked: no length
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusLengthRequired {
		t.Fatalf("content upload without a length = %d, want 411", resp.StatusCode)
	}
	notStored("an upload without a length")

	b := shotBundle(t)
	b.Scene = append(b.Scene, ' ')
	v := b.Version()
	req, _ = http.NewRequest("PUT", srv.URL+"/v1/scenes/"+v, nil)
	resp, err = sendDeclared(srv, req, h.c.limits.MaxEncoded()+1)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("oversized manifest = %d, want 413", resp.StatusCode)
	}
	if ok, _ := h.c.HasScene(h.ctx, v); ok {
		t.Fatal("an oversized manifest was stored")
	}

	h.c.uploads <- struct{}{} // another upload in progress
	code, raw, hdr := call(t, srv, "PUT", "/v1/content/"+ref.SHA256, mesh, nil)
	<-h.c.uploads
	if code != http.StatusTooManyRequests || hdr.Get("Retry-After") == "" {
		t.Fatalf("upload while the upload limit is reached = %d %s (Retry-After %q), want 429 with Retry-After", code, raw, hdr.Get("Retry-After"))
	}
	notStored("a refused upload")
	if code, raw, _ := call(t, srv, "PUT", "/v1/content/"+ref.SHA256, mesh, nil); code != http.StatusOK {
		t.Fatalf("upload once the others are done = %d %s, want 200", code, raw)
	}
	if missing, err := h.c.MissingContent(h.ctx, []api.ContentRef{ref}); err != nil || len(missing) != 0 {
		t.Fatalf("MissingContent after the upload = %v, %v; want nothing missing", missing, err)
	}
}

// A completed frame's output is served from its manifest.
func TestHTTPFrameOutputOfCompletedFrame(t *testing.T) {
	h := newHarness(t, Config{})
	srv := httptest.NewServer(h.c.Handler())
	t.Cleanup(srv.Close)
	res := h.submit(t, h.request(1, 1, 16, 16, 16))
	fk := h.job(t, res.Status.JobID).FrameKey(1)
	h.completeTiles(t, fk)
	h.promoteFormat(t, fk, "png")
	h.apply(t, wire.Event{ID: "done", Type: wire.EventFrameAssembled, FrameKey: fk, Formats: []string{"png"}})
	code, raw, _ := call(t, srv, "GET", fmt.Sprintf("/v1/jobs/%s/frames/1/png", res.Status.JobID), nil, nil)
	if code != 200 || string(raw) != "frame png" {
		t.Fatalf("GET frame = %d %q", code, raw)
	}
	expectError(t, srv, "GET", fmt.Sprintf("/v1/jobs/%s/frames/1/exr", res.Status.JobID), nil, http.StatusBadRequest, "bad_input")
	expectError(t, srv, "GET", fmt.Sprintf("/v1/jobs/%s/frames/2/png", res.Status.JobID), nil, http.StatusBadRequest, "bad_input")
}

// A body with anything after the submission is refused, not half read.
func TestHTTPSubmitRefusesTrailingData(t *testing.T) {
	h := newHarness(t, Config{})
	srv := httptest.NewServer(h.c.Handler())
	t.Cleanup(srv.Close)
	body := append(marshal(t, h.request(1, 1, 32, 32, 32)), []byte(` {"first": 9}`)...)
	expectError(t, srv, "POST", "/v1/jobs", body, http.StatusBadRequest, "bad_input")
}
