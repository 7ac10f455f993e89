package coordinator

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/png"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/tilefarm/tilefarm/blender/blendscene"
	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/internal/notify"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/internal/scene/jsonscene"
	"github.com/tilefarm/tilefarm/internal/wire"
	"github.com/tilefarm/tilefarm/objstore"
)

// unreachedResponses are documented responses no test can produce without breaking the
// coordinator's database, JetStream or a Prometheus collector, with why. Every other
// documented response of a registered route must be produced by TestOpenAPIResponses.
var unreachedResponses = map[string]string{
	"GET /metrics 500":                           "only a failing metrics collector",
	"POST /v1/jobs 500":                          "only a failing coordinator database",
	"GET /v1/jobs 500":                           "only a failing coordinator database",
	"GET /v1/jobs/{id} 500":                      "only a failing coordinator database",
	"GET /v1/dlq 500":                            "only a failing JetStream",
	"POST /v1/dlq/{seq}/requeue 500":             "only a failing JetStream",
	"GET /v1/workers 500":                        "only a failing JetStream",
	"POST /v1/jobs/{id}/cancel 500":              "only a failing coordinator database or JetStream",
	"PUT /v1/jobs/{id}/priority 500":             "only a failing coordinator database",
	"GET /v1/jobs/{id}/frames/{frame}/tiles 500": "only a failing coordinator database, or an object store failing before the scene is cached",
	"GET /v1/jobs/{id}/frames/{frame}/tiles/{index}/failures 500": "only a failing coordinator database",
	"GET /v1/dlq/{seq} 500": "only a failing JetStream or coordinator database",
}

// testToken is the bearer token the API under test requires.
const testToken = "openapi-test-token"

// loadOpenAPI parses the embedded document and validates it as OpenAPI 3.0.
func loadOpenAPI(t *testing.T) *openapi3.T {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(openAPIDocument)
	if err != nil {
		t.Fatalf("loading openapi.json: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("openapi.json is not a valid OpenAPI document: %v", err)
	}
	if doc.OpenAPI != "3.0.3" {
		t.Fatalf("openapi.json declares OpenAPI %q, want 3.0.3", doc.OpenAPI)
	}
	return doc
}

// operations lists the document's operations as "METHOD /path".
func operations(doc *openapi3.T) map[string]*openapi3.Operation {
	out := map[string]*openapi3.Operation{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			out[method+" "+path] = op
		}
	}
	return out
}

// Every route Handler serves is an operation of the document, and every operation of the
// document is served.
func TestOpenAPIRoutes(t *testing.T) {
	doc := loadOpenAPI(t)
	ops := operations(doc)
	c := New(Config{}, Deps{Metrics: metrics.NewCoordinator(metrics.NewRegistry())})
	served := map[string]bool{}
	for _, rt := range c.routes() {
		key := rt.method + " " + rt.pattern
		if served[key] {
			t.Errorf("route %s is in the table twice", key)
		}
		served[key] = true
		if ops[key] == nil {
			t.Errorf("route %s is served but not in openapi.json", key)
		}
	}
	for key := range ops {
		if !served[key] {
			t.Errorf("openapi.json documents %s, which Handler does not serve", key)
		}
	}
}

// apiCase is one request to the API and the status it must get. Cases run in order, each
// seeing the state the ones before it left.
type apiCase struct {
	name    string
	method  string
	path    string
	body    []byte
	ctype   string // Content-Type of body
	token   string // bearer token sent; testToken unless noToken
	noToken bool
	// length, when > 0, is a Content-Length declared on a raw connection with no body sent;
	// -1 sends the body chunked, with no length.
	length int64
	want   int
	// setup prepares state for the request and returns what undoes it, or nil.
	setup func(t *testing.T) func()
	// check asserts on the response body beyond the document.
	check func(t *testing.T, body []byte)
}

// faultyStore breaks an object store in the ways only a failing or tampered store answers:
// fail gives the error for a Get, Stat or PutStream of a key (nil serves it), and reads of keys
// starting with corrupt come back with a byte appended.
type faultyStore struct {
	objstore.Store
	fail    func(key string) error
	corrupt string
}

func (s faultyStore) Get(ctx context.Context, key string) ([]byte, error) {
	if s.fail != nil {
		if err := s.fail(key); err != nil {
			return nil, err
		}
	}
	b, err := s.Store.Get(ctx, key)
	if err == nil && s.corrupt != "" && strings.HasPrefix(key, s.corrupt) {
		b = append(slices.Clone(b), '!')
	}
	return b, err
}

func (s faultyStore) Stat(ctx context.Context, key string) (objstore.ObjectInfo, error) {
	if s.fail != nil {
		if err := s.fail(key); err != nil {
			return objstore.ObjectInfo{}, err
		}
	}
	return s.Store.Stat(ctx, key)
}

func (s faultyStore) PutStream(ctx context.Context, key string, r io.Reader, size int64) error {
	if s.fail != nil {
		if err := s.fail(key); err != nil {
			return err
		}
	}
	return s.Store.PutStream(ctx, key, r, size)
}

// withObjects makes the coordinator use s for one case.
func withObjects(h *harness, s objstore.Store) func(t *testing.T) func() {
	return func(t *testing.T) func() {
		h.c.objects = s
		return func() { h.c.objects = h.objects }
	}
}

// validator holds the document and checks requests and responses against it.
type validator struct {
	doc    *openapi3.T
	router routers.Router
	// seen records each "METHOD /path STATUS" a case produced.
	seen map[string]bool
}

func newValidator(t *testing.T) *validator {
	t.Helper()
	doc := loadOpenAPI(t)
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatalf("routing openapi.json: %v", err)
	}
	// A scene's manifest (api.ManifestType) is "+json": the library reads it as JSON, and a
	// file's content (api.ContentDataType) as the octet stream it is.
	openapi3filter.RegisterBodyDecoder("image/png", openapi3filter.FileBodyDecoder)
	openapi3filter.RegisterBodyDecoder("video/webm", openapi3filter.FileBodyDecoder)
	openapi3filter.RegisterBodyDecoder("text/event-stream", openapi3filter.PlainBodyDecoder)
	return &validator{doc: doc, router: router, seen: map[string]bool{}}
}

