package finalize

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/miniotest"
)

func TestS3StoreConformance(t *testing.T) {
	srv := miniotest.Start(t)
	var n atomic.Int32
	testStoreConformance(t, func(t *testing.T) Store {
		bucket := fmt.Sprintf("conformance-%d", n.Add(1))
		s, err := NewS3Store(context.Background(), srv.Endpoint, bucket, false, srv.AccessKey, srv.SecretKey)
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// TestS3StoreOpenAndOutage opens the store through its URL, then checks that
// errors during an outage are retryable, carry no secret, and that the data
// is back after the server restarts.
func TestS3StoreOpenAndOutage(t *testing.T) {
	srv := miniotest.Start(t)
	ctx := context.Background()
	env := envOf(srv.Env())
	s, err := openStore(ctx, srv.URL(), env)
	if err != nil {
		t.Fatal(err)
	}
	// Opening again finds the bucket that the first open created.
	if _, err := openStore(ctx, srv.URL(), env); err != nil {
		t.Fatalf("second open: %v", err)
	}
	p, err := Promote(ctx, s, "tiles/outage", "att-1", "b", []Output{{"rgb", []byte("survives")}}, nil)
	if err != nil {
		t.Fatal(err)
	}

	srv.Stop(t)
	opCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	_, err = s.Get(opCtx, "attempts/tiles/outage/att-1/rgb")
	if err == nil || !IsRetryable(err) || errors.Is(err, ErrNotFound) {
		t.Fatalf("Get during outage = %v (retryable %v), want a retryable error", err, IsRetryable(err))
	}
	_, err = Promote(opCtx, s, "tiles/other", "att-1", "b", []Output{{"rgb", []byte("x")}}, nil)
	if err == nil || !IsRetryable(err) {
		t.Fatalf("Promote during outage = %v, want a retryable error", err)
	}
	if _, err := openStore(opCtx, srv.URL(), env); err == nil || !IsRetryable(err) || strings.Contains(err.Error(), srv.SecretKey) {
		t.Fatalf("OpenStore during outage = %v, want a retryable error without the secret", err)
	}

	srv.Restart(t)
	m, err := ReadManifest(ctx, s, "tiles/outage")
	if err != nil {
		t.Fatalf("after restart: %v", err)
	}
	if got, err := ReadObject(ctx, s, m, "rgb"); err != nil || string(got) != "survives" || m.Checksum() != p.Manifest.Checksum() {
		t.Fatalf("after restart ReadObject = %q, %v", got, err)
	}
	if ok, err := ManifestExists(ctx, s, "tiles/other"); err != nil || ok {
		t.Fatalf("failed promotion left a manifest: %v, %v", ok, err)
	}

	// Wrong credentials: a terminal error that does not echo the secret.
	const wrongSecret = "not-the-secret-0123456789"
	_, err = NewS3Store(ctx, srv.Endpoint, "other", false, srv.AccessKey, wrongSecret)
	if err == nil || IsRetryable(err) || strings.Contains(err.Error(), wrongSecret) || strings.Contains(err.Error(), srv.SecretKey) {
		t.Fatalf("wrong secret = %v (retryable %v), want a terminal error without secrets", err, IsRetryable(err))
	}
}

// envOf turns KEY=VALUE pairs into a getenv function.
func envOf(kv []string) func(string) string {
	m := map[string]string{}
	for _, e := range kv {
		k, v, _ := strings.Cut(e, "=")
		m[k] = v
	}
	return func(k string) string { return m[k] }
}
