package queue

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/internal/natstest"
)

// testFarm is a farm on its own in-process server in a temp dir.
type testFarm struct {
	url string
	nc  *nats.Conn
	f   *Queue
}

// connect opens another connection to the farm's server, as another process would.
func (tf *testFarm) connect(t *testing.T, name string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(tf.url, nats.Name(name))
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// fastConfig shortens timers so redelivery and expiry tests finish in seconds.
func fastConfig() Config {
	c := DefaultConfig()
	c.AckWait = time.Second
	c.LeaseTTL = time.Second
	return c
}

func startFarm(t *testing.T, cfg Config) *testFarm {
	t.Helper()
	ctx := testCtx(t)
	nc, js, url := natstest.InProcess(t)
	f, err := Setup(ctx, js, cfg)
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	f.Log = slog.New(slog.NewTextHandler(t.Output(), nil)) // shown only for failing or -v runs
	return &testFarm{url: url, nc: nc, f: f}
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond every 50ms until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func tilesCount(t *testing.T, f *Queue) uint64 {
	t.Helper()
	n, _, err := f.Depth(testCtx(t))
	if err != nil {
		t.Fatalf("Depth: %v", err)
	}
	return n
}

func mustFetch(t *testing.T, f *Queue, wait time.Duration) jetstream.Msg {
	t.Helper()
	m, err := f.Sources(Capabilities{}).FetchTile(testCtx(t), wait)
	if err != nil {
		t.Fatalf("FetchTile: %v", err)
	}
	if m == nil {
		t.Fatalf("FetchTile: no message within %v", wait)
	}
	return m
}

func deliveries(t *testing.T, m jetstream.Msg) uint64 {
	t.Helper()
	md, err := m.Metadata()
	if err != nil {
		t.Fatalf("Metadata: %v", err)
	}
	return md.NumDelivered
}
