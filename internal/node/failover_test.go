package node

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/client"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/internal/scene/jsonscene"
)

// Property: a client of several addresses sends a scene file's upload, which streams and so
// cannot be sent again by the request itself, from its start to the next address when the one
// it went to drops it: the submission completes at the other address with every file stored.
// The first address is a path to the real coordinator that answers everything but drops every
// upload's connection (a coordinator's machine lost mid-upload).
func TestUploadGoesToTheNextAddressWhenOneDropsIt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n, err := StartCoordinator(ctx, CoordinatorOptions{DataDir: t.TempDir(), Queue: queue.DefaultConfig(), HTTPListen: "127.0.0.1:0",
		Kinds: scene.Kinds{jsonscene.Kind{}}, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	live, err := url.Parse("http://" + n.HTTPAddr)
	if err != nil {
		t.Fatal(err)
	}
	var dropped atomic.Int32
	forward := httputil.NewSingleHostReverseProxy(live)
	flaky := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && strings.HasPrefix(r.URL.Path, "/v1/content/") {
			dropped.Add(1)
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.(*net.TCPConn).SetLinger(0)
				conn.Close()
			}
			return
		}
		forward.ServeHTTP(w, r)
	}))
	defer flaky.Close()

	b, err := jsonscene.ReadFile(ctx, "../../examples/shot/scene.json")
	if err != nil {
		t.Fatal(err)
	}
	c := client.New(flaky.URL+",http://"+n.HTTPAddr, "")
	res, err := c.Submit(ctx, b, api.SubmitRequest{First: 1, Last: 1, Width: 16, Height: 16, SPP: 1})
	if err != nil {
		t.Fatalf("submit through a path that drops uploads, with another address: %v", err)
	}
	if res.Status.JobID == "" || dropped.Load() == 0 {
		t.Fatalf("job %q, %d uploads dropped: the test shows nothing", res.Status.JobID, dropped.Load())
	}
	if ok, err := c.HasScene(ctx, b.Version()); err != nil || !ok {
		t.Fatalf("the farm has the scene: %v, %v", ok, err)
	}
}
