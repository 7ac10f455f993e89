//go:build linux

package e2e

// Manifests are the truth (docs/design.md): the recovery paths that could strand a job or
// report it failed, each on real processes and a real JetStream, each checking that its
// fault hit work in progress, and each ending with the job completed without an operator,
// nothing dead-lettered, no tile rendered twice and frames equal to the reference.

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/checkpoint"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/natstest"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/objstore"
)

// outputsEqualReference downloads a job's frames and compares each with a local reference.
func outputsEqualReference(t *testing.T, f *farmProc, job, scene string, frames []int, settings ...string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "o_####.png")
	if r := f.cli("outputs", job, "--out", out); r.code != 0 {
		t.Fatalf("outputs: %s", r)
	}
	for _, fr := range frames {
		samePixels(t, frameFile(out, fr), reference(t, scene, fr, settings...))
	}
}

// countLines counts log lines matching re.
func countLines(log, re string) int { return len(regexp.MustCompile(re).FindAllString(log, -1)) }

// Nothing promoted is failed: a worker promotes a tile on the last delivery the safety net allows and dies
// before announcing it. The next delivery finds the message's deliveries all lost, and before
// dead-lettering it the worker finds the manifest: the tile is recorded done, not dead, and the
// job completes.
func TestPromotedOnLastDeliveryThenKilled(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	f := startServe(t, t.TempDir(), "--ack-wait", "2s", "--lease-ttl", "2s", "--max-deliver", "1")
	victim := f.worker("victim", t.TempDir(), "--fault-crash", "after-manifest")
	st, _ := f.submit(append([]string{scene, "--frames", "2"}, oneTile...)...)
	if !victim.WaitExit(time.Minute) || !strings.Contains(victim.Log(), "seam=after-manifest") {
		t.Fatalf("the worker did not die at the after-manifest seam:\n%s", victim.Log())
	}
	if mid, _ := f.status(st.JobID); mid.State == "completed" || mid.TilesCompleted != 0 {
		t.Fatalf("the kill did not hit work in progress: %+v", mid)
	}
	survivor := f.worker("survivor", t.TempDir())
	done := f.waitDone(st.JobID, 2*time.Minute)
	if done.State != "completed" || done.TilesFailed != 0 {
		t.Fatalf("job after the kill: %+v", done)
	}
	if !strings.Contains(survivor.Log(), "max deliveries exceeded") || !strings.Contains(survivor.Log(), "after its work was promoted; completing it") {
		t.Fatalf("the message never ran out of deliveries:\n%s", survivor.Log())
	}
	f.assertNoDeadLetters()
	if strings.Contains(survivor.Log(), "checkpoint saved") || done.TileAttempts != 1 {
		t.Fatalf("the promoted tile was rendered again (%d attempts):\n%s", done.TileAttempts, survivor.Log())
	}
	outputsEqualReference(t, f, st.JobID, scene, []int{2}, oneTile...)
}

// Outages are no failures: publishing tile.completed fails on the last allowed delivery. An outage of NATS
// is retried in place, never a failure of the tile: the job completes, nothing is failed.
func TestCompletionEventPublishFailsOnLastDelivery(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	f := startServe(t, t.TempDir(), "--ack-wait", "2s", "--lease-ttl", "2s", "--max-deliver", "1", "--max-failures", "1")
	w := f.worker("flaky", t.TempDir(), "--fault-fail-publish", "tile.completed:3")
	st, _ := f.submit(append([]string{scene, "--frames", "3"}, oneTile...)...)
	done := f.waitDone(st.JobID, 2*time.Minute)
	if done.State != "completed" || done.TilesFailed != 0 {
		t.Fatalf("job after failing completion publishes: %+v", done)
	}
	if !strings.Contains(w.Log(), `op="publishing completion event"`) || !strings.Contains(w.Log(), "injected fault") {
		t.Fatalf("the injected publish failures never hit the tile's completion:\n%s", w.Log())
	}
	f.assertNoDeadLetters()
	outputsEqualReference(t, f, st.JobID, scene, []int{3}, oneTile...)
}

