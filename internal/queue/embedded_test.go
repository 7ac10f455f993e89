package queue

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestEmbeddedListensForTCPClientsAndKeepsStreamsAcrossRestart(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	dir := t.TempDir()
	cfg := DefaultConfig()

	e, err := StartEmbedded(ctx, dir, "127.0.0.1:0")
	if err != nil {
		t.Fatalf("StartEmbedded: %v", err)
	}
	url := e.ClientURL()
	if !strings.HasPrefix(url, "nats://127.0.0.1:") || strings.HasSuffix(url, ":0") {
		t.Fatalf("ClientURL = %q, want a concrete loopback port", url)
	}
	// A plain TCP client, as an external tileworker would connect.
	nc, err := nats.Connect(url, nats.Name("external-worker"))
	if err != nil {
		e.Shutdown()
		t.Fatalf("nats.Connect(%q): %v", url, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream.New: %v", err)
	}
	f, err := Setup(ctx, js, cfg)
	if err != nil {
		t.Fatalf("Setup over TCP: %v", err)
	}
	for i, id := range []string{"t0", "t1", "t2"} {
		if _, err := f.Publish(ctx, SubjectRender, id, []byte{byte('a' + i)}, nil); err != nil {
			t.Fatalf("Publish %s: %v", id, err)
		}
	}
	lease, err := f.Leases.Acquire(ctx, "tile.persist", "worker-a")
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	nc.Close()
	e.Shutdown()

	// Same directory, no TCP listener requested: contents survive.
	e2, err := StartEmbedded(ctx, dir, "")
	if err != nil {
		t.Fatalf("restart StartEmbedded: %v", err)
	}
	t.Cleanup(e2.Shutdown)
	if u := e2.ClientURL(); !strings.HasPrefix(u, "nats://127.0.0.1:") {
		t.Fatalf("default ClientURL = %q, want loopback", u)
	}
	nc2, err := e2.Connect("coordinator")
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Cleanup(nc2.Close)
	js2, err := jetstream.New(nc2)
	if err != nil {
		t.Fatalf("jetstream.New: %v", err)
	}
	f2, err := Setup(ctx, js2, cfg)
	if err != nil {
		t.Fatalf("Setup after restart: %v", err)
	}
	if n := tilesCount(t, f2); n != 3 {
		t.Fatalf("TILES after restart holds %d messages, want 3", n)
	}
	m := mustFetch(t, f2, 3*time.Second)
	if m.Headers().Get(jetstream.MsgIDHeader) != "t0" || string(m.Data()) != "a" {
		t.Fatalf("first message after restart = %q/%q", m.Headers().Get(jetstream.MsgIDHeader), m.Data())
	}
	if err := m.DoubleAck(ctx); err != nil {
		t.Fatalf("DoubleAck: %v", err)
	}
	if owner, tok, err := f2.Leases.Owner(ctx, "tile.persist"); err != nil || owner != "worker-a" || tok != lease.Token {
		t.Fatalf("lease after restart = %q@%d, %v; want worker-a@%d", owner, tok, err, lease.Token)
	}
}

func TestStartEmbeddedRejectsBadListen(t *testing.T) {
	t.Parallel()
	for _, listen := range []string{"no-port", "127.0.0.1:99999", "127.0.0.1:http"} {
		if e, err := StartEmbedded(testCtx(t), t.TempDir(), listen); err == nil {
			e.Shutdown()
			t.Errorf("StartEmbedded(%q) succeeded, want an error", listen)
		}
	}
	if _, err := StartEmbedded(testCtx(t), "", ""); err == nil {
		t.Errorf("StartEmbedded with empty dir succeeded")
	}
}
