package coordinator

import (
	"bytes"
	"crypto/subtle"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"syscall"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/objstore"
)

// Handler is the HTTP API the CLI talks to, plus /metrics and /healthz. Its routes are the
// table routes returns, so the test that holds the OpenAPI document against the code reads the
// same table the mux is built from.
func (c *Coordinator) Handler() http.Handler {
	mux := http.NewServeMux()
	for _, rt := range c.routes() {
		mux.Handle(rt.method+" "+rt.pattern, rt.handler)
	}
	return mux
}

// route is one endpoint of the API: its method, its ServeMux pattern (whose {name} wildcards
// are written as OpenAPI writes path parameters) and what serves it.
type route struct {
	method  string
	pattern string
	handler http.Handler
}

// routes is every endpoint Handler serves, in one table, so nothing can be served without
// being in the table the OpenAPI test checks.
func (c *Coordinator) routes() []route {
	return []route{
		{http.MethodGet, "/metrics", c.m.Handler()},
		{http.MethodGet, "/healthz", http.HandlerFunc(handleHealthz)},
		{http.MethodGet, "/v1/openapi.json", http.HandlerFunc(handleOpenAPI)},
		{http.MethodHead, "/v1/scenes/{version}", http.HandlerFunc(c.handleHasScene)},
		{http.MethodPut, "/v1/scenes/{version}", http.HandlerFunc(c.handlePutScene)},
		{http.MethodPost, "/v1/content/missing", http.HandlerFunc(c.handleMissingContent)},
		{http.MethodPut, "/v1/content/{sha256}", http.HandlerFunc(c.handlePutContent)},
		{http.MethodPost, "/v1/jobs", c.leaderOnly(http.HandlerFunc(c.handleSubmit))},
		{http.MethodGet, "/v1/jobs", http.HandlerFunc(c.handleJobs)},
		{http.MethodGet, "/v1/jobs/{id}", http.HandlerFunc(c.handleStatus)},
		{http.MethodGet, "/v1/jobs/{id}/frames/{frame}/{format}", http.HandlerFunc(c.handleFrameOutput)},
		{http.MethodGet, "/v1/jobs/{id}/frames/{frame}/{format}/index", http.HandlerFunc(c.handleFrameIndex)},
		{http.MethodGet, "/v1/jobs/{id}/frames/{frame}/thumbnail", http.HandlerFunc(c.handleThumbnail)},
		{http.MethodGet, "/v1/jobs/{id}/frames/{frame}/tiles", http.HandlerFunc(c.handleFrameTiles)},
		{http.MethodGet, "/v1/jobs/{id}/frames/{frame}/tiles/{index}/png", http.HandlerFunc(c.handleTilePNG)},
		{http.MethodGet, "/v1/jobs/{id}/movie", http.HandlerFunc(c.handleMovie)},
		{http.MethodGet, "/v1/jobs/{id}/frames/{frame}/tiles/{index}/failures", http.HandlerFunc(c.handleTileFailures)},
		{http.MethodPost, "/v1/jobs/{id}/cancel", c.leaderOnly(http.HandlerFunc(c.handleCancel))},
		{http.MethodPut, "/v1/jobs/{id}/priority", c.leaderOnly(http.HandlerFunc(c.handleReprioritize))},
		{http.MethodGet, "/v1/workers", http.HandlerFunc(c.handleWorkers)},
		{http.MethodGet, "/v1/dlq", http.HandlerFunc(c.handleDeadLetters)},
		{http.MethodGet, "/v1/dlq/{seq}", http.HandlerFunc(c.handleDeadLetter)},
		{http.MethodPost, "/v1/dlq/{seq}/requeue", c.leaderOnly(http.HandlerFunc(c.handleRequeue))},
		{http.MethodGet, "/v1/events", http.HandlerFunc(c.handleEvents)},
	}
}