// A worker's own failure events are retried like its completions: the publishes of tile.failed
// fail twice for a tile that panics in every attempt (one failure allowed), and the coordinator
// still learns it was dead-lettered: the job fails, naming the tile, instead of waiting for it.
func TestFailureEventPublishIsRetried(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	f := startServe(t, t.TempDir(), "--max-failures", "1")
	w := f.worker("flaky", t.TempDir(), "--fault-panic-tile", "3:0,0,64,36", "--fault-fail-publish", "tile.failed:2")
	st, _ := f.submit(append([]string{scene, "--frames", "3"}, oneTile...)...)
	done := f.waitDone(st.JobID, 2*time.Minute)
	if done.State != "failed" || done.TilesFailed != 1 {
		t.Fatalf("job whose tile was dead-lettered while its failure event's publishes failed: %+v", done)
	}
	if !strings.Contains(w.Log(), `op="publishing failure event"`) || !strings.Contains(w.Log(), "injected fault") {
		t.Fatalf("the injected publish failures never hit the tile's failure event:\n%s", w.Log())
	}
}

// Re-assembly ids are unique per request: other formats of a finished frame asked for back to back, the second while the
// first re-assembly is queued or running. Each re-assembly has a dedup id of its own, so both
// complete; and the job that finished first stays completed throughout.
func TestBackToBackReassembliesNeverRegressAFinishedJob(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	f := startServe(t, t.TempDir())
	f.worker("w", t.TempDir())
	args := append([]string{scene, "--frames", "4"}, small...)
	first, _ := f.submit(args...)
	if done := f.waitDone(first.JobID, time.Minute); done.State != "completed" {
		t.Fatalf("png job: %+v", done)
	}
	exrJob, r := f.submit(append(args, "--format", "exr")...)
	if r.code != 3 && r.code != 42 {
		t.Fatalf("exr submission: %s", r)
	}
	png16Job, r := f.submit(append(args, "--format", "png16")...)
	if r.code != 3 && r.code != 42 && r.code != 0 {
		t.Fatalf("png16 submission: %s", r)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		if st, r := f.status(first.JobID); r.code != 0 {
			t.Fatalf("the finished png job regressed to %s (exit %d) while other formats assembled", st.State, r.code)
		}
		_, r1 := f.status(exrJob.JobID)
		_, r2 := f.status(png16Job.JobID)
		if r1.code == 0 && r2.code == 0 {
			break
		}
		if r1.code == 1 || r2.code == 1 || time.Now().After(deadline) {
			t.Fatalf("re-assemblies did not both complete: exr %s, png16 %s", r1, r2)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := countLines(f.Coord.Log(), `publish deduplicated`); n != 0 {
		t.Fatalf("%d publishes were swallowed by the dedup window", n)
	}
	dir := t.TempDir()
	exr := filepath.Join(dir, "e_####.exr")
	if r := f.cli("outputs", exrJob.JobID, "--out", exr); r.code != 0 {
		t.Fatalf("outputs exr: %s", r)
	}
	refEXR := filepath.Join(dir, "ref.exr")
	if r := run(t, "tileworker", append([]string{"render", scene, "--frame", "4", "--out", refEXR, "-q"}, small...)...); r.code != 0 {
		t.Fatalf("reference exr: %s", r)
	}
	sameEXR(t, frameFile(exr, 4), refEXR)
	png16 := filepath.Join(dir, "p_####.png")
	if r := f.cli("outputs", png16Job.JobID, "--out", png16, "--format", "png16"); r.code != 0 {
		t.Fatalf("outputs png16: %s", r)
	}
	ref16 := filepath.Join(dir, "ref16.png")
	if r := run(t, "tileworker", append([]string{"render", scene, "--frame", "4", "--out", ref16, "--format", "png16", "-q"}, small...)...); r.code != 0 {
		t.Fatalf("reference png16: %s", r)
	}
	samePixels(t, frameFile(png16, 4), ref16)
}

// A live lease is waited for, however long: a tile that renders for longer than two lease TTLs, with a duplicate
// of its message delivered meanwhile (as after a relay crash past the dedup window). The
// duplicate waits while the holder renews its lease, however long, and is acked once the
// holder promotes: no delivery spent, nothing dead-lettered, the tile rendered once.
func TestDuplicateOfALongTileWaitsForTheHolder(t *testing.T) {
	t.Parallel() // its own farm on free ports; most of its time is waiting
	scene := example("shot")
	const ttl = 2 * time.Second
	f := startServe(t, t.TempDir(), "--ack-wait", ttl.String(), "--lease-ttl", ttl.String(), "--max-deliver", "2", "--max-failures", "1")
	holder := f.worker("holder", t.TempDir(), "--fault-pass-delay", "600ms", "--passes", "16", "--checkpoint-every", "0")
	st, _ := f.submit(append([]string{scene, "--frames", "5"}, oneTile...)...)
	waitCheckpoint(t, holder, 2)

	ctx := context.Background()
	js := f.js()
	tilesStream, err := js.Stream(ctx, queue.StreamTiles)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := tilesStream.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, queue.SubjectRender, raw.Data, jetstream.WithMsgID("duplicate")); err != nil {
		t.Fatal(err)
	}
	dupStart := time.Now()
	dup := f.worker("duplicate", t.TempDir())
	done := f.waitDone(st.JobID, 2*time.Minute)
	if done.State != "completed" || done.TilesFailed != 0 {
		t.Fatalf("job with a duplicate of its long tile: %+v", done)
	}
	if waited := time.Since(dupStart); waited < 2*ttl {
		t.Fatalf("the duplicate waited only %v, less than two lease TTLs: the tile was not long enough to test this", waited)
	}
	promoted := regexp.MustCompile("tile promoted by the lease holder; acking duplicate delivery")
	if _, err := dup.WaitLog(t.Context(), promoted, 0, 30*time.Second); err != nil || !strings.Contains(dup.Log(), "tile leased by another worker; waiting") {
		t.Fatalf("the duplicate did not wait for the holder (%v):\n%s", err, dup.Log())
	}
	if strings.Contains(dup.Log(), "checkpoint saved") {
		t.Fatalf("the duplicate rendered the tile again:\n%s", dup.Log())
	}
	f.assertNoDeadLetters()
	outputsEqualReference(t, f, st.JobID, scene, []int{5}, oneTile...)
}

// Handbacks are no failures: a tile handed back twice by SIGTERM, with a failure budget of one. A
// handback is no failure: the tile resumes from its checkpoint each time and completes.
func TestHandbacksAreNoFailures(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	f := startServe(t, t.TempDir(), "--ack-wait", "30s", "--lease-ttl", "30s", "--max-failures", "1")
	st, _ := f.submit(append([]string{scene, "--frames", "6"}, oneTile...)...)
	ckpts := t.TempDir()
	for i, min := range []int{4, 8} {
		w := f.worker(fmt.Sprintf("leaver-%d", i), ckpts, slowWorker...)
		waitCheckpoint(t, w, min)
		w.Signal(syscall.SIGTERM)
		if !w.WaitExit(15 * time.Second) {
			t.Fatalf("worker did not exit on SIGTERM:\n%s", w.Log())
		}
		if !strings.Contains(w.Log(), "shutting down: returning the job to the queue") {
			t.Fatalf("worker %d did not hand the tile back:\n%s", i, w.Log())
		}
	}
	if mid, _ := f.status(st.JobID); mid.State == "completed" {
		t.Fatalf("the handbacks did not hit work in progress: %+v", mid)
	}
	f.worker("finisher", ckpts)
	done := f.waitDone(st.JobID, time.Minute)
	if done.State != "completed" || done.SamplesRecovered < 8 || done.TileAttempts != 3 {
		t.Fatalf("job after two handbacks: %+v", done)
	}
	f.assertNoDeadLetters()
	outputsEqualReference(t, f, st.JobID, scene, []int{6}, oneTile...)
}

// No delivery is lost to latency: a render node 100 ms (round trip) away from NATS, taking work that trickles in
// while it idles. Its idle pulls wait with the server's own expiry, so no delivery is lost to
// latency: in a clean run every tile and assembly is delivered exactly once.
func TestNoDeliveryLostToLatency(t *testing.T) {
	t.Parallel() // its own farm on free ports; most of its time is waiting
	scene := example("shot")
	f := startServe(t, t.TempDir(), "--ack-wait", "3s", "--lease-ttl", "3s")
	proxy := delayProxy(t, f.NATSListen, 50*time.Millisecond) // 100 ms round trip
	w := startEnv(t, f.Env, "tileworker", "--nats", "nats://"+proxy, "--store", f.Store, "--checkpoints", t.TempDir(),
		"--name", "far", "--concurrency", "1", "--log-level", "debug")
	quick := []string{"--width", "32", "--height", "18", "--spp", "2", "--tile", "32"}
	const jobs = 16
	var ids []string
	for i := 1; i <= jobs; i++ {
		time.Sleep(350 * time.Millisecond) // the worker idles, pulling, when each job arrives
		st, r := f.submit(append([]string{scene, "--frames", fmt.Sprint(i)}, quick...)...)
		if r.code != 42 && r.code != 3 && r.code != 0 {
			t.Fatalf("submit %d: %s", i, r)
		}
		ids = append(ids, st.JobID)
	}
	for _, id := range ids {
		if done := f.waitDone(id, 2*time.Minute); done.State != "completed" || done.TileAttempts != done.TilesTotal {
			t.Fatalf("job %s through the slow link: %+v", id, done)
		}
	}
	ctx := context.Background()
	tiles, err := f.js().Stream(ctx, queue.StreamTiles)
	if err != nil {
		t.Fatal(err)
	}
	var delivered, redelivered [2]uint64 // tiles and assemblies, over every pool's consumers
	lister := tiles.ListConsumers(ctx)
	for info := range lister.Info() {
		kind := 0
		if queue.IsAssembleSubject(info.Config.FilterSubject) {
			kind = 1
		}
		delivered[kind] += info.Delivered.Consumer
		redelivered[kind] += uint64(info.NumRedelivered)
	}
	if err := lister.Err(); err != nil {
		t.Fatal(err)
	}
	for kind, what := range []string{"tiles", "assemblies"} {
		if delivered[kind] < jobs || redelivered[kind] != 0 {
			t.Fatalf("%s: %d deliveries, %d redelivered; want %d delivered once each", what, delivered[kind], redelivered[kind], jobs)
		}
	}
	if n := countLines(w.Log(), `delivery=[2-9]`); n != 0 {
		t.Fatalf("%d log lines of a redelivery in a clean run:\n%s", n, w.Log())
	}
	outputsEqualReference(t, f, ids[0], scene, []int{1}, quick...)
}

// waitRemoteCheckpoint waits until a tile's remote checkpoint in the farm's filesystem store
// holds at least minSample samples.
func waitRemoteCheckpoint(t *testing.T, f *farmProc, tileKey string, minSample int) {
	t.Helper()
	objects, err := objstore.NewFSStore(filepath.Join(f.Data, "store"))
	if err != nil {
		t.Fatal(err)
	}
	codec, err := checkpoint.NewCodec()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(patience * time.Minute)
	for time.Now().Before(deadline) {
		if data, err := objects.Get(context.Background(), layout.CheckpointKey(tileKey)); err == nil {
			if c, err := codec.Decode(data); err == nil && c.Next >= minSample {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no remote checkpoint of tile %s with %d samples", tileKey, minSample)
}

// busyShot is 2 frames of 2,500 tiles: 10,000 tile events and then some.
var busyShot = []string{"--width", "400", "--height", "400", "--spp", "1", "--tile", "8", "--frames", "1-2"}

// purgedShot is 2 frames of 625 tiles, for the reconciler, which reads manifests, not events.
var purgedShot = []string{"--width", "200", "--height", "200", "--spp", "1", "--tile", "8", "--frames", "1-2"}

// runBusyShot renders shot on a farm on its own NATS server with two workers, the coordinator
// killed once every tile is queued and restarted only once the workers are done, so every one
// of their events (at least minEvents) waits unapplied; with purgeEvents, those events are
// purged before the restart too.
func runBusyShot(t *testing.T, shot []string, minEvents uint64, purgeEvents bool) (jobStatus func() string, f *farmProc, job string) {
	t.Helper()
	scene := example("shot")
	ns := natstest.Start(t)
	f = startServeNATS(t, t.TempDir(), ns.URL(), "--reconcile-every", "1h")
	st, _ := f.submit(append([]string{scene}, shot...)...)
	ctx := context.Background()
	js := f.js()
	waitStream(t, js, queue.StreamTiles, uint64(st.TilesTotal))
	f.Coord.Kill()
	for i := range 2 {
		f.worker(fmt.Sprintf("w%d", i), t.TempDir(), "--concurrency", "2", "--log-level", "warn")
	}
	waitStream(t, js, queue.StreamTiles, 0)
	cons, err := js.Consumer(ctx, queue.StreamEvents, "coordinator")
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumPending < minEvents {
		t.Fatalf("only %d events wait unapplied; the kill must leave at least %d", info.NumPending, minEvents)
	}
	t.Logf("%d events wait unapplied", info.NumPending)
	if purgeEvents {
		s, err := js.Stream(ctx, queue.StreamEvents)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Purge(ctx); err != nil {
			t.Fatal(err)
		}
	}
	f.restart("--reconcile-every", "1h")
	return func() string { return statusSummary(f.waitDone(st.JobID, 4*time.Minute)) }, f, st.JobID
}

// statusSummary is what a job's status says of how it went, for comparing two runs.
func statusSummary(st api.Status) string {
	if len(st.Failures) == 0 {
		st.Failures = nil // none, however the wire spelled it
	}
	b, _ := json.Marshal(map[string]any{"state": st.State, "frames_completed": st.FramesCompleted,
		"tiles_completed": st.TilesCompleted, "tiles_total": st.TilesTotal, "tiles_failed": st.TilesFailed,
		"tile_attempts": st.TileAttempts, "samples_recovered": st.SamplesRecovered, "failures": st.Failures})
	return string(b)
}

// waitStream waits until a stream holds n messages.
func waitStream(t *testing.T, js jetstream.JetStream, stream string, n uint64) {
	t.Helper()
	ctx := context.Background()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(4 * time.Minute)
	for {
		info, err := s.Info(ctx)
		if err == nil && info.State.Msgs == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s holds %d messages, want %d", stream, info.State.Msgs, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The coordinator killed with more than 10,000 unapplied events and restarted ends with the
// status of an uninterrupted run of the same job: completed, every tile rendered once (no
// worker died), nothing failed, recovered or retried.
func TestCoordinatorCatchesUpTenThousandEvents(t *testing.T) {
	t.Parallel()
	got, f, job := runBusyShot(t, busyShot, 10000, false)
	tiles := 2 * (400 / 8) * (400 / 8) // busyShot: two frames of 400x400 in 8 px tiles
	wantStatus := statusSummary(api.Status{State: api.JobCompleted, FramesCompleted: 2, TilesCompleted: tiles,
		TilesTotal: tiles, TileAttempts: tiles})
	if gotStatus := got(); gotStatus != wantStatus {
		t.Fatalf("status after catching up:\n %s\nuninterrupted:\n %s", gotStatus, wantStatus)
	}
	outputsEqualReference(t, f, job, example("shot"), []int{1, 2}, busyShot[:6]...)
}

// The reconciler alone, with every event purged, completes a job whose tiles are all promoted.
func TestReconcilerAloneCompletesAJob(t *testing.T) {
	t.Parallel()
	got, f, job := runBusyShot(t, purgedShot, 2500, true)
	status := got()
	if !strings.Contains(status, `"state":"completed"`) || !strings.Contains(status, `"tiles_failed":0`) {
		t.Fatalf("job after its events were purged: %s", status)
	}
	if !strings.Contains(f.Coord.Log(), "reconciled with manifests") {
		t.Fatalf("the reconciler did not find the promoted tiles:\n%s", f.Coord.Log())
	}
	outputsEqualReference(t, f, job, example("shot"), []int{1, 2}, purgedShot[:6]...)
}

// A farm on a shared filesystem store keeps remote checkpoints too: a tile killed on one node
// resumes on another whose checkpoint directory is empty.
func TestFileStoreFarmResumesOnAnotherNode(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	f := startServe(t, t.TempDir(), "--ack-wait", "2s", "--lease-ttl", "2s")
	a := f.worker("node-a", t.TempDir(), append(slowWorker, "--remote-checkpoint-every", "0")...)
	st, _ := f.submit(append([]string{scene, "--frames", "7"}, oneTile...)...)
	waitRemoteCheckpoint(t, f, tileKeys(t, f, st.JobID)[0], 8)
	a.Kill()
	if mid, _ := f.status(st.JobID); mid.State == "completed" {
		t.Fatalf("the kill did not hit work in progress: %+v", mid)
	}
	b := f.worker("node-b", t.TempDir())
	done := f.waitDone(st.JobID, 2*time.Minute)
	if done.State != "completed" || done.SamplesRecovered < 8 {
		t.Fatalf("job after the kill: %+v (want at least the 8 samples checkpointed)", done)
	}
	if !strings.Contains(b.Log(), "resuming from checkpoint") {
		t.Fatalf("node-b did not resume from the remote checkpoint:\n%s", b.Log())
	}
	outputsEqualReference(t, f, st.JobID, scene, []int{7}, oneTile...)
}
