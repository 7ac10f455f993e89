package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/natstest"
	"github.com/tilefarm/tilefarm/internal/queue"
)

// A farm on a 3-node JetStream cluster with every stream and bucket replicated three times
// renders a shot while the TILES stream's leader is killed with SIGKILL, and later while a
// second node restarts: every process rides through the leader changes, nothing is lost or
// dead-lettered, and every frame equals the reference.
func TestClusterFarmSurvivesLeaderKill(t *testing.T) {
	scene := example("shot")
	c := natstest.StartCluster(t, 3)
	f := startServeNATS(t, t.TempDir(), c.URLs(), "--replicas", "3", "--ack-wait", "5s", "--lease-ttl", "5s")
	slow := []string{"--fault-pass-delay", "50ms", "--checkpoint-every", "0"}
	w1 := startEnv(t, nil, "tileworker", append([]string{"--nats", c.URLs(), "--store", f.store, "--checkpoints", t.TempDir(),
		"--name", "w1", "--concurrency", "1", "--log-level", "debug"}, slow...)...)
	w2 := startEnv(t, nil, "tileworker", append([]string{"--nats", c.URLs(), "--store", f.store, "--checkpoints", t.TempDir(),
		"--name", "w2", "--concurrency", "1", "--log-level", "debug"}, slow...)...)
	frames := []string{"--frames", "1-6"}
	st, _ := f.submit(append(append([]string{scene}, frames...), small...)...)

	ctx := context.Background()
	js := f.js()
	waitProgress := func(min int) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for {
			s, _ := f.status(st.JobID)
			if s.TilesCompleted >= min {
				if s.State == "completed" {
					t.Fatalf("the job finished before the fault: %+v", s)
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("no progress to %d tiles: %+v", min, s)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitProgress(4)
	leader, err := c.StreamLeader(ctx, js, queue.StreamTiles)
	if err != nil {
		t.Fatal(err)
	}
	c.Server(leader).Kill()
	t.Logf("killed the TILES leader %s", leader)
	waitProgress(16)
	if now, err := c.StreamLeader(ctx, js, queue.StreamTiles); err != nil || now == leader {
		t.Fatalf("TILES leader after the kill: %q, %v", now, err)
	}
	c.Server(leader).Restart(t)
	var second *natstest.Server
	for _, s := range c.Servers {
		if s.Name != leader {
			second = s
			break
		}
	}
	waitProgress(22)
	second.Stop()
	second.Restart(t)
	t.Logf("restarted %s", second.Name)
	done := f.waitDone(st.JobID, 3*time.Minute)
	if done.State != "completed" || done.TilesFailed != 0 {
		t.Fatalf("job on the cluster: %+v", done)
	}
	f.assertNoDeadLetters()
	for _, w := range []*proc{w1, w2} {
		if strings.Contains(w.log(), "dead-lettering") {
			t.Fatalf("a worker dead-lettered during the leader changes:\n%s", w.log())
		}
	}
	outputsEqualReference(t, f, st.JobID, scene, []int{1, 2, 3, 4, 5, 6}, small...)
}
