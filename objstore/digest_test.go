package objstore

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/tilefarm/tilefarm/internal/miniotest"
)

// damaging flips a byte of the body of every PUT it carries once armed, after the client
// signed it and computed its Content-MD5: a request damaged on the way to the server.
type damaging struct {
	next  http.RoundTripper
	armed atomic.Bool
	hits  atomic.Int32
}

func (d *damaging) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPut || !d.armed.Load() || req.Body == nil || req.ContentLength <= 0 {
		return d.next.RoundTrip(req)
	}
	body, err := io.ReadAll(req.Body)
	req.Body.Close()
	if err != nil {
		return nil, err
	}
	body[len(body)/2] ^= 0x40
	d.hits.Add(1)
	req = req.Clone(req.Context())
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return d.next.RoundTrip(req)
}

// Property: what an S3 store stores is what was sent, so nothing reads an upload back: a body
// damaged on the way is refused by the server (its Content-MD5), the error is ErrVerify and
// retryable, nothing is created under the key, and the same upload undamaged succeeds.
func TestS3RefusesAnUploadDamagedOnTheWay(t *testing.T) {
	srv := miniotest.Start(t)
	d := &damaging{}
	ctx := context.Background()
	s, err := newS3Store(ctx, srv.Endpoint, srv.Bucket, false, srv.AccessKey, srv.SecretKey,
		func(next http.RoundTripper) http.RoundTripper { d.next = next; return d })
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("tile pixels "), 1000)
	d.armed.Store(true)
	err = s.PutIfAbsent(ctx, "attempts/tiles/t/a/tile", data)
	if d.hits.Load() == 0 {
		t.Fatal("no upload was damaged")
	}
	if !errors.Is(err, ErrVerify) || !IsRetryable(err) {
		t.Fatalf("a damaged upload = %v, want a retryable ErrVerify", err)
	}
	d.armed.Store(false)
	if _, err := s.Get(ctx, "attempts/tiles/t/a/tile"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a damaged upload left an object: %v", err)
	}
	if err := s.PutIfAbsent(ctx, "attempts/tiles/t/a/tile", data); err != nil {
		t.Fatalf("the same upload undamaged: %v", err)
	}
	if got, err := s.Get(ctx, "attempts/tiles/t/a/tile"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("stored %d bytes (%v), want the %d sent", len(got), err, len(data))
	}
}