// authenticate accepts a request that carries testToken, as RequireToken does.
func authenticate(ctx context.Context, in *openapi3filter.AuthenticationInput) error {
	if in.SecuritySchemeName != "bearerAuth" {
		return fmt.Errorf("unknown security scheme %q", in.SecuritySchemeName)
	}
	if in.RequestValidationInput.Request.Header.Get("Authorization") != "Bearer "+testToken {
		return errors.New("no bearer token")
	}
	return nil
}

// newRequest builds the request of case tc against base.
func (tc apiCase) newRequest(t *testing.T, base string) *http.Request {
	t.Helper()
	var body io.Reader = http.NoBody
	if tc.body != nil {
		body = bytes.NewReader(tc.body)
	}
	req, err := http.NewRequest(tc.method, base+tc.path, body)
	if err != nil {
		t.Fatalf("%s: %v", tc.name, err)
	}
	if tc.ctype != "" {
		req.Header.Set("Content-Type", tc.ctype)
	}
	token := tc.token
	if token == "" {
		token = testToken
	}
	if !tc.noToken {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return req
}

// send makes the request of tc to srv and returns its response with the body read.
func (tc apiCase) send(t *testing.T, srv *httptest.Server) (*http.Response, []byte) {
	t.Helper()
	req := tc.newRequest(t, srv.URL)
	var resp *http.Response
	var err error
	switch {
	case tc.length > 0:
		resp, err = sendDeclared(srv, req, tc.length)
	case tc.length < 0:
		req.Body = io.NopCloser(bytes.NewReader(tc.body))
		req.ContentLength = -1
		resp, err = srv.Client().Do(req)
	default:
		resp, err = srv.Client().Do(req)
	}
	if err != nil {
		t.Fatalf("%s: %s %s: %v", tc.name, tc.method, tc.path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s: reading the response: %v", tc.name, err)
	}
	return resp, raw
}

// sendDeclared sends req's line and headers with a Content-Length of n and no body, on a
// connection of its own, and reads the answer: a request the server must refuse by its
// declared length, which no http.Client sends.
func sendDeclared(srv *httptest.Server, req *http.Request, n int64) (*http.Response, error) {
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		return nil, fmt.Errorf("dialing the test server: %w", err)
	}
	var head strings.Builder
	fmt.Fprintf(&head, "%s %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n", req.Method, req.URL.RequestURI(), req.URL.Host, n)
	for k, vs := range req.Header {
		for _, v := range vs {
			fmt.Fprintf(&head, "%s: %s\r\n", k, v)
		}
	}
	head.WriteString("\r\n")
	if _, err := io.WriteString(conn, head.String()); err != nil {
		conn.Close()
		return nil, fmt.Errorf("writing the request head: %w", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("reading the response: %w", err)
	}
	body, err := io.ReadAll(resp.Body)
	conn.Close()
	if err != nil {
		return nil, fmt.Errorf("reading the response body: %w", err)
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return resp, nil
}

// run sends every case in order and validates each response against the document: its
// status is documented for its operation, and its headers and body match what is documented
// for that status. A request that succeeds must match the document too, so the document
// never refuses what the server serves.
func (v *validator) run(t *testing.T, srv *httptest.Server, cases []apiCase) {
	t.Helper()
	for _, tc := range cases {
		var undo func()
		if tc.setup != nil {
			undo = tc.setup(t)
		}
		resp, raw := tc.send(t, srv)
		if undo != nil {
			undo()
		}
		if resp.StatusCode != tc.want {
			t.Errorf("%s: %s %s = %d %s, want %d", tc.name, tc.method, tc.path, resp.StatusCode, raw, tc.want)
			continue
		}
		req := tc.newRequest(t, srv.URL)
		route, params, err := v.router.FindRoute(req)
		if err != nil {
			t.Errorf("%s: %s %s is not an operation of openapi.json: %v", tc.name, tc.method, tc.path, err)
			continue
		}
		key := fmt.Sprintf("%s %s %d", tc.method, route.Path, resp.StatusCode)
		v.seen[key] = true
		if route.Operation.Responses.Status(resp.StatusCode) == nil {
			// ValidateResponse skips HEAD altogether; this holds for every method.
			t.Errorf("%s: openapi.json documents no %d for %s %s", tc.name, resp.StatusCode, tc.method, route.Path)
			continue
		}
		opts := &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true, AuthenticationFunc: authenticate}
		in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: opts}
		if resp.StatusCode < 300 {
			if err := openapi3filter.ValidateRequest(context.Background(), in); err != nil {
				t.Errorf("%s: the request succeeded but does not match openapi.json: %v", tc.name, err)
			}
		}
		out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode,
			Header: resp.Header, Body: io.NopCloser(bytes.NewReader(raw)), Options: opts}
		if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
			t.Errorf("%s: %s %s = %d %s does not match openapi.json: %v", tc.name, tc.method, tc.path, resp.StatusCode, raw, err)
		}
		if tc.check != nil {
			tc.check(t, raw)
		}
	}
}

// expectKind asserts that an error body has the kind.
func expectKind(kind api.ErrorKind) func(t *testing.T, body []byte) {
	return func(t *testing.T, body []byte) {
		t.Helper()
		var e api.ErrorBody
		if err := json.Unmarshal(body, &e); err != nil || e.Kind != kind {
			t.Errorf("error body %s: want kind %q", body, kind)
		}
	}
}

