package e2e

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/natstest"
)

// standby starts a second `coordinator serve` of leader's farm: the same JetStream and store,
// its own database.
func standby(t *testing.T, leader *farmProc, extra ...string) *farmProc {
	t.Helper()
	f := newFarm(t, t.TempDir())
	f.NATS, f.Store = leader.NATS, leader.Store
	f.restart(extra...)
	return f
}

// submitAt submits at the comma-separated addresses and decodes the job, made or found.
func submitAt(t *testing.T, servers string, args ...string) (api.Status, result) {
	t.Helper()
	r := run(t, "coordinator", append([]string{"submit", "--json", "--server", servers}, args...)...)
	var st api.Status
	if r.code != 42 && r.code != 3 && r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil || st.JobID == "" {
		t.Fatalf("submit at %s: want the job queued, got %s", servers, r)
	}
	return st, r
}

// Property: a farm survives its leading coordinator (docs/design.md, "Replication"). Two
// coordinators share one JetStream and one store; the one that does not lead answers status
// from its own copy of the farm's journal and sends writes on to the leader. The leader is
// killed with kill -9 while a job renders; the other leads within the lease TTL and a little
// more, the job completes with every frame equal to the reference, nothing is dead-lettered,
// each job is announced completed once, and a submit made during the switch through both
// addresses is accepted exactly once.
func TestACoordinatorTakesOverTheFarmMidJob(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	nats := natstest.Start(t)
	args := []string{"--lease-ttl", "3s", "--ack-wait", "3s"}
	a := startServeNATS(t, t.TempDir(), nats.URL(), args...)
	waitMetric(t, a.HTTP, "tilefarm_coordinator_leader", 1, 10*time.Second)
	b := standby(t, a, args...)
	w := a.worker("w", t.TempDir(), slowWorker...)
	st, _ := submitAt(t, "http://"+b.HTTP+",http://"+a.HTTP, append([]string{scene, "--frames", "4-5"}, oneTile...)...)
	if metricValue(t, b.HTTP, "tilefarm_coordinator_leader") != 0 {
		t.Fatal("the standby coordinator leads")
	}
	// The standby answers from its own copy, without the leader.
	b.waitUntil(st.JobID, time.Minute, "the standby knows the job", func(s api.Status) bool { return s.TilesTotal == 2 })
	waitCheckpoint(t, w, 4)
	if s, _ := b.status(st.JobID); s.State == "completed" {
		t.Fatalf("the job completed before the leader was killed: the kill hit nothing: %+v", s)
	}
	a.Coord.Kill()
	killed := time.Now()

	// During the switch: the dead leader first, then the standby, which says it does not lead
	// (or that the dead one does) until it takes the lease; the command waits it out.
	second := append([]string{scene, "--frames", "6"}, oneTile...)
	st2, _ := submitAt(t, "http://"+a.HTTP+",http://"+b.HTTP, second...)
	took := time.Since(killed)
	if metricValue(t, b.HTTP, "tilefarm_coordinator_leader") != 1 {
		t.Fatal("the submit during the switch was accepted by a coordinator that does not lead")
	}
	t.Logf("the submit made at the kill was accepted %v later", took.Round(time.Millisecond))
	for _, id := range []string{st.JobID, st2.JobID} {
		if done := b.waitDone(id, 2*time.Minute); done.State != "completed" {
			t.Fatalf("job %s after the leader's kill: %+v", id, done)
		}
	}
	// Accepted exactly once: the same submission again is the same job, and the farm holds two.
	if again, _ := submitAt(t, "http://"+b.HTTP, second...); again.JobID != st2.JobID {
		t.Fatalf("the submission made during the switch made a second job: %s and %s", st2.JobID, again.JobID)
	}
	var jobs []map[string]any
	r := b.cli("jobs", "--json")
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &jobs) != nil || len(jobs) != 2 {
		t.Fatalf("jobs after the switch: want 2, got %s", r)
	}
	if !strings.Contains(b.Coord.Log(), "acting as the farm's leader") {
		t.Fatalf("the standby never acted as leader:\n%s", b.Coord.Log())
	}
	b.assertNoDeadLetters()
	// Each job announced completed once, though two coordinators led while it rendered.
	ctx := t.Context()
	notify, err := b.js().Stream(ctx, "NOTIFY")
	if err != nil {
		t.Fatal(err)
	}
	info, err := notify.Info(ctx, jetstream.WithSubjectFilter("notify.>"))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{st.JobID, st2.JobID} {
		subject := "notify.job.completed." + id
		if n := info.State.Subjects[subject]; n != 1 {
			t.Fatalf("%s holds %d notifications, want 1: %v", subject, n, info.State.Subjects)
		}
	}
	out := filepath.Join(t.TempDir(), "f_####.png")
	for _, id := range []string{st.JobID, st2.JobID} {
		if r := b.cli("outputs", id, "--out", out); r.code != 0 {
			t.Fatalf("outputs of %s: %s", id, r)
		}
	}
	for _, frame := range []int{4, 5, 6} {
		samePixels(t, frameFile(out, frame), reference(t, scene, frame, oneTile...))
	}
}
