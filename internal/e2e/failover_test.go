//go:build linux

package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
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

// journalWriters reads the farm's journal: the writer of every entry, in order.
func journalWriters(t *testing.T, f *farmProc) []string { return journalWritersOf(t, f.js()) }

// coordinatorID is the leadership id of the coordinator whose data is f's.
func coordinatorID(t *testing.T, f *farmProc) string {
	t.Helper()
	id, err := os.ReadFile(filepath.Join(f.Data, "coordinator.id"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(id))
}

// Property: a leader deposed that has not noticed cannot change the farm (docs/design.md,
// "Replication"). The leader's leadership loop goes deaf (it neither renews nor reads its
// lease) while a job renders and the rest of it acts on; the other coordinator takes the
// lease and fences the farm's journal. A submission the deposed leader still accepts is
// refused by JetStream (the journal moved past it), so it writes nothing to the journal after
// the new leader's first entry and makes no job; once it hears again it follows as a
// standby, answering from the new leader's records; the job completes equal to the reference.
func TestADeposedLeaderIsRefusedAndFollows(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	nats := natstest.Start(t)
	args := []string{"--lease-ttl", "3s", "--ack-wait", "3s"}
	a := startServeNATS(t, t.TempDir(), nats.URL(), append(args, "--fault-deaf-leader", "2s:14s")...)
	waitMetric(t, a.HTTP, "tilefarm_coordinator_leader", 1, 10*time.Second)
	b := standby(t, a, args...)
	w := a.worker("w", t.TempDir(), slowWorker...)
	st, _ := submitAt(t, "http://"+a.HTTP, append([]string{scene, "--frames", "4-6"}, oneTile...)...)
	waitCheckpoint(t, w, 2)
	if _, err := a.Coord.WaitLog(t.Context(), regexp.MustCompile(`the leadership loop goes deaf`), 0, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, b.HTTP, "tilefarm_coordinator_leader", 1, 15*time.Second)
	if s, _ := b.status(st.JobID); s.State == "completed" {
		t.Fatalf("the job completed before the leader was deposed: the fault hit nothing: %+v", s)
	}
	// The deposed leader still counts itself leader and takes the submission; the journal refuses it.
	r := run(t, "coordinator", append([]string{"submit", "--json", "--server", "http://" + a.HTTP, scene, "--frames", "7"}, oneTile...)...)
	if r.code != 75 || !strings.Contains(r.stderr, "does not lead") {
		t.Fatalf("a submission to the deposed leader: want exit 75 saying it does not lead, got %s", r)
	}
	if n := metricValue(t, a.HTTP, "tilefarm_coordinator_journal_refusals_total"); n < 1 {
		t.Fatalf("the deposed leader's writes were never refused: %v refusals", n)
	}
	writers := journalWriters(t, a)
	idA, idB := coordinatorID(t, a), coordinatorID(t, b)
	first := slices.Index(writers, idB)
	if first < 0 || slices.Contains(writers[first:], idA) {
		t.Fatalf("the journal after the new leader's first entry holds the deposed leader's: %v (a %s, b %s)", writers, idA, idB)
	}
	if done := b.waitDone(st.JobID, 2*time.Minute); done.State != "completed" {
		t.Fatalf("job after the leader was deposed: %+v", done)
	}
	var jobs []map[string]any
	if r := b.cli("jobs", "--json"); r.code != 0 || json.Unmarshal([]byte(r.stdout), &jobs) != nil || len(jobs) != 1 {
		t.Fatalf("jobs: the refused submission made a job: %s", r)
	}
	// Heard again, it follows: not the leader, and its answers are the new leader's records.
	if _, err := a.Coord.WaitLog(t.Context(), regexp.MustCompile(`lost the farm's leadership|no longer leading the farm`), 0, 40*time.Second); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, a.HTTP, "tilefarm_coordinator_leader", 0, 10*time.Second)
	if done := a.waitDone(st.JobID, time.Minute); done.State != "completed" {
		t.Fatalf("the deposed leader, following, does not see the job completed: %+v", done)
	}
	if slices.Contains(journalWriters(t, a)[first:], idA) {
		t.Fatal("the deposed leader wrote to the journal after it heard again")
	}
	out := filepath.Join(t.TempDir(), "d_####.png")
	if r := a.cli("outputs", st.JobID, "--out", out); r.code != 0 {
		t.Fatalf("outputs from the follower: %s", r)
	}
	for _, frame := range []int{4, 5, 6} {
		samePixels(t, frameFile(out, frame), reference(t, scene, frame, oneTile...))
	}
	b.assertNoDeadLetters()
}
