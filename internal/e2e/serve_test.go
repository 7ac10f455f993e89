//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/natstest"
)

// tilesInQueue reads the TILES stream depth straight from the farm's JetStream.
func tilesInQueue(t *testing.T, natsURL string) uint64 {
	t.Helper()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, "TILES")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// waitQueue waits until TILES holds n messages (the outbox relay publishes asynchronously).
func waitQueue(t *testing.T, natsURL string, n uint64) {
	t.Helper()
	deadline := time.Now().Add(patience * 20 * time.Second)
	for tilesInQueue(t, natsURL) != n {
		if time.Now().After(deadline) {
			t.Fatalf("TILES holds %d messages, want %d", tilesInQueue(t, natsURL), n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Idempotent submit, conflicts, and the exit-code contract.
func TestServeIdempotencyAndExitCodes(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	f := startServe(t, t.TempDir())
	args := append([]string{scene, "--frames", "1-2"}, small...)

	st, r := f.submit(args...)
	if r.code != 42 || st.State != "queued" || st.JobID == "" {
		t.Fatalf("first submit with no workers: want exit 42 and queued, got %s", r)
	}
	waitQueue(t, f.NATSURL(), 12)

	st2, r := f.submit(args...)
	if r.code != 42 || st2.JobID != st.JobID {
		t.Fatalf("second submit: want exit 42 and job %s, got %s", st.JobID, r)
	}
	time.Sleep(1500 * time.Millisecond) // give a wrongly enqueued duplicate time to show up
	waitQueue(t, f.NATSURL(), 12)

	keyed := append([]string{"--idempotency-key", "nightly-42"}, args...)
	if _, r := f.submit(keyed...); r.code != 42 {
		t.Fatalf("submit with a key: %s", r)
	}
	_, r = f.submit(append(keyed, "--spp", "9")...)
	if r.code != 1 || !strings.Contains(r.stderr, "conflict") {
		t.Fatalf("same key, different payload: want exit 1 and a conflict message, got %s", r)
	}

	if _, r := f.status(st.JobID); r.code != 42 {
		t.Fatalf("status while queued: want 42, got %s", r)
	}
	if r := f.cli("status", "job-doesnotexist"); r.code != 1 || !strings.Contains(r.stderr, "no job") {
		t.Fatalf("status of an unknown job: %s", r)
	}
	if r := f.cli("status"); r.code != 2 {
		t.Fatalf("status without a job: want 2, got %s", r)
	}
	if r := f.cli("submit", scene, "--frames", "3-1"); r.code != 1 || !strings.Contains(r.stderr, "reversed") {
		t.Fatalf("reversed frames: want exit 1, got %s", r)
	}
	if r := f.cli("submit", scene, "--tile", "0"); r.code != 2 {
		t.Fatalf("bad --tile: want exit 2, got %s", r)
	}
	if r := run(t, "coordinator", "status", st.JobID, "--server", freePort(t)); r.code != 75 {
		t.Fatalf("status against an unreachable coordinator: want 75, got %s", r)
	}

	// A slow worker, so the job is observably in progress before it completes.
	f.worker("w1", t.TempDir(), "--fault-pass-delay", "100ms", "--checkpoint-every", "0")
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, r := f.status(st.JobID)
		if r.code == 3 {
			break
		}
		if r.code != 42 || time.Now().After(deadline) {
			t.Fatalf("status once a worker runs: want 42 then 3, got %s", r)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r := f.cli("watch", st.JobID, "--json"); r.code != 0 || !strings.Contains(r.stdout, `"state": "completed"`) {
		t.Fatalf("watch: %s", r)
	}
	done := f.waitDone(st.JobID, 3*time.Minute)
	if _, r := f.status(st.JobID); r.code != 0 || done.State != "completed" {
		t.Fatalf("status when completed: want 0, got %s", r)
	}
	if done.TileAttempts != done.TilesTotal {
		t.Fatalf("tile attempts %d for %d tiles: some tile was rendered twice", done.TileAttempts, done.TilesTotal)
	}
	// A re-submission of a finished job exits 0 at once and renders nothing.
	st3, r := f.submit(args...)
	if r.code != 0 || st3.TilesReused != st3.TilesTotal || st3.TilesRendered != 0 {
		t.Fatalf("re-submit of a completed job: %s", r)
	}

	// outputs downloads verified frames equal to the reference.
	out := filepath.Join(t.TempDir(), "o_####.png")
	if r := f.cli("outputs", st.JobID, "--out", out); r.code != 0 {
		t.Fatalf("outputs: %s", r)
	}
	for _, fr := range []int{1, 2} {
		samePixels(t, frameFile(out, fr), reference(t, scene, fr, small...))
	}
	if r := f.cli("jobs"); r.code != 0 || !strings.Contains(r.stdout, st.JobID) {
		t.Fatalf("jobs: %s", r)
	}

	// A coordinator on an external NATS URL with credentials never logs them, and SIGTERM stops
	// both coordinators cleanly.
	g := newFarm(t, t.TempDir())
	g.Store = f.Store
	g.restart("--nats", "nats://tilefarm:S3CRET-PASSWORD@"+f.NATSListen)
	for _, c := range []*farmProc{g, f} {
		c.Coord.Signal(syscall.SIGTERM)
		if !c.Coord.WaitExit(15 * time.Second) {
			t.Fatalf("coordinator did not stop on SIGTERM:\n%s", c.Coord.Log())
		}
		if code := c.Coord.ExitCode(); code != 0 {
			t.Fatalf("coordinator exited %d on SIGTERM:\n%s", code, c.Coord.Log())
		}
	}
	if strings.Contains(g.Coord.Log(), "S3CRET") || !strings.Contains(g.Coord.Log(), "REDACTED") {
		t.Fatalf("credentials in the coordinator log:\n%s", g.Coord.Log())
	}
}

// Property: --server takes several addresses: a command goes to the next while one does not
// answer (a coordinator's machine is gone), a submission sent again there is the same job, and
// with no address answering the command says so for each and exits 75.
func TestCommandsTryTheNextServerAddress(t *testing.T) {
	t.Parallel()
	f := startServe(t, t.TempDir())
	down := "http://" + freePort(t) // nothing listens there
	both := down + ",http://" + f.HTTP
	args := append([]string{"submit", example("shot"), "--frames", "1", "--json", "--server", both}, small...)
	r := run(t, "coordinator", args...)
	var st api.Status
	if r.code != 42 || json.Unmarshal([]byte(r.stdout), &st) != nil || st.JobID == "" {
		t.Fatalf("submit with an unreachable first address: want exit 42 and the job, got %s", r)
	}
	again := run(t, "coordinator", append(args[:len(args):len(args)], "--server", "http://"+f.HTTP+","+down)...)
	var st2 api.Status
	if again.code != 42 || json.Unmarshal([]byte(again.stdout), &st2) != nil || st2.JobID != st.JobID {
		t.Fatalf("the same submission at the other address first: want job %s, got %s", st.JobID, again)
	}
	if r := run(t, "coordinator", "status", st.JobID, "--server", both); r.code != 42 {
		t.Fatalf("status with an unreachable first address: want 42, got %s", r)
	}
	other := "http://" + freePort(t)
	r = run(t, "coordinator", "status", st.JobID, "--server", down+","+other)
	if r.code != 75 || !strings.Contains(r.stderr, down) || !strings.Contains(r.stderr, other) {
		t.Fatalf("status with no address answering: want exit 75 naming both, got %s", r)
	}
	waitQueue(t, f.NATSURL(), 6) // one frame's tiles: the job was made once
}

// Property: one coordinator of a farm leads it, through the farm's leadership lease: the
// leader killed and restarted on its data takes its own lease back at once; a second
// coordinator on the same JetStream finds it held, says which coordinator leads and does not
// count itself leader; once the leader's process is killed, the other takes the lease within
// the lease TTL (tilefarm_coordinator_leader, docs/design.md "Leadership").
func TestOneCoordinatorLeadsTheFarm(t *testing.T) {
	t.Parallel()
	nats := natstest.Start(t)
	a := startServeNATS(t, t.TempDir(), nats.URL(), "--lease-ttl", "15s")
	waitMetric(t, a.HTTP, "tilefarm_coordinator_leader", 1, 10*time.Second)
	a.restart("--lease-ttl", "15s") // kill -9, then the same data: its lease lives on for 15 s
	waitMetric(t, a.HTTP, "tilefarm_coordinator_leader", 1, 10*time.Second)
	if log := a.Coord.Log(); !strings.Contains(log, "leading the farm again after a restart") || strings.Contains(log, "another coordinator leads") {
		t.Fatalf("the restarted leader did not take its own lease back at once:\n%s", log)
	}
	b := startServeNATS(t, t.TempDir(), nats.URL(), "--lease-ttl", "15s")
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(b.Coord.Log(), "another coordinator leads this farm"); {
		if time.Now().After(deadline) {
			t.Fatalf("the second coordinator did not say another leads:\n%s", b.Coord.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(b.Coord.Log(), a.HTTP) {
		t.Fatalf("the second coordinator does not name the leader %s:\n%s", a.HTTP, b.Coord.Log())
	}
	if v := metricValue(t, b.HTTP, "tilefarm_coordinator_leader"); v != 0 {
		t.Fatalf("the second coordinator counts itself leader: %v", v)
	}
	// What the monitor's workers page shows of the leader, asked of each coordinator.
	for _, c := range []struct {
		f    *farmProc
		this bool
	}{{a, true}, {b, false}} {
		resp, err := http.Get("http://" + c.f.HTTP + "/v1/workers")
		if err != nil {
			t.Fatal(err)
		}
		var ws api.WorkersResponse
		err = json.NewDecoder(resp.Body).Decode(&ws)
		resp.Body.Close()
		if err != nil || ws.Leader == nil || ws.Leader.Address != "http://"+a.HTTP || ws.Leader.This != c.this {
			t.Fatalf("GET /v1/workers at %s: leader %+v (%v), want %s, this %v", c.f.HTTP, ws.Leader, err, a.HTTP, c.this)
		}
	}
	if v := metricValue(t, a.HTTP, "tilefarm_coordinator_leader"); v != 1 {
		t.Fatalf("the first coordinator stopped leading while it renews: %v", v)
	}
	a.Coord.Kill()
	waitMetric(t, b.HTTP, "tilefarm_coordinator_leader", 1, 30*time.Second)
}

// waitMetric waits until the metric reads want.
func waitMetric(t *testing.T, addr, name string, want float64, within time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(within); metricValue(t, addr, name) != want; {
		if time.Now().After(deadline) {
			t.Fatalf("%s at %s is %v, want %v within %v", name, addr, metricValue(t, addr, name), want, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
