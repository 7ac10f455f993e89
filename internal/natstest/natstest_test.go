package natstest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A 3-node cluster keeps a replicated stream writable with its leader killed, and the node
// catches up when it comes back.
func TestClusterSurvivesLeaderKill(t *testing.T) {
	c := StartCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc, err := nats.Connect(c.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	batch := 0
	publish := func(count int) {
		batch++
		n := batch
		for i := 0; i < count; i++ {
			for {
				// Each try has a timeout of its own: a request sent to the node just killed
				// gets no answer.
				pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := js.Publish(pctx, "s.x", []byte("m"), jetstream.WithMsgID(fmt.Sprintf("m%d-%d", n, i)))
				cancel()
				if err == nil {
					break
				} else if ctx.Err() != nil {
					t.Fatalf("publishing: %v", err)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	publish(10)
	leader, err := c.StreamLeader(ctx, js, "S")
	if err != nil {
		t.Fatal(err)
	}
	c.Server(leader).Kill()
	publish(10)
	newLeader, err := c.NewStreamLeader(ctx, js, "S", leader)
	if err != nil {
		t.Fatalf("leader after killing %s: %q, %v", leader, newLeader, err)
	}
	c.Server(leader).Restart(t)
	s, err := js.Stream(ctx, "S")
	if err != nil {
		t.Fatal(err)
	}
	if info, err := s.Info(ctx); err != nil || info.State.Msgs != 20 {
		t.Fatalf("stream after the leader's restart: %d messages, %v", info.State.Msgs, err)
	}
}

// Property: with nothing set, the nats-server the test command built under the cache directory
// for the version go.mod pins is found, so the benchmarks run after ./test.sh as the tests do.
func TestBinaryIsFoundWhereTheTestCommandBuildsIt(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	t.Setenv(EnvBinary, "")
	t.Setenv("PATH", t.TempDir())
	if _, err := findBinary(); err == nil {
		t.Fatal("a nats-server was found with none built")
	}
	want := cacheBinary()
	if !strings.HasPrefix(want, filepath.Join(cache, "tilefarm", "nats-server-v2.")) {
		t.Fatalf("the cache path %q is not under %s for a v2 release", want, cache)
	}
	// The version is the one the test command builds: go.mod's.
	gomod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(gomod), "github.com/nats-io/nats-server/v2 v"+strings.TrimPrefix(filepath.Base(filepath.Dir(want)), "nats-server-v")+"\n") {
		t.Fatalf("the cache path %q names another version than go.mod's", want)
	}
	if err := os.MkdirAll(filepath.Dir(want), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(want, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := findBinary(); err != nil || got != want {
		t.Fatalf("findBinary() = %q, %v; want %q", got, err, want)
	}
}
