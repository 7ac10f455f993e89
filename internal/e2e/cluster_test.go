//go:build linux

package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tilefarm/tilefarm/internal/natstest"
	"github.com/tilefarm/tilefarm/internal/proctest"
	"github.com/tilefarm/tilefarm/internal/queue"
)

// A farm on a 3-node JetStream cluster with every stream and bucket replicated three times
// renders a shot while the TILES stream's leader is killed with SIGKILL, and later while a
// second node restarts: every process rides through the leader changes, nothing is lost or
// dead-lettered, and every frame equals the reference.
func TestClusterFarmSurvivesLeaderKill(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	c := natstest.StartCluster(t, 3)
	f := startServeNATS(t, t.TempDir(), c.URLs(), "--replicas", "3", "--ack-wait", "5s", "--lease-ttl", "5s")
	slow := []string{"--fault-pass-delay", "50ms", "--checkpoint-every", "0"}
	w1 := startEnv(t, nil, "tileworker", append([]string{"--nats", c.URLs(), "--store", f.Store, "--checkpoints", t.TempDir(),
		"--name", "w1", "--concurrency", "1", "--log-level", "debug"}, slow...)...)
	w2 := startEnv(t, nil, "tileworker", append([]string{"--nats", c.URLs(), "--store", f.Store, "--checkpoints", t.TempDir(),
		"--name", "w2", "--concurrency", "1", "--log-level", "debug"}, slow...)...)
	// Twelve frames of six tiles: long enough that the job is still rendering at the second
	// fault, however long the killed node takes to come back.
	frames := []string{"--frames", "1-12"}
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
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := c.NewStreamLeader(wctx, js, queue.StreamTiles, leader); err != nil {
		t.Fatalf("TILES leader after the kill: %v", err)
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
	for _, w := range []*proctest.Proc{w1, w2} {
		if strings.Contains(w.Log(), "dead-lettering") {
			t.Fatalf("a worker dead-lettered during the leader changes:\n%s", w.Log())
		}
	}
	outputsEqualReference(t, f, st.JobID, scene, []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, small...)
}

// The documented external configuration: `coordinator credentials` makes the two identities
// and prints the account block; a 3-node cluster configured with it runs a farm whose
// coordinator and workers each present their own credential, and refuses anyone else.
func TestExternalClusterWithCredentials(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	creds := t.TempDir()
	r := run(t, "coordinator", "credentials", "--data", creds)
	if r.code != 0 || !strings.Contains(r.stdout, "accounts {") {
		t.Fatalf("coordinator credentials: %s", r)
	}
	coordSeed, err := nats.NkeyOptionFromSeed(filepath.Join(creds, "coordinator.creds"))
	if err != nil {
		t.Fatal(err)
	}
	c := natstest.StartCluster(t, 3, natstest.Options{Config: r.stdout, Connect: []nats.Option{coordSeed}})
	if nc, err := nats.Connect(c.URLs(), nats.NoReconnect(), nats.Timeout(2*time.Second)); err == nil {
		nc.Close()
		t.Fatal("the cluster accepted a client without credentials")
	}
	f := startServeNATS(t, t.TempDir(), c.URLs(), "--replicas", "3", "--nats-creds", filepath.Join(creds, "coordinator.creds"))
	startEnv(t, nil, "tileworker", "--nats", c.URLs(), "--nats-creds", filepath.Join(creds, "worker.creds"), "--store", f.Store,
		"--checkpoints", t.TempDir(), "--name", "w", "--concurrency", "1")
	st, _ := f.submit(append([]string{scene, "--frames", "2"}, small...)...)
	if done := f.waitDone(st.JobID, 2*time.Minute); done.State != "completed" {
		t.Fatalf("job on the authenticated cluster: %+v", done)
	}
	outputsEqualReference(t, f, st.JobID, scene, []int{2}, small...)
}