// Every endpoint of this branch, driven through the real handler behind the token to each
// status a test can reach, answers as openapi.json says; and every documented response of a
// served route is produced here or named in unreachedResponses.
func TestOpenAPIResponses(t *testing.T) {
	v := newValidator(t)
	h := newHarness(t, Config{MaxPendingTiles: 8, Notify: notify.Config{Secret: testNotifySecret}})
	srv := httptest.NewServer(RequireToken(testToken, h.c.Handler()))
	t.Cleanup(srv.Close)

	other := shotBundle(t)
	other.Scene = bytes.Replace(other.Scene, []byte(`"spp"`), []byte(` "spp"`), 1) // same scene, other version
	ov := other.Version()
	encoded := other.Encode()
	const manifestType, dataType = api.ManifestType, api.ContentDataType
	maxManifest := h.c.limits.MaxEncoded()
	// The harness uploaded the shot's mesh; a scene of another mesh names a file the farm lacks
	// until it is uploaded.
	stored := api.ContentRef{SHA256: other.Files["torus.obj"].SHA256, Size: other.Files["torus.obj"].Size}
	mesh := append(readFile(t, other, "torus.obj"), "# another mesh\n"...)
	meshRef := contentRef(mesh)
	lacking := memBundle(t, other, map[string][]byte{"torus.obj": mesh})
	lv := lacking.Version()
	resized := api.ContentRef{SHA256: stored.SHA256, Size: stored.Size + 1} // stored, but of another size
	// Content uploaded under a hash its bytes do not have: never stored.
	never := bytes.Repeat([]byte("y"), 64)
	neverRef := contentRef(never)
	wrong := bytes.Repeat([]byte("x"), 64)
	askMissing := func(refs ...api.ContentRef) []byte { return marshal(t, api.MissingContentRequest{Files: refs}) }
	expectMissing := func(want ...api.ContentRef) func(t *testing.T, body []byte) {
		return func(t *testing.T, body []byte) {
			t.Helper()
			var res api.MissingContentResult
			if err := json.Unmarshal(body, &res); err != nil || res.Missing == nil || !slices.Equal(res.Missing, want) {
				t.Errorf("missing content = %s, want %v", body, want)
			}
		}
	}
	// nothingStored asserts a refused upload stored nothing under ref's hash, and left what
	// was stored there before (keep) as it was.
	nothingStored := func(ref api.ContentRef, keep []byte) func(t *testing.T, body []byte) {
		return func(t *testing.T, body []byte) {
			t.Helper()
			expectKind(api.ErrBadInput.Kind)(t, body)
			if keep == nil {
				if missing, err := h.c.MissingContent(h.ctx, []api.ContentRef{ref}); err != nil || len(missing) != 1 {
					t.Errorf("MissingContent after a refused upload = %v, %v; want it missing", missing, err)
				}
				if _, err := h.objects.Stat(h.ctx, layout.ContentKey(ref.SHA256)); !errors.Is(err, objstore.ErrNotFound) {
					t.Errorf("Stat of %s after a refused upload = %v, want not found", ref.SHA256, err)
				}
				return
			}
			if got, err := h.objects.Get(h.ctx, layout.ContentKey(ref.SHA256)); err != nil || !bytes.Equal(got, keep) {
				t.Errorf("content %s after a refused upload over it = %q, %v; want what was stored", ref.SHA256, got, err)
			}
		}
	}

	req := h.request(1, 2, 64, 64, 32)
	req.IdempotencyKey = "openapi-job"
	req.Notify, req.NotifyFrames = []string{"https://ops:pw@hooks.example.com/render?token=t"}, true
	job := identity.JobID(req.IdempotencyKey)
	conflicting := req
	conflicting.Last = 3
	reversed := h.request(9, 3, 64, 64, 32)
	another := h.request(3, 4, 64, 64, 32) // a new job of 8 tiles, with frame 2 still to render
	waiting := h.request(7, 7, 64, 64, 64) // one tile, waiting for the job
	waiting.IdempotencyKey, waiting.After = "openapi-waiting", []string{job}
	waitingJob := identity.JobID(waiting.IdempotencyKey)
	afterUnknown := waiting
	afterUnknown.After = []string{"job-000000000000000000000000"}
	frame := func(n int, format string) string { return fmt.Sprintf("/v1/jobs/%s/frames/%d/%s", job, n, format) }
	tilesOf := func(n int) string { return fmt.Sprintf("/v1/jobs/%s/frames/%d/tiles", job, n) }
	movieOf := func(id string) string { return "/v1/jobs/" + id + "/movie" }
	storeDown := errors.New("object store unavailable")

	cases := []apiCase{
		{name: "health without a token", method: "GET", path: "/healthz", noToken: true, want: 200},
		{name: "metrics", method: "GET", path: "/metrics", want: 200,
			check: func(t *testing.T, body []byte) {
				if !bytes.Contains(body, []byte("tilefarm_")) {
					t.Errorf("metrics %q have no tilefarm_ metric", body[:min(len(body), 200)])
				}
			}},
		{name: "document", method: "GET", path: "/v1/openapi.json", want: 200,
			check: func(t *testing.T, body []byte) {
				if !bytes.Equal(body, openAPIDocument) {
					t.Error("GET /v1/openapi.json does not serve the embedded document")
				}
			}},
		{name: "wrong token", method: "GET", path: "/v1/jobs", token: "wrong", want: 401, check: expectKind("unauthorized")},

		{name: "scene not stored", method: "HEAD", path: "/v1/scenes/" + ov, want: 404},
		{name: "scene version not hex", method: "HEAD", path: "/v1/scenes/nothex", want: 400},
		{name: "scene check with the store down", method: "HEAD", path: "/v1/scenes/" + ov, want: 500,
			setup: withObjects(h, faultyStore{Store: h.objects, fail: func(string) error { return storeDown }})},
		// Which files the farm lacks: by hash and size.
		{name: "missing content", method: "POST", path: "/v1/content/missing", body: askMissing(stored, meshRef, resized),
			ctype: "application/json", want: 200, check: expectMissing(meshRef, resized)},
		{name: "missing content of nothing", method: "POST", path: "/v1/content/missing", body: []byte(`{"files": []}`),
			ctype: "application/json", want: 200, check: expectMissing()},
		{name: "missing content, a hash not hex", method: "POST", path: "/v1/content/missing", ctype: "application/json", want: 400,
			body: askMissing(api.ContentRef{SHA256: strings.ToUpper(stored.SHA256), Size: stored.Size}), check: expectKind("bad_input")},
		{name: "missing content, a negative size", method: "POST", path: "/v1/content/missing", ctype: "application/json", want: 400,
			body: askMissing(api.ContentRef{SHA256: stored.SHA256, Size: -1}), check: expectKind("bad_input")},
		{name: "missing content, too many asked", method: "POST", path: "/v1/content/missing", ctype: "application/json", want: 400,
			body: askMissing(slices.Repeat([]api.ContentRef{stored}, api.MaxContentAsked+1)...), check: expectKind("bad_input")},
		{name: "missing content, not JSON", method: "POST", path: "/v1/content/missing", body: []byte(`{"files": [`),
			ctype: "application/json", want: 400, check: expectKind("bad_input")},
		{name: "missing content, an unknown field", method: "POST", path: "/v1/content/missing", body: []byte(`{"hashes": []}`),
			ctype: "application/json", want: 400, check: expectKind("bad_input")},
		{name: "missing content with the store down", method: "POST", path: "/v1/content/missing", body: askMissing(meshRef),
			ctype: "application/json", want: 500, check: expectKind("internal"),
			setup: withObjects(h, faultyStore{Store: h.objects, fail: func(string) error { return storeDown }})},

		// A scene's manifest: stored once, under its version, once its files are.
		{name: "upload", method: "PUT", path: "/v1/scenes/" + ov, body: encoded, ctype: manifestType, want: 200},
		{name: "upload again", method: "PUT", path: "/v1/scenes/" + ov, body: encoded, ctype: manifestType, want: 200},
		{name: "scene stored", method: "HEAD", path: "/v1/scenes/" + ov, want: 200},
		{name: "upload under another version", method: "PUT", path: "/v1/scenes/" + strings.Repeat("0", 64), body: encoded, ctype: manifestType, want: 400, check: expectKind("bad_input")},
		{name: "upload of garbage", method: "PUT", path: "/v1/scenes/" + ov, body: []byte("garbage"), ctype: manifestType, want: 400, check: expectKind("bad_input")},
		{name: "upload too large", method: "PUT", path: "/v1/scenes/" + ov, ctype: manifestType, length: maxManifest + 1, want: 413, check: expectKind("bad_input")},
		{name: "upload naming content not uploaded", method: "PUT", path: "/v1/scenes/" + lv, body: lacking.Encode(), ctype: manifestType, want: 400,
			check: func(t *testing.T, body []byte) {
				expectKind("bad_input")(t, body)
				if !bytes.Contains(body, []byte("torus.obj")) {
					t.Errorf("refused manifest = %s, want the file it lacks named", body)
				}
				if ok, err := h.c.HasScene(h.ctx, lv); ok || err != nil {
					t.Errorf("HasScene of a refused manifest = %v, %v; want it not stored", ok, err)
				}
			}},
		{name: "upload with the store down", method: "PUT", path: "/v1/scenes/" + ov, body: encoded, ctype: manifestType, want: 500,
			setup: withObjects(h, faultyStore{Store: h.objects, fail: func(string) error { return storeDown }}), check: expectKind("internal")},

		// A file's content, by its hash.
		{name: "content upload", method: "PUT", path: "/v1/content/" + meshRef.SHA256, body: mesh, ctype: dataType, want: 200,
			check: func(t *testing.T, body []byte) {
				var ref api.ContentRef
				if err := json.Unmarshal(body, &ref); err != nil || ref != meshRef {
					t.Errorf("content upload = %s, want %+v", body, meshRef)
				}
				if got, err := h.objects.Get(h.ctx, layout.ContentKey(meshRef.SHA256)); err != nil || !bytes.Equal(got, mesh) {
					t.Errorf("stored content = %d bytes, %v; want the upload", len(got), err)
				}
			}},
		{name: "content upload again", method: "PUT", path: "/v1/content/" + meshRef.SHA256, body: mesh, ctype: dataType, want: 200},
		{name: "missing content once uploaded", method: "POST", path: "/v1/content/missing", body: askMissing(stored, meshRef),
			ctype: "application/json", want: 200, check: expectMissing()},
		{name: "upload once its content is, without a length", method: "PUT", path: "/v1/scenes/" + lv, body: lacking.Encode(), ctype: manifestType,
			length: -1, want: 200},
		{name: "content upload of wrong bytes", method: "PUT", path: "/v1/content/" + neverRef.SHA256, body: wrong, ctype: dataType, want: 400,
			check: nothingStored(neverRef, nil)},
		{name: "content upload of one byte more", method: "PUT", path: "/v1/content/" + neverRef.SHA256, body: append(slices.Clone(never), 'y'),
			ctype: dataType, want: 400, check: nothingStored(neverRef, nil)},
		{name: "content upload of one byte less", method: "PUT", path: "/v1/content/" + neverRef.SHA256, body: never[1:],
			ctype: dataType, want: 400, check: nothingStored(neverRef, nil)},
		{name: "content upload of wrong bytes over stored content", method: "PUT", path: "/v1/content/" + meshRef.SHA256,
			body: bytes.Repeat([]byte("#"), len(mesh)), ctype: dataType, want: 400, check: nothingStored(meshRef, mesh)},
		{name: "content upload under a hash not hex", method: "PUT", path: "/v1/content/" + strings.ToUpper(neverRef.SHA256), body: never,
			ctype: dataType, want: 400, check: expectKind("bad_input")},
		{name: "content upload without a length", method: "PUT", path: "/v1/content/" + neverRef.SHA256, body: never, ctype: dataType,
			length: -1, want: 411, check: nothingStored(neverRef, nil)},
		{name: "content upload while others are in progress", method: "PUT", path: "/v1/content/" + neverRef.SHA256, body: never, ctype: dataType, want: 429,
			setup: func(t *testing.T) func() {
				for range cap(h.c.uploads) {
					h.c.uploads <- struct{}{}
				}
				return func() {
					for range cap(h.c.uploads) {
						<-h.c.uploads
					}
				}
			}, check: func(t *testing.T, body []byte) {
				expectKind("busy")(t, body)
				if _, err := h.objects.Stat(h.ctx, layout.ContentKey(neverRef.SHA256)); !errors.Is(err, objstore.ErrNotFound) {
					t.Errorf("Stat after a refused upload = %v, want not found", err)
				}
			}},
		{name: "manifest upload while others are in progress", method: "PUT", path: "/v1/scenes/" + ov, body: encoded, ctype: manifestType, want: 429,
			setup: func(t *testing.T) func() {
				for range cap(h.c.uploads) {
					h.c.uploads <- struct{}{}
				}
				return func() {
					for range cap(h.c.uploads) {
						<-h.c.uploads
					}
				}
			}, check: expectKind("busy")},
		{name: "content upload with the store down", method: "PUT", path: "/v1/content/" + neverRef.SHA256, body: never, ctype: dataType, want: 500,
			setup: withObjects(h, faultyStore{Store: h.objects, fail: func(string) error { return storeDown }}), check: expectKind("internal")},

		{name: "no job yet", method: "GET", path: "/v1/jobs", want: 200,
			check: func(t *testing.T, body []byte) {
				if strings.TrimSpace(string(body)) != "[]" {
					t.Errorf("jobs before any submission = %s, want []", body)
				}
			}},
		{name: "submit", method: "POST", path: "/v1/jobs", body: marshal(t, req), ctype: "application/json", want: 201},
		{name: "submit again", method: "POST", path: "/v1/jobs", body: marshal(t, req), ctype: "application/json", want: 200},
		{name: "same key, other payload", method: "POST", path: "/v1/jobs", body: marshal(t, conflicting), ctype: "application/json", want: 409, check: expectKind("conflict")},
		{name: "reversed range", method: "POST", path: "/v1/jobs", body: marshal(t, reversed), ctype: "application/json", want: 400},
		{name: "not JSON", method: "POST", path: "/v1/jobs", body: []byte(`{"scene_version": `), ctype: "application/json", want: 400},
		{name: "submission too large", method: "POST", path: "/v1/jobs", ctype: "application/json", want: 413,
			body: append(append([]byte(`{"project": "`), bytes.Repeat([]byte("x"), maxRequestBytes)...), `"}`...)},
		{name: "jobs", method: "GET", path: "/v1/jobs", want: 200},
		{name: "job", method: "GET", path: "/v1/jobs/" + job, want: 200},
		{name: "unknown job", method: "GET", path: "/v1/jobs/job-000000000000000000000000", want: 404, check: expectKind("not_found")},

		{name: "frame not completed", method: "GET", path: frame(2, "png"), want: 409, check: expectKind("not_ready")},
		{name: "frame not a number", method: "GET", path: fmt.Sprintf("/v1/jobs/%s/frames/x/png", job), want: 400},
		{name: "frame not asked for as exr", method: "GET", path: frame(1, "exr"), want: 400},
		{name: "frame of an unknown job", method: "GET", path: "/v1/jobs/job-000000000000000000000000/frames/1/png", want: 404},
		{name: "frame output", method: "GET", path: frame(1, "png"), want: 200,
			setup: func(t *testing.T) func() {
				fk := h.job(t, job).FrameKey(1)
				h.completeTiles(t, fk)
				h.promoteFormat(t, fk, "png")
				h.apply(t, wire.Event{ID: "openapi-assembled", Type: wire.EventFrameAssembled, FrameKey: fk, Formats: []string{"png"}})
				return nil
			},
			check: func(t *testing.T, body []byte) {
				if string(body) != "frame png" {
					t.Errorf("frame output = %q, want the promoted bytes", body)
				}
			}},
		{name: "frame output lost", method: "GET", path: frame(1, "png"), want: 404,
			setup: withObjects(h, faultyStore{Store: h.objects, fail: func(key string) error {
				if strings.HasPrefix(key, "manifests/frames/") {
					return fmt.Errorf("reading %s: %w", key, objstore.ErrNotFound)
				}
				return nil
			}})},
		{name: "frame output corrupt", method: "GET", path: frame(1, "png"), want: 500, check: expectKind("corrupt"),
			setup: withObjects(h, faultyStore{Store: h.objects, corrupt: "attempts/"})},

		// A job that waits for the first, whose frame 2 is not done: accepted and waiting.
		{name: "submit after an unknown job", method: "POST", path: "/v1/jobs", body: marshal(t, afterUnknown), ctype: "application/json", want: 400,
			check: expectKind("bad_input")},
		{name: "submit a waiting job", method: "POST", path: "/v1/jobs", body: marshal(t, waiting), ctype: "application/json", want: 201},
		{name: "waiting job", method: "GET", path: "/v1/jobs/" + waitingJob, want: 200,
			check: func(t *testing.T, body []byte) {
				var st api.Status
				if err := json.Unmarshal(body, &st); err != nil || st.State != api.JobWaiting || !slices.Equal(st.After, []string{job}) ||
					!strings.Contains(st.WaitingFor, job) || len(st.Frames) != 1 || st.Frames[0].State != api.FrameWaiting {
					t.Errorf("waiting job = %s, want waiting for %s", body, job)
				}
			}},
		{name: "cancel the waiting job", method: "POST", path: "/v1/jobs/" + waitingJob + "/cancel", want: 200},
		// The preview movie: not ready while the job renders; once the job completes and the
		// movie is promoted, the movie; none for a job submitted without one.
		{name: "movie not ready", method: "GET", path: movieOf(job), want: 404, check: expectKind("movie_not_ready")},
		{name: "movie", method: "GET", path: movieOf(identity.JobID("openapi-movie")), want: 200,
			setup: func(t *testing.T) func() {
				req := h.request(1, 1, 64, 64, 32) // frame 1 is completed: so is the job, as submitted
				req.IdempotencyKey = "openapi-movie"
				id := h.submit(t, req).Status.JobID
				if _, err := finalize.Promote(h.ctx, h.objects, layout.MovieKey(id), "attempt1", identity.BuildFingerprint(),
					[]finalize.Output{{Name: layout.MovieName, Data: []byte("movie")}}, nil); err != nil {
					t.Fatal(err)
				}
				h.apply(t, wire.Event{ID: "openapi-movie", Type: wire.EventMovieReady, JobID: id})
				return nil
			},
			check: func(t *testing.T, body []byte) {
				if string(body) != "movie" {
					t.Errorf("movie = %q, want the promoted bytes", body)
				}
			}},
		{name: "movie corrupt", method: "GET", path: movieOf(identity.JobID("openapi-movie")), want: 500, check: expectKind("corrupt"),
			setup: withObjects(h, faultyStore{Store: h.objects, corrupt: "attempts/"})},
		{name: "movie of a job submitted without one", method: "GET", path: movieOf(identity.JobID("openapi-no-movie")), want: 404, check: expectKind("not_found"),
			setup: func(t *testing.T) func() {
				req := h.request(1, 1, 64, 64, 32)
				req.IdempotencyKey, req.NoMovie = "openapi-no-movie", true
				h.submit(t, req)
				return nil
			}},
		{name: "movie of an unknown job", method: "GET", path: movieOf("job-000000000000000000000000"), want: 404, check: expectKind("not_found")},

		// An output whose renderer named its files (a Blender scene's own): its index and files.
		{name: "frame index", method: "GET", path: fmt.Sprintf("/v1/jobs/%s/frames/6/png/index", identity.JobID("openapi-index")), want: 200,
			setup: func(t *testing.T) func() {
				req := h.request(6, 6, 64, 64, 32)
				req.IdempotencyKey = "openapi-index"
				res := h.submit(t, req)
				fk := h.job(t, res.Status.JobID).FrameKey(6)
				h.completeTiles(t, fk)
				index, _ := json.Marshal(layout.FrameIndex{Name: "//render/shot_0006.png", Files: []string{"render/depth/depth_0006.png"}})
				if _, err := finalize.Promote(h.ctx, h.objects, layout.FrameManifestKey(fk, "png"), "attempt1", identity.BuildFingerprint(),
					[]finalize.Output{{Name: "frame.png", Data: []byte("frame 6")}, {Name: layout.FrameFileName(0), Data: []byte("depth 6")},
						{Name: layout.FrameIndexName, Data: index}}, nil); err != nil {
					t.Fatal(err)
				}
				h.apply(t, wire.Event{ID: "openapi-indexed", Type: wire.EventFrameAssembled, FrameKey: fk, Formats: []string{"png"}})
				return nil
			},
			check: func(t *testing.T, body []byte) {
				var index api.FrameIndex
				if err := json.Unmarshal(body, &index); err != nil || index.Name != "//render/shot_0006.png" || len(index.Files) != 1 {
					t.Errorf("index = %s, want the renderer's names", body)
				}
			}},
		{name: "frame file", method: "GET", path: fmt.Sprintf("/v1/jobs/%s/frames/6/png?file=0", identity.JobID("openapi-index")), want: 200,
			check: func(t *testing.T, body []byte) {
				if string(body) != "depth 6" {
					t.Errorf("file 0 = %q, want the promoted bytes", body)
				}
			}},
		{name: "frame file not a number", method: "GET", path: frame(1, "png") + "?file=x", want: 400},
		{name: "frame file not there", method: "GET", path: frame(1, "png") + "?file=3", want: 404, check: expectKind("not_found")},
		{name: "frame index of a format the farm names", method: "GET", path: frame(1, "png") + "/index", want: 404, check: expectKind("not_found")},
		{name: "frame index not completed", method: "GET", path: frame(2, "png") + "/index", want: 409, check: expectKind("not_ready")},
		{name: "frame index not a number", method: "GET", path: fmt.Sprintf("/v1/jobs/%s/frames/x/png/index", job), want: 400},
		{name: "frame index corrupt", method: "GET", path: fmt.Sprintf("/v1/jobs/%s/frames/6/png/index", identity.JobID("openapi-index")), want: 500,
			check: expectKind("corrupt"), setup: withObjects(h, faultyStore{Store: h.objects, corrupt: "attempts/"})},

		{name: "thumbnail", method: "GET", path: fmt.Sprintf("/v1/jobs/%s/frames/8/thumbnail", identity.JobID("openapi-thumb")), want: 200,
			setup: func(t *testing.T) func() {
				req := h.request(8, 8, 64, 64, 32)
				req.IdempotencyKey = "openapi-thumb"
				res := h.submit(t, req)
				fk := h.job(t, res.Status.JobID).FrameKey(8)
				h.completeTiles(t, fk)
				var frame bytes.Buffer
				if err := png.Encode(&frame, image.NewNRGBA(image.Rect(0, 0, 320, 180))); err != nil {
					t.Fatal(err)
				}
				if _, err := finalize.Promote(h.ctx, h.objects, layout.FrameManifestKey(fk, "png"), "attempt1", identity.BuildFingerprint(),
					[]finalize.Output{{Name: "frame.png", Data: frame.Bytes()}}, nil); err != nil {
					t.Fatal(err)
				}
				h.apply(t, wire.Event{ID: "openapi-thumb", Type: wire.EventFrameAssembled, FrameKey: fk, Formats: []string{"png"}})
				return nil
			},
			check: func(t *testing.T, body []byte) {
				if img, err := png.Decode(bytes.NewReader(body)); err != nil || img.Bounds() != image.Rect(0, 0, 160, 90) {
					t.Errorf("thumbnail of a 320x180 frame: %v, %v; want 160x90", err, img)
				}
			}},
		{name: "thumbnail not finished", method: "GET", path: frame(2, "thumbnail"), want: 409, check: expectKind("not_ready")},
		{name: "thumbnail not a number", method: "GET", path: fmt.Sprintf("/v1/jobs/%s/frames/x/thumbnail", job), want: 400},
		{name: "thumbnail of an unknown job", method: "GET", path: "/v1/jobs/job-000000000000000000000000/frames/1/thumbnail", want: 404},
		{name: "thumbnail of a PNG that does not decode", method: "GET", path: frame(1, "thumbnail"), want: 500, check: expectKind("corrupt")},
		{name: "tiles", method: "GET", path: tilesOf(1), want: 200,
			check: func(t *testing.T, body []byte) {
				var ft api.FrameTiles
				if err := json.Unmarshal(body, &ft); err != nil || len(ft.Tiles) != 4 || ft.Width != 64 || !ft.TilePNG ||
					ft.Tiles[3].Rect != (api.TileRect{X0: 32, Y0: 32, X1: 64, Y1: 64}) || ft.Tiles[3].State != "completed" || ft.Tiles[3].RenderMillis != 400 {
					t.Errorf("tiles of frame 1 = %s, want 4 completed tiles of 32 px, the last rendered in 400 ms", body)
				}
			}},
		{name: "tiles of a frame not rendered", method: "GET", path: tilesOf(2), want: 200,
			check: func(t *testing.T, body []byte) {
				if bytes.Contains(body, []byte(`"completed"`)) {
					t.Errorf("tiles of frame 2 = %s, want none completed", body)
				}
			}},
		{name: "tiles of a frame not a number", method: "GET", path: fmt.Sprintf("/v1/jobs/%s/frames/x/tiles", job), want: 400},
		{name: "tiles of a frame not in the job", method: "GET", path: tilesOf(7), want: 400},
		{name: "tiles of an unknown job", method: "GET", path: "/v1/jobs/job-000000000000000000000000/frames/1/tiles", want: 404},
		{name: "tile failures", method: "GET", path: tilesOf(2) + "/0/failures", want: 200,
			setup: func(t *testing.T) func() {
				f := h.frame(t, h.job(t, job).FrameKey(2))
				ev := tileEvent(t, f, 0, wire.EventTileFailed, 1, 1)
				ev.Code, ev.Error, ev.Log = "retryable", "rendering: boom", []string{"renderer: boom", `msg="retrying later" class=retryable`}
				h.apply(t, ev)
				return nil
			},
			check: func(t *testing.T, body []byte) {
				var tf api.TileFailures
				if err := json.Unmarshal(body, &tf); err != nil || len(tf.Failures) != 1 || tf.Failures[0].Class != "retryable" ||
					len(tf.Failures[0].Log) != 2 || tf.State != "failed_retryable" {
					t.Errorf("failures of tile 0 of frame 2 = %s, want the one failed attempt with its log", body)
				}
			}},
		{name: "tile failures not a number", method: "GET", path: tilesOf(2) + "/x/failures", want: 400},
		{name: "tile failures out of the frame", method: "GET", path: tilesOf(2) + "/4/failures", want: 400, check: expectKind("bad_input")},
		{name: "tile failures of a frame not a number", method: "GET", path: fmt.Sprintf("/v1/jobs/%s/frames/x/tiles/0/failures", job), want: 400},
		{name: "tile failures of an unknown job", method: "GET", path: "/v1/jobs/job-000000000000000000000000/frames/1/tiles/0/failures", want: 404},
		{name: "tile PNG", method: "GET", path: tilesOf(1) + "/0/png", want: 200,
			setup: func(t *testing.T) func() {
				f := h.frame(t, h.job(t, job).FrameKey(1))
				h.promoteTile(t, f, 0)
				return nil
			},
			check: func(t *testing.T, body []byte) {
				img, err := png.Decode(bytes.NewReader(body))
				if err != nil || img.Bounds() != image.Rect(0, 0, 32, 32) {
					t.Errorf("tile PNG: %v, bounds %v, want a 32x32 PNG", err, img)
					return
				}
				if r, g, b, a := img.At(5, 5).RGBA(); r != 0 || g != 0 || b != 0 || a != 0xffff {
					t.Errorf("pixel of a black tile = %d,%d,%d,%d, want opaque black", r, g, b, a)
				}
			}},
		{name: "tile PNG not completed", method: "GET", path: tilesOf(2) + "/0/png", want: 409, check: expectKind("not_ready")},
		{name: "tile PNG of a Blender scene", method: "GET", path: tilesOf(1) + "/0/png", want: 409, check: expectKind("conflict"),
			setup: func(t *testing.T) func() {
				info, err := h.c.scene(h.ctx, h.version)
				if err != nil {
					t.Fatal(err)
				}
				blend := *info
				blend.kind = blendscene.New(blendscene.Options{}, scene.Env{Dir: t.TempDir()})
				h.c.scenes.Put(h.version, &blend)
				return func() { h.c.scenes.Put(h.version, info) }
			}},
		{name: "tile PNG not a number", method: "GET", path: tilesOf(1) + "/x/png", want: 400},
		{name: "tile PNG out of the frame", method: "GET", path: tilesOf(1) + "/4/png", want: 400},
		{name: "tile PNG of an unknown job", method: "GET", path: "/v1/jobs/job-000000000000000000000000/frames/1/tiles/0/png", want: 404},
		{name: "tile PNG without its manifest", method: "GET", path: tilesOf(1) + "/1/png", want: 404, check: expectKind("not_found"),
			setup: func(t *testing.T) func() { // recorded completed, its manifest gone from the store
				f := h.frame(t, h.job(t, job).FrameKey(1))
				key := finalize.ManifestKey(layout.TileManifestKey(f.Key, frameTiles(t, f)[1].Key))
				data, err := h.objects.Get(h.ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				if err := h.objects.Delete(h.ctx, key); err != nil {
					t.Fatal(err)
				}
				return func() { _ = h.objects.Put(h.ctx, key, data) }
			}},
		{name: "tile PNG corrupt", method: "GET", path: tilesOf(1) + "/0/png", want: 500, check: expectKind("corrupt"),
			setup: withObjects(h, faultyStore{Store: h.objects, corrupt: "attempts/"})},
		{name: "events", method: "GET", path: "/v1/events", want: 200,
			setup: func(t *testing.T) func() {
				h.c.streamMax = 1500 * time.Millisecond
				return func() { h.c.streamMax = defaultStreamMax }
			},
			check: func(t *testing.T, body []byte) {
				if !bytes.Contains(body, []byte("event: jobs\ndata: [{")) || !bytes.Contains(body, []byte(`"job_id":"`+job+`"`)) ||
					!bytes.Contains(body, []byte("event: frame\ndata: [{")) || bytes.Count(body, []byte("event: jobs")) != 1 {
					t.Errorf("events = %s, want every job once, then nothing more", body)
				}
			}},

		{name: "empty DLQ", method: "GET", path: "/v1/dlq", want: 200,
			check: func(t *testing.T, body []byte) {
				if strings.TrimSpace(string(body)) != "[]" {
					t.Errorf("empty DLQ = %s, want []", body)
				}
			}},
		{name: "dead letter", method: "GET", path: "/v1/dlq", want: 200,
			setup: func(t *testing.T) func() {
				h.relay(t)
				m, err := h.workerSources(t).FetchTile(h.ctx, 5*time.Second)
				if err != nil || m == nil {
					t.Fatalf("fetching a tile to dead-letter: %v (message %v)", err, m)
				}
				if err := h.queue.DeadLetterNow(h.ctx, m, "openapi test"); err != nil {
					t.Fatalf("DeadLetterNow: %v", err)
				}
				return nil
			},
			check: func(t *testing.T, body []byte) {
				var dls []struct {
					DLQSeq uint64 `json:"dlq_seq"`
					Reason string `json:"reason"`
				}
				if err := json.Unmarshal(body, &dls); err != nil || len(dls) != 1 || dls[0].DLQSeq != 1 || dls[0].Reason != "openapi test" {
					t.Errorf("DLQ = %s, want the one dead letter at sequence 1", body)
				}
			}},
		{name: "dead letter detail", method: "GET", path: "/v1/dlq/1", want: 200,
			check: func(t *testing.T, body []byte) {
				var dl api.DeadLetterDetail
				if err := json.Unmarshal(body, &dl); err != nil || dl.Kind != "tile" || dl.TileIndex == nil || dl.Reason != "openapi test" ||
					dl.JobID == "" || dl.Failures == nil {
					t.Errorf("dead letter 1 = %s, want the tile's dead letter with its job, tile and attempts", body)
				}
			}},
		{name: "dead letter 0", method: "GET", path: "/v1/dlq/0", want: 400, check: expectKind("bad_input")},
		{name: "dead letter not a number", method: "GET", path: "/v1/dlq/seven", want: 400},
		{name: "dead letter not there", method: "GET", path: "/v1/dlq/99", want: 404, check: expectKind("not_found")},
		{name: "requeue", method: "POST", path: "/v1/dlq/1/requeue", want: 200,
			check: func(t *testing.T, body []byte) {
				if !bytes.Contains(body, []byte(`"requeued": 1`)) {
					t.Errorf("requeue = %s, want sequence 1 requeued", body)
				}
			}},
		{name: "requeue again", method: "POST", path: "/v1/dlq/1/requeue", want: 404, check: expectKind("not_found")},
		{name: "requeue sequence 0", method: "POST", path: "/v1/dlq/0/requeue", want: 400, check: expectKind("bad_input")},
		{name: "requeue not a number", method: "POST", path: "/v1/dlq/seven/requeue", want: 400},
		{name: "submit to a full queue", method: "POST", path: "/v1/jobs", body: marshal(t, another), ctype: "application/json", want: 429,
			check: expectKind("busy")},
		{name: "submit again to a full queue", method: "POST", path: "/v1/jobs", body: marshal(t, req), ctype: "application/json", want: 200},
		{name: "workers", method: "GET", path: "/v1/workers", want: 200,
			setup: func(t *testing.T) func() {
				own := jsonscene.Build()
				if err := h.queue.Workers.Beat(h.ctx, api.Worker{Name: "w1", Host: "h", Slots: 2, LastSeen: time.Now().UTC(), Builds: []string{own}, Tags: []string{"gpu"},
					Tiles: []api.WorkerTile{{JobID: job, Frame: 2, TileKey: strings.Repeat("a", 64), SamplesDone: 1, SamplesTotal: 8}}, Blocklisted: []string{}}); err != nil {
					t.Fatal(err)
				}
				return nil
			},
			check: func(t *testing.T, body []byte) {
				if !bytes.Contains(body, []byte(`"name": "w1"`)) {
					t.Errorf("workers = %s, want the worker that beat", body)
				}
			}},
		{name: "workers in detail", method: "GET", path: "/v1/workers?detail=1", want: 200,
			check: func(t *testing.T, body []byte) {
				var ws api.WorkersResponse
				if err := json.Unmarshal(body, &ws); err != nil || len(ws.Workers) != 1 || len(ws.Workers[0].RecentFailures) != 1 ||
					ws.Workers[0].RecentFailures[0].Error != "rendering: boom" {
					t.Errorf("workers in detail = %s, want w1 with the failure recorded of it", body)
				}
			}},
		{name: "workers in detail, asked wrongly", method: "GET", path: "/v1/workers?detail=yes", want: 400, check: expectKind("bad_input")},
		{name: "reprioritize", method: "PUT", path: "/v1/jobs/" + job + "/priority", body: []byte(`{"priority": 7}`), ctype: "application/json", want: 200,
			check: func(t *testing.T, body []byte) {
				if !bytes.Contains(body, []byte(`"priority": 7`)) {
					t.Errorf("reprioritized job = %s, want priority 7", body)
				}
			}},
		{name: "reprioritize out of range", method: "PUT", path: "/v1/jobs/" + job + "/priority", body: []byte(`{"priority": 700}`), ctype: "application/json", want: 400},
		{name: "reprioritize without a priority", method: "PUT", path: "/v1/jobs/" + job + "/priority", body: []byte(`{}`), ctype: "application/json", want: 400},
		{name: "reprioritize an unknown job", method: "PUT", path: "/v1/jobs/job-000000000000000000000000/priority", body: []byte(`{"priority": 1}`), ctype: "application/json", want: 404},
		{name: "cancel", method: "POST", path: "/v1/jobs/" + identity.JobID("openapi-cancel") + "/cancel", want: 200,
			setup: func(t *testing.T) func() {
				c := h.request(5, 5, 64, 64, 32)
				c.IdempotencyKey = "openapi-cancel"
				if _, err := h.c.Submit(h.ctx, c); err != nil {
					t.Fatal(err)
				}
				return nil
			},
			check: func(t *testing.T, body []byte) {
				if !bytes.Contains(body, []byte(`"state": "cancelled"`)) {
					t.Errorf("cancelled job = %s", body)
				}
			}},
		{name: "cancel an unknown job", method: "POST", path: "/v1/jobs/job-000000000000000000000000/cancel", want: 404},
		{name: "cancel a finished job", method: "POST", path: "/v1/jobs/" + identity.JobID("openapi-done") + "/cancel", want: 409, check: expectKind("conflict"),
			setup: func(t *testing.T) func() {
				done := h.request(1, 1, 64, 64, 32) // frame 1 is completed already
				done.IdempotencyKey = "openapi-done"
				if _, err := h.c.Submit(h.ctx, done); err != nil {
					t.Fatal(err)
				}
				return nil
			}},
	}
	// Every route but the public ones refuses a request without the token.
	ops := operations(v.doc)
	for _, rt := range h.c.routes() {
		path := strings.NewReplacer("{version}", h.version, "{sha256}", stored.SHA256, "{id}", job, "{frame}", "1", "{format}", "png", "{seq}", "1", "{index}", "0").Replace(rt.pattern)
		want := http.StatusUnauthorized
		if op := ops[rt.method+" "+rt.pattern]; op != nil && op.Security != nil && len(*op.Security) == 0 {
			want = http.StatusOK
		}
		cases = append(cases, apiCase{name: "without a token", method: rt.method, path: path, noToken: true, want: want})
	}
	v.run(t, srv, cases)

	// A busy answer says when to retry, in seconds.
	resp, _ := apiCase{method: "POST", path: "/v1/jobs", body: marshal(t, another), ctype: "application/json"}.send(t, srv)
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); resp.StatusCode != 429 || err != nil || s <= 0 {
		t.Errorf("busy submission = %d with Retry-After %q, want 429 with seconds", resp.StatusCode, resp.Header.Get("Retry-After"))
	}

	var missing, stale []string
	for key, op := range ops {
		for code := range op.Responses.Map() {
			k := key + " " + code
			if !v.seen[k] && unreachedResponses[k] == "" {
				missing = append(missing, k)
			}
		}
	}
	for k := range unreachedResponses {
		method, rest, _ := strings.Cut(k, " ")
		path, code, _ := strings.Cut(rest, " ")
		op := ops[method+" "+path]
		if v.seen[k] || op == nil || op.Responses.Value(code) == nil {
			stale = append(stale, k)
		}
	}
	sort.Strings(missing)
	sort.Strings(stale)
	if len(missing) > 0 {
		t.Errorf("documented responses no case produced (add a case, or name them in unreachedResponses with why): %v", missing)
	}
	if len(stale) > 0 {
		t.Errorf("unreachedResponses entries that a case produces or that openapi.json does not document: %v", stale)
	}
}
