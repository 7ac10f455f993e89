package miniotest_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/tilefarm/tilefarm/internal/miniotest"
	"github.com/tilefarm/tilefarm/objstore"
)

// TestStopRestartKeepsData writes through the store URL and credentials the
// server hands out, stops it (an outage), restarts it, and reads the data back.
func TestStopRestartKeepsData(t *testing.T) {
	srv := miniotest.Start(t)
	if !strings.HasPrefix(srv.Endpoint, "127.0.0.1:") || srv.URL() != "s3+http://"+srv.Endpoint+"/"+srv.Bucket {
		t.Fatalf("endpoint %q, URL %q", srv.Endpoint, srv.URL())
	}
	for _, kv := range srv.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	ctx := context.Background()
	s, err := objstore.OpenStore(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutIfAbsent(ctx, "before/stop", []byte("kept across restarts")); err != nil {
		t.Fatal(err)
	}
	endpoint := srv.Endpoint

	srv.Stop(t)
	if _, err := s.Get(ctx, "before/stop"); err == nil {
		t.Fatal("Get succeeded while the server was stopped")
	}
	srv.Restart(t)
	if srv.Endpoint != endpoint {
		t.Fatalf("restart moved the server from %s to %s", endpoint, srv.Endpoint)
	}
	got, err := s.Get(ctx, "before/stop")
	if err != nil || string(got) != "kept across restarts" {
		t.Fatalf("after restart Get = %q, %v", got, err)
	}
	if err := s.PutIfAbsent(ctx, "before/stop", []byte("again")); err == nil {
		t.Fatal("create-if-absent succeeded over data that survived the restart")
	}
}

// fatalRecorder stands in for a testing.TB to observe how Start fails.
type fatalRecorder struct {
	testing.TB
	mu      sync.Mutex
	fatal   string
	skipped bool
}

func (r *fatalRecorder) Helper() {}
func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.mu.Lock()
	r.fatal = fmt.Sprintf(format, args...)
	r.mu.Unlock()
	runtime.Goexit()
}
func (r *fatalRecorder) Skip(...any)          { r.skipped = true; runtime.Goexit() }
func (r *fatalRecorder) Skipf(string, ...any) { r.skipped = true; runtime.Goexit() }
func (r *fatalRecorder) SkipNow()             { r.skipped = true; runtime.Goexit() }

// TestMissingBinaryFails checks that a missing MinIO fails loudly with the
// way to install it, instead of skipping the storage tests, for a single
// server and for a cluster.
func TestMissingBinaryFails(t *testing.T) {
	t.Setenv("TILEFARM_MINIO", "/nonexistent/minio")
	for name, start := range map[string]func(testing.TB){
		"Start":        func(tb testing.TB) { miniotest.Start(tb) },
		"StartCluster": func(tb testing.TB) { miniotest.StartCluster(tb, 4) },
	} {
		rec := &fatalRecorder{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			start(rec)
		}()
		<-done
		if rec.skipped {
			t.Fatalf("%s skipped the test", name)
		}
		if !strings.Contains(rec.fatal, "README") || !strings.Contains(rec.fatal, "go install") || !strings.Contains(rec.fatal, "TILEFARM_MINIO") {
			t.Fatalf("%s failed with %q, want a message naming TILEFARM_MINIO, the README command and go install", name, rec.fatal)
		}
	}
}
