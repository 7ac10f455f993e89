package objstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/miniotest"
	"github.com/tilefarm/tilefarm/objstore"
)

// TestS3StoreOpenAndOutage opens the store through its URL, then checks that
// errors during an outage are retryable, carry no secret, and that the data
// is back after the server restarts.
func TestS3StoreOpenAndOutage(t *testing.T) {
	srv := miniotest.Start(t)
	ctx := context.Background()
	env := objstore.EnvOf(srv.Env())
	s, err := objstore.OpenStoreEnv(ctx, srv.URL(), env)
	if err != nil {
		t.Fatal(err)
	}
	// Opening again finds the bucket that the first open created.
	if _, err := objstore.OpenStoreEnv(ctx, srv.URL(), env); err != nil {
		t.Fatalf("second open: %v", err)
	}
	p, err := finalize.Promote(ctx, s, "tiles/outage", "att-1", "b", []finalize.Output{{Name: "rgb", Data: []byte("survives")}}, nil)
	if err != nil {
		t.Fatal(err)
	}

	srv.Stop(t)
	opCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	_, err = s.Get(opCtx, "attempts/tiles/outage/att-1/rgb")
	if err == nil || !objstore.IsRetryable(err) || errors.Is(err, objstore.ErrNotFound) {
		t.Fatalf("Get during outage = %v (retryable %v), want a retryable error", err, objstore.IsRetryable(err))
	}
	_, err = finalize.Promote(opCtx, s, "tiles/other", "att-1", "b", []finalize.Output{{Name: "rgb", Data: []byte("x")}}, nil)
	if err == nil || !objstore.IsRetryable(err) {
		t.Fatalf("Promote during outage = %v, want a retryable error", err)
	}
	if _, err := objstore.OpenStoreEnv(opCtx, srv.URL(), env); err == nil || !objstore.IsRetryable(err) || strings.Contains(err.Error(), srv.SecretKey) {
		t.Fatalf("OpenStore during outage = %v, want a retryable error without the secret", err)
	}

	srv.Restart(t)
	m, err := finalize.ReadManifest(ctx, s, "tiles/outage")
	if err != nil {
		t.Fatalf("after restart: %v", err)
	}
	if got, err := finalize.ReadObject(ctx, s, m, "rgb"); err != nil || string(got) != "survives" || m.Checksum() != p.Manifest.Checksum() {
		t.Fatalf("after restart ReadObject = %q, %v", got, err)
	}
	if ok, err := finalize.ManifestExists(ctx, s, "tiles/other"); err != nil || ok {
		t.Fatalf("failed promotion left a manifest: %v, %v", ok, err)
	}

	// Wrong credentials: a terminal error that does not echo the secret.
	const wrongSecret = "not-the-secret-0123456789"
	_, err = objstore.NewS3Store(ctx, srv.Endpoint, "other", false, srv.AccessKey, wrongSecret)
	if err == nil || objstore.IsRetryable(err) || strings.Contains(err.Error(), wrongSecret) || strings.Contains(err.Error(), srv.SecretKey) {
		t.Fatalf("wrong secret = %v (retryable %v), want a terminal error without secrets", err, objstore.IsRetryable(err))
	}
}
