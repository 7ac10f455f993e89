package natstest

import (
	"context"
	"fmt"
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