// leaderOnly serves h on the farm's leader alone: on another coordinator a write waits for an
// election in progress (awaitLeading) or is answered 503 with the leader's address and a
// Retry-After, which the command line and the add-on follow to their next address. Reads,
// scene uploads (content-addressed, to the shared store) and the monitor are served by every
// coordinator, reads from its own copy of the records (docs/design.md, "Replication").
func (c *Coordinator) leaderOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := c.awaitLeading(r.Context()); err != nil {
			writeError(w, err)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func handleHealthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// openAPIDocument is the API described in OpenAPI 3.0, served as written so a client can
// generate from, or check against, the coordinator it talks to. openapi_test.go holds it
// against the route table and against real responses.
//
//go:embed openapi.json
var openAPIDocument []byte

// handleOpenAPI serves openAPIDocument. It is behind the token like every endpoint but
// /healthz: RequireToken exempts only the liveness probe, and the document is of use only to a
// client that may call the API.
func handleOpenAPI(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(openAPIDocument)))
	_, _ = w.Write(openAPIDocument)
}

// handleHasScene answers whether a scene is stored, with a status and no body, so a client
// uploads each scene once.
func (c *Coordinator) handleHasScene(w http.ResponseWriter, r *http.Request) {
	ok, err := c.HasScene(r.Context(), r.PathValue("version"))
	switch {
	case err != nil:
		writeError(w, err)
	case ok:
		w.WriteHeader(http.StatusOK)
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

// handleSubmit decodes one submission of at most maxRequestBytes and answers 201 for a new
// job, 200 for the job an earlier identical submission created.
func (c *Coordinator) handleSubmit(w http.ResponseWriter, r *http.Request) {
	var req api.SubmitRequest
	body := http.MaxBytesReader(w, r.Body, maxRequestBytes)
	dec := json.NewDecoder(body)
	err := dec.Decode(&req)
	if err == nil && dec.More() {
		err = errors.New("more than one JSON value in the body")
	}
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeJSON(w, http.StatusRequestEntityTooLarge, api.ErrorBody{
				Error: fmt.Sprintf("submission exceeds the %d KiB limit of a request body (scenes are uploaded with PUT /v1/scenes)", maxRequestBytes>>10),
				Kind:  api.ErrBadInput.Kind})
			return
		}
		writeError(w, badInput("decoding submission: %v", err))
		return
	}
	res, err := c.Submit(r.Context(), req)
	if err != nil {
		writeError(w, err)
		return
	}
	code := http.StatusOK
	if res.Created {
		code = http.StatusCreated
	}
	writeJSON(w, code, res)
}

