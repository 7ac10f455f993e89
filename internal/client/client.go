// Package client is the HTTP client of the coordinator API, used by the CLI's submit, status,
// jobs, outputs and dlq commands. It speaks only the wire types of package api and links none
// of the server. Errors keep the coordinator's classification (api's catalogue), so the CLI can
// map them onto exit codes with errors.Is.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/bundle"
)

// retryAfter reads a Retry-After header in seconds; anything else is a minute.
func retryAfter(h string) time.Duration {
	if n, err := strconv.Atoi(strings.TrimSpace(h)); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	return time.Minute
}

// EnvToken is the variable the commands read the API token from.
const EnvToken = "TILEFARM_API_TOKEN"

// Client talks to a farm's coordinator at one of its addresses: the one that answered last,
// else the next in turn.
type Client struct {
	bases []string
	cur   atomic.Int32 // index in bases of the address that answered last
	token string
	http  *http.Client
}

// dialTimeout bounds making a connection to one coordinator address.
const dialTimeout = 5 * time.Second

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient sends the client's requests with h: one that dials from inside a network
// namespace, say. Its Timeout bounds each request; the default client's is ten minutes.
func WithHTTPClient(h *http.Client) Option { return func(c *Client) { c.http = h } }

// New returns a client for a coordinator at servers ("http://127.0.0.1:7070" or
// "127.0.0.1:7070"), or at any of several addresses separated by commas (the coordinators of a
// farm, or one coordinator's addresses on several networks), that sends token, if any, as its
// bearer token. A request the address it went to could not answer (unreachable, or 502, 503,
// 504) is sent to the next address, when it can be sent again: every request whose body is
// in memory (submissions carry their idempotency key, so a repeat is the same job).
func New(servers, token string, opts ...Option) *Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	// An address cut off drops what is sent to it: a connection not made within dialTimeout
	// is given up for the next address, not waited on for the system's half a minute.
	t.DialContext = (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext
	c := &Client{token: token, http: &http.Client{Timeout: 10 * time.Minute, Transport: t}}
	for _, base := range strings.Split(servers, ",") {
		base = strings.TrimSpace(base)
		if base == "" {
			continue
		}
		if !strings.Contains(base, "://") {
			base = "http://" + base
		}
		c.bases = append(c.bases, strings.TrimRight(base, "/"))
	}
	if len(c.bases) == 0 {
		c.bases = []string{"http://"} // every request fails, naming the empty address
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Addresses is how many coordinator addresses the client sends to.
func (c *Client) Addresses() int { return len(c.bases) }

// Submit submits a job for scene b, uploading first what the farm lacks of it (UploadScene):
// a cron job re-running submit sends a big scene once, and a resubmit after one texture
// changed sends that texture and the manifest.
func (c *Client) Submit(ctx context.Context, b *bundle.Bundle, req api.SubmitRequest) (api.SubmitResult, error) {
	req.SceneVersion = b.Version()
	return c.SubmitAfterUpload(ctx, req, func() error {
		_, err := UploadScene(ctx, c, b, 0, nil)
		return err
	})
}

// IsSceneMissing reports whether a submission was refused because the farm does not have its
// scene: its scene gc deleted the manifest of a scene no job named between the upload (which
// found it) and the job. Uploading again stores it again.
func IsSceneMissing(err error) bool {
	return errors.Is(err, api.ErrBadInput) && strings.Contains(err.Error(), "scene not uploaded")
}

// SubmitUploaded submits a job for a scene already uploaded (UploadScene) under
// req.SceneVersion.
func (c *Client) SubmitUploaded(ctx context.Context, req api.SubmitRequest) (api.SubmitResult, error) {
	var res api.SubmitResult
	err := c.postJSON(ctx, "/v1/jobs", req, &res)
	return res, err
}

// HasScene reports whether the coordinator has the scene of version.
func (c *Client) HasScene(ctx context.Context, version string) (bool, error) {
	err := c.do(ctx, http.MethodHead, "/v1/scenes/"+version, nil, nil)
	if errors.Is(err, api.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// Status returns a job's status.
func (c *Client) Status(ctx context.Context, jobID string) (api.Status, error) {
	var st api.Status
	err := c.do(ctx, http.MethodGet, "/v1/jobs/"+jobID, nil, &st)
	return st, err
}

// Jobs lists jobs.
func (c *Client) Jobs(ctx context.Context) ([]api.Status, error) {
	var out []api.Status
	err := c.do(ctx, http.MethodGet, "/v1/jobs", nil, &out)
	return out, err
}

// FrameOutput downloads one output of a frame.
func (c *Client) FrameOutput(ctx context.Context, jobID string, frame int, format string) ([]byte, error) {
	var raw []byte
	err := c.do(ctx, http.MethodGet, fmt.Sprintf("/v1/jobs/%s/frames/%d/%s", jobID, frame, format), nil, &raw)
	return raw, err
}

// FrameIndex names the files of one output of a frame.
func (c *Client) FrameIndex(ctx context.Context, jobID string, frame int, format string) (api.FrameIndex, error) {
	var out api.FrameIndex
	err := c.do(ctx, http.MethodGet, fmt.Sprintf("/v1/jobs/%s/frames/%d/%s/index", url.PathEscape(jobID), frame, url.PathEscape(format)), nil, &out)
	return out, err
}

// FrameFile downloads file i of one output of a frame (FrameIndex.Files[i]).
func (c *Client) FrameFile(ctx context.Context, jobID string, frame int, format string, i int) ([]byte, error) {
	var raw []byte
	err := c.do(ctx, http.MethodGet, fmt.Sprintf("/v1/jobs/%s/frames/%d/%s?file=%d", url.PathEscape(jobID), frame, url.PathEscape(format), i), nil, &raw)
	return raw, err
}

// Movie downloads a job's preview movie; one not ready yet is api.ErrMovieNotReady.
func (c *Client) Movie(ctx context.Context, jobID string) ([]byte, error) {
	var raw []byte
	err := c.do(ctx, http.MethodGet, "/v1/jobs/"+url.PathEscape(jobID)+"/movie", nil, &raw)
	return raw, err
}

// DeadLetters lists the DLQ.
func (c *Client) DeadLetters(ctx context.Context) ([]api.DeadLetter, error) {
	var out []api.DeadLetter
	err := c.do(ctx, http.MethodGet, "/v1/dlq", nil, &out)
	return out, err
}

// Requeue puts a dead letter back on the queue.
func (c *Client) Requeue(ctx context.Context, seq uint64) error {
	return c.do(ctx, http.MethodPost, fmt.Sprintf("/v1/dlq/%d/requeue", seq), nil, nil)
}

// Cancel cancels a job and returns its status.
func (c *Client) Cancel(ctx context.Context, jobID string) (api.Status, error) {
	var st api.Status
	err := c.do(ctx, http.MethodPost, "/v1/jobs/"+url.PathEscape(jobID)+"/cancel", nil, &st)
	return st, err
}

// Reprioritize gives a job a new priority and returns its status.
func (c *Client) Reprioritize(ctx context.Context, jobID string, priority int) (api.Status, error) {
	body, _ := json.Marshal(api.PriorityRequest{Priority: &priority})
	var st api.Status
	err := c.do(ctx, http.MethodPut, "/v1/jobs/"+url.PathEscape(jobID)+"/priority", body, &st)
	return st, err
}

// Workers lists the live workers.
func (c *Client) Workers(ctx context.Context) ([]api.Worker, error) {
	var res api.WorkersResponse
	err := c.do(ctx, http.MethodGet, "/v1/workers", nil, &res)
	return res.Workers, err
}

// do performs a request with a JSON body; out may be *[]byte for a raw body, a pointer to
// decode JSON into, or nil.
func (c *Client) do(ctx context.Context, method, path string, body []byte, out any) error {
	return c.doRaw(ctx, method, path, "application/json", body, out)
}

// doRaw performs a request with a body of the given content type, at the next address too
// while one is unavailable.
func (c *Client) doRaw(ctx context.Context, method, path, contentType string, body []byte, out any) error {
	return c.across(ctx, true, func(base string) error {
		if body == nil {
			return c.doAt(ctx, base, method, path, "", nil, 0, out)
		}
		return c.doAt(ctx, base, method, path, contentType, bytes.NewReader(body), int64(len(body)), out)
	})
}

// electionWait bounds how long a request whose body is in memory keeps trying while the
// coordinators it reaches say none of them leads yet: the farm's leadership lease of a
// coordinator that died expires within its TTL, and another then takes the lead.
const electionWait = time.Minute

// across runs try at the address that answered last and, while the address it tried is
// unavailable or does not lead the farm and again allows, at the others in turn; an
// unavailable address makes the next one current, so a caller that tries again later (an
// upload's retry) starts there. When every address refused, one of them saying it does not
// lead (api.ErrNotLeader) while another was out of reach or none named a leader (an election
// in progress: the leader died), it tries them all again every second, for up to
// electionWait, so a command run while a coordinator fails over waits for the new leader.
func (c *Client) across(ctx context.Context, again bool, try func(base string) error) error {
	deadline := time.Now().Add(electionWait)
	for {
		start := int(c.cur.Load())
		var errs []error
		notLeader, unreachable, leaderless := false, false, false
		for i := range c.bases {
			k := (start + i) % len(c.bases)
			err := try(c.bases[k])
			var nl *api.NotLeaderError
			isNotLeader := errors.As(err, &nl)
			if err == nil || !(errors.Is(err, api.ErrUnavailable) || isNotLeader) {
				c.cur.Store(int32(k))
				return err
			}
			notLeader = notLeader || isNotLeader
			unreachable = unreachable || !isNotLeader
			leaderless = leaderless || (isNotLeader && nl.Leader == "")
			errs = append(errs, err)
			c.cur.CompareAndSwap(int32(k), int32((k+1)%len(c.bases)))
			if !again || ctx.Err() != nil {
				return errors.Join(errs...)
			}
		}
		if !notLeader || !(unreachable || leaderless) || time.Now().After(deadline) {
			return errors.Join(errs...)
		}
		select {
		case <-ctx.Done():
			return errors.Join(append(errs, ctx.Err())...)
		case <-time.After(time.Second):
		}
	}
}

// postJSON posts v as JSON and decodes the answer into out.
func (c *Client) postJSON(ctx context.Context, path string, v, out any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return c.do(ctx, http.MethodPost, path, body, out)
}

// streamedBody is the body size beyond which a request runs without the client's timeout.
const streamedBody = 64 << 20

// doStream performs a request whose body of size bytes streams from body (nil: none), so an
// upload of a studio file holds none of it in memory; a body that streamed cannot be sent
// again, so an unavailable address fails it (the next try starts at the next address).
func (c *Client) doStream(ctx context.Context, method, path, contentType string, body io.Reader, size int64, out any) error {
	return c.across(ctx, body == nil, func(base string) error {
		return c.doAt(ctx, base, method, path, contentType, body, size, out)
	})
}

// doAt performs one request at the coordinator address base.
func (c *Client) doAt(ctx context.Context, base, method, path, contentType string, body io.Reader, size int64, out any) error {
	var rb io.Reader = http.NoBody
	if body != nil {
		rb = io.NopCloser(body) // not a *bytes.Reader to net/http: ContentLength is set below
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rb)
	if err != nil {
		return err
	}
	hc := c.http
	if body != nil {
		req.ContentLength = size
		req.Header.Set("Content-Type", contentType)
		if size > streamedBody {
			// A studio file may take longer than the client's timeout: ctx bounds it instead.
			hc = &http.Client{Transport: c.http.Transport, CheckRedirect: c.http.CheckRedirect, Jar: c.http.Jar}
		}
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err() // interrupted, not unavailable
		}
		return fmt.Errorf("%w at %s: %v", api.ErrUnavailable, base, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("%w: reading response: %v", api.ErrUnavailable, err)
	}
	if resp.StatusCode >= 300 {
		var apiErr api.ErrorBody
		if resp.StatusCode == http.StatusTooManyRequests {
			_ = json.Unmarshal(data, &apiErr)
			return &api.BusyError{Message: apiErr.Error, RetryAfter: retryAfter(resp.Header.Get("Retry-After"))}
		}
		if json.Unmarshal(data, &apiErr) != nil || apiErr.Error == "" {
			apiErr.Error = strings.TrimSpace(string(data))
		}
		msg := errors.New(apiErr.Error)
		if e := api.OfKind(apiErr.Kind); e != nil {
			if e == api.ErrNotLeader {
				return fmt.Errorf("%s at %s: %w", resp.Status, base, &api.NotLeaderError{Leader: apiErr.Leader})
			}
			if e.Status >= 500 {
				// The coordinator's own failure: its words after the status, as the kind says.
				return fmt.Errorf("%s: %w", resp.Status, &wireError{msg: apiErr.Error, entry: e})
			}
			return fmt.Errorf("%w (%w)", msg, e)
		}
		switch resp.StatusCode {
		case http.StatusUnauthorized:
			return fmt.Errorf("%s: %w", resp.Status, api.ErrUnauthorized)
		case http.StatusNotFound:
			return fmt.Errorf("%w (%w)", msg, api.ErrNotFound)
		case http.StatusTooManyRequests:
			return fmt.Errorf("%w (%w)", msg, api.ErrBusy)
		case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			return fmt.Errorf("%w: %s: %v", api.ErrUnavailable, resp.Status, msg)
		}
		return fmt.Errorf("%s: %w", resp.Status, msg)
	}
	switch o := out.(type) {
	case nil:
		return nil
	case *[]byte:
		*o = data
		return nil
	default:
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("decoding response from %s: %w", path, err)
		}
		return nil
	}
}

// wireError is an error as the coordinator worded it, which is the catalogue entry of its kind.
type wireError struct {
	msg   string
	entry *api.Error
}

func (e *wireError) Error() string { return e.msg }
func (e *wireError) Unwrap() error { return e.entry }