func (c *Coordinator) handleJobs(w http.ResponseWriter, r *http.Request) {
	jobs, err := c.Jobs(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	if jobs == nil {
		jobs = []api.Status{}
	}
	writeJSON(w, http.StatusOK, jobs)
}

func (c *Coordinator) handleStatus(w http.ResponseWriter, r *http.Request) {
	st, err := c.Status(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// handleFrameOutput serves one encoded output of a frame, verified through its manifest: its
// main file, or with ?file=N the output's file N (FrameIndex).
func (c *Coordinator) handleFrameOutput(w http.ResponseWriter, r *http.Request) {
	frame, err := pathNumber(r, "frame", "frame")
	if err != nil {
		writeError(w, err)
		return
	}
	var data []byte
	if q := r.URL.Query(); q.Has("file") {
		i, perr := strconv.Atoi(q.Get("file"))
		if perr != nil || i < 0 {
			writeError(w, badInput("file %q is not a file number", q.Get("file")))
			return
		}
		data, err = c.FrameFile(r.Context(), r.PathValue("id"), frame, r.PathValue("format"), i)
	} else {
		data, err = c.FrameOutput(r.Context(), r.PathValue("id"), frame, r.PathValue("format"))
	}
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	_, _ = w.Write(data)
}

// handleFrameIndex names the files of one output of a frame (FrameIndex).
func (c *Coordinator) handleFrameIndex(w http.ResponseWriter, r *http.Request) {
	frame, err := pathNumber(r, "frame", "frame")
	if err != nil {
		writeError(w, err)
		return
	}
	index, err := c.FrameIndex(r.Context(), r.PathValue("id"), frame, r.PathValue("format"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, index)
}

// handleThumbnail serves a finished frame's PNG scaled down (Thumbnail).
func (c *Coordinator) handleThumbnail(w http.ResponseWriter, r *http.Request) {
	frame, err := pathNumber(r, "frame", "frame")
	if err != nil {
		writeError(w, err)
		return
	}
	data, err := c.Thumbnail(r.Context(), r.PathValue("id"), frame)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "image/png")
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	// A finished frame's PNG never changes: its manifest is final.
	w.Header().Set("Cache-Control", "private, max-age=3600, immutable")
	_, _ = w.Write(data)
}

// handleFrameTiles lists a frame's tiles: where each lies and where it stands.
func (c *Coordinator) handleFrameTiles(w http.ResponseWriter, r *http.Request) {
	frame, err := pathNumber(r, "frame", "frame")
	if err != nil {
		writeError(w, err)
		return
	}
	ft, err := c.FrameTiles(r.Context(), r.PathValue("id"), frame)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, ft)
}

// pathNumber reads the route's path value name as a number; one that is not is bad input,
// named what.
func pathNumber(r *http.Request, name, what string) (int, error) {
	n, err := strconv.Atoi(r.PathValue(name))
	if err != nil {
		return 0, badInput("%s %q is not a number", what, r.PathValue(name))
	}
	return n, nil
}

// frameAndTile reads the frame and tile index of a tile route; either not a number is bad input.
func frameAndTile(r *http.Request) (frame, index int, err error) {
	if frame, err = pathNumber(r, "frame", "frame"); err != nil {
		return 0, 0, err
	}
	if index, err = pathNumber(r, "index", "tile"); err != nil {
		return 0, 0, err
	}
	return frame, index, nil
}

// handleTilePNG serves one completed tile as the 8-bit PNG the frame's PNG holds of it.
func (c *Coordinator) handleTilePNG(w http.ResponseWriter, r *http.Request) {
	frame, index, err := frameAndTile(r)
	if err != nil {
		writeError(w, err)
		return
	}
	data, err := c.TilePNG(r.Context(), r.PathValue("id"), frame, index)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "image/png")
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	// A completed tile never changes: its manifest is final.
	w.Header().Set("Cache-Control", "private, max-age=3600, immutable")
	_, _ = w.Write(data)
}

// handleMovie serves a job's preview movie once it is ready (movie.go), with range requests,
// so a video element can seek in it.
func (c *Coordinator) handleMovie(w http.ResponseWriter, r *http.Request) {
	data, err := c.Movie(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", layout.MovieContentType)
	http.ServeContent(w, r, layout.MovieName, time.Time{}, bytes.NewReader(data))
}

// handleTileFailures serves a tile's recorded failed attempts with their logs.
func (c *Coordinator) handleTileFailures(w http.ResponseWriter, r *http.Request) {
	frame, index, err := frameAndTile(r)
	if err != nil {
		writeError(w, err)
		return
	}
	tf, err := c.TileFailures(r.Context(), r.PathValue("id"), frame, index)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, tf)
}

func (c *Coordinator) handleCancel(w http.ResponseWriter, r *http.Request) {
	st, err := c.Cancel(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func (c *Coordinator) handleReprioritize(w http.ResponseWriter, r *http.Request) {
	var req api.PriorityRequest
	if err := decodeBody(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Priority == nil {
		writeError(w, badInput("missing \"priority\""))
		return
	}
	st, err := c.Reprioritize(r.Context(), r.PathValue("id"), *req.Priority)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// handleWorkers lists the live workers; with ?detail=1, each with its busy slots over the last
// minutes and its recent failures (WorkersDetail), for the monitor's workers page.
func (c *Coordinator) handleWorkers(w http.ResponseWriter, r *http.Request) {
	list := c.Workers
	switch d := r.URL.Query().Get("detail"); d {
	case "1", "true":
		list = c.WorkersDetail
	case "", "0", "false":
	default:
		writeError(w, badInput("detail %q: want 1 or 0", d))
		return
	}
	ws, err := list(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	if ws == nil {
		ws = []api.Worker{}
	}
	leader, err := c.Leader(r.Context())
	if err != nil { // the workers are still worth answering: the lease is read again next time
		c.log.Debug("reading the farm's leadership lease", "err", err)
	}
	writeJSON(w, http.StatusOK, api.WorkersResponse{Workers: ws, Leader: leader})
}

func (c *Coordinator) handleDeadLetters(w http.ResponseWriter, r *http.Request) {
	dls, err := c.queue.ListDeadLetters(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	if dls == nil {
		dls = []api.DeadLetter{}
	}
	writeJSON(w, http.StatusOK, dls)
}

// handleDeadLetter serves one dead letter with its work's failed attempts.
func (c *Coordinator) handleDeadLetter(w http.ResponseWriter, r *http.Request) {
	seq, err := strconv.ParseUint(r.PathValue("seq"), 10, 64)
	if err != nil || seq == 0 {
		writeError(w, badInput("dead letter %q is not a sequence number (they start at 1)", r.PathValue("seq")))
		return
	}
	dl, err := c.DeadLetter(r.Context(), seq)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, dl)
}

func (c *Coordinator) handleRequeue(w http.ResponseWriter, r *http.Request) {
	seq, err := strconv.ParseUint(r.PathValue("seq"), 10, 64)
	if err != nil || seq == 0 {
		writeError(w, badInput("dead letter %q is not a sequence number (they start at 1)", r.PathValue("seq")))
		return
	}
	if err := c.RequeueDeadLetter(r.Context(), seq); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"requeued": seq})
}

// RequireToken makes every request but /healthz present token as a bearer token
// (Authorization: Bearer TOKEN); an empty token requires nothing. A missing or wrong token is
// 401, compared in constant time, and never echoed.
func RequireToken(token string, h http.Handler) http.Handler {
	if token == "" {
		return h
	}
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" && subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tilefarm"`)
			writeJSON(w, http.StatusUnauthorized, api.ErrorBody{Error: "missing or wrong API token (set TILEFARM_API_TOKEN)", Kind: api.ErrUnauthorized.Kind})
			return
		}
		h.ServeHTTP(w, r)
	})
}

// maxRequestBytes bounds a JSON request body; scene manifests and files have their own limits.
const maxRequestBytes = 4 << 20

// handlePutScene stores a scene's manifest, once its files are uploaded (handlePutContent).
// A manifest is small beside its files (about 200 bytes a file); its size is bounded by the
// scene limits (Config.SceneLimits).
func (c *Coordinator) handlePutScene(w http.ResponseWriter, r *http.Request) {
	max := c.limits.MaxEncoded()
	tooBig := func(n int64) {
		writeJSON(w, http.StatusRequestEntityTooLarge, api.ErrorBody{
			Error: fmt.Sprintf("a scene manifest of %d bytes or more exceeds the %d this farm takes (coordinator serve --max-scene-files)", n, max), Kind: api.ErrBadInput.Kind})
	}
	if r.ContentLength > max {
		tooBig(r.ContentLength)
		return
	}
	// A manifest is read whole: it shares the uploads' tokens, so they bound its memory too.
	select {
	case c.uploads <- struct{}{}:
		defer func() { <-c.uploads }()
	default:
		writeError(w, &api.BusyError{Message: fmt.Sprintf("%d scene uploads in progress; retry in a second", cap(c.uploads)), RetryAfter: time.Second})
		return
	}
	buf, err := io.ReadAll(http.MaxBytesReader(w, r.Body, max))
	var over *http.MaxBytesError
	if errors.As(err, &over) {
		tooBig(over.Limit + 1)
		return
	}
	if err != nil {
		writeError(w, badInput("reading the scene manifest: %v", err))
		return
	}
	if err := c.PutScene(r.Context(), r.PathValue("version"), buf); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"scene_version": r.PathValue("version")})
}

// handleMissingContent answers which of the files asked about the farm lacks.
func (c *Coordinator) handleMissingContent(w http.ResponseWriter, r *http.Request) {
	var req api.MissingContentRequest
	if err := decodeBody(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	missing, err := c.MissingContent(r.Context(), req.Files)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, api.MissingContentResult{Missing: append([]api.ContentRef{}, missing...)})
}

// handlePutContent stores one file of a scene under its hash, streamed from the request body
// to the store (Coordinator.PutContent), which must declare its length. At most MaxUploads are
// handled at once; more are told to come back (429 with Retry-After, which the client waits
// out), so uploads cost a bounded amount of memory however many artists submit.
func (c *Coordinator) handlePutContent(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength < 0 {
		writeJSON(w, http.StatusLengthRequired, api.ErrorBody{Error: "a content upload needs a Content-Length", Kind: api.ErrBadInput.Kind})
		return
	}
	select {
	case c.uploads <- struct{}{}:
		defer func() { <-c.uploads }()
	default:
		writeError(w, &api.BusyError{Message: fmt.Sprintf("%d scene file uploads in progress; retry in a second", cap(c.uploads)), RetryAfter: time.Second})
		return
	}
	ref := api.ContentRef{SHA256: r.PathValue("sha256"), Size: r.ContentLength}
	// A studio file may take longer than the server's read timeout: its deadline grows with
	// its size, at a rate no working link is below.
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(uploadDeadline(ref.Size)))
	body := &bodyReader{r: http.MaxBytesReader(w, r.Body, r.ContentLength)}
	if err := c.PutContent(r.Context(), ref, body); err != nil {
		if body.err != nil && api.Classify(err) == nil {
			err = badInput("reading the upload of %s: %v", ref.SHA256, body.err) // the client's, not the store's
		}
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, ref)
}

// writeError answers err with its catalogue entry's status and kind (api.Classify), after
// serverError has named the entry of errors of the coordinator's own packages.
func writeError(w http.ResponseWriter, err error) {
	if errors.Is(err, syscall.ENOSPC) && api.Classify(err) == nil {
		err = fmt.Errorf("%w: its data disk is full, so nothing was recorded; retry once an operator has freed space (%v)", api.ErrUnavailable, err)
		w.Header().Set("Retry-After", "30")
	}
	e := serverError(err)
	if e == api.ErrBusy {
		retry := 5 * time.Second
		var busy *api.BusyError
		if errors.As(err, &busy) {
			retry = busy.RetryAfter
		}
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(retry.Seconds()))))
	}
	body := api.ErrorBody{Error: err.Error(), Kind: e.Kind}
	if e == api.ErrNotLeader {
		w.Header().Set("Retry-After", "1")
		var nl *api.NotLeaderError
		if errors.As(err, &nl) {
			body.Leader = nl.Leader
		}
	}
	writeJSON(w, e.Status, body)
}

// serverError is the catalogue entry of err: the one it wraps, else the entry of the
// coordinator's packages' own errors (a missing record or object, a corrupt one), else
// api.ErrInternal.
func serverError(err error) *api.Error {
	if e := api.Classify(err); e != nil {
		return e
	}
	switch {
	case errors.Is(err, coorddb.ErrNotFound), errors.Is(err, queue.ErrDeadLetterNotFound), errors.Is(err, objstore.ErrNotFound):
		return api.ErrNotFound
	case errors.Is(err, objstore.ErrCorrupt):
		return api.ErrCorrupt
	case objstore.IsRetryable(err):
		return api.ErrUnavailable // the store out of reach: retrying later may work
	}
	return api.ErrInternal
}

// decodeBody decodes a small JSON request body into v: one value, within maxRequestBytes.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxRequestBytes))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && dec.More() {
		err = errors.New("more than one JSON value in the body")
	}
	if err != nil {
		return badInput("decoding request: %v", err)
	}
	return nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// uploadDeadline is how long the upload of a file of size bytes may take: ten minutes, and a
// second more per 256 KiB.
func uploadDeadline(size int64) time.Duration {
	return 10*time.Minute + time.Duration(size/(256<<10))*time.Second
}

// bodyReader records the error reading a request's body gave (a body that ends before its
// Content-Length, a client gone): the client's failure, not the store's.
type bodyReader struct {
	r   io.Reader
	err error
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}
