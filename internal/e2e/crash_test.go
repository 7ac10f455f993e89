//go:build linux

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/proctest"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/objstore"
	"github.com/tilefarm/tilefarm/tiles"
)

// One tile per frame and many slow passes, so a test can act in the middle of a tile.
var oneTile = []string{"--width", "64", "--height", "36", "--spp", "32", "--tile", "64"}

var slowWorker = []string{"--fault-pass-delay", "250ms", "--checkpoint-every", "0", "--passes", "16"}

// waitCheckpoint waits until the worker has checkpointed at least minSample samples.
func waitCheckpoint(t *testing.T, p *proctest.Proc, minSample int) {
	t.Helper()
	rx := regexp.MustCompile(`checkpoint saved.*next_sample=(\d+)`)
	deadline := time.Now().Add(patience * time.Minute)
	for time.Now().Before(deadline) {
		for _, m := range rx.FindAllStringSubmatch(p.Log(), -1) {
			if n, _ := strconv.Atoi(m[1]); n >= minSample {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("worker never checkpointed %d samples:\n%s", minSample, p.Log())
}

// A worker process killed with SIGKILL mid-tile; the restarted worker resumes the
// tile from its checkpoint and the frame equals the reference.
func TestWorkerKilledMidTileResumesFromCheckpoint(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	f := startServe(t, t.TempDir(), "--ack-wait", "3s", "--lease-ttl", "3s")
	ckpts := t.TempDir()
	a := f.worker("victim", ckpts, slowWorker...)
	st, r := f.submit(append([]string{scene, "--frames", "4"}, oneTile...)...)
	if r.code != 42 && r.code != 3 {
		t.Fatalf("submit: %s", r)
	}
	waitCheckpoint(t, a, 8)
	a.Kill()

	b := f.worker("successor", ckpts)
	done := f.waitDone(st.JobID, 2*time.Minute)
	if done.State != "completed" {
		t.Fatalf("job after the kill: %+v", done)
	}
	if done.SamplesRecovered < 8 {
		t.Fatalf("samples recovered %d, want at least the 8 checkpointed before the kill", done.SamplesRecovered)
	}
	if !strings.Contains(b.Log(), "resuming from checkpoint") {
		t.Fatalf("successor did not resume from the checkpoint:\n%s", b.Log())
	}
	out := filepath.Join(t.TempDir(), "k_####.png")
	if r := f.cli("outputs", st.JobID, "--out", out); r.code != 0 {
		t.Fatalf("outputs: %s", r)
	}
	samePixels(t, frameFile(out, 4), reference(t, scene, 4, oneTile...))
}

// A worker paused beyond its lease loses the tile to another worker; when it wakes
// it cannot promote anything, and its late ack loses nothing.
func TestPausedWorkerLosesLeaseAndCannotPromote(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	data := t.TempDir()
	f := startServe(t, data, "--ack-wait", "2s", "--lease-ttl", "2s")
	a := f.worker("zombie", t.TempDir(), slowWorker...)
	st, _ := f.submit(append([]string{scene, "--frames", "5"}, oneTile...)...)
	waitCheckpoint(t, a, 4)
	a.Signal(syscall.SIGSTOP)

	f.worker("rescuer", t.TempDir())
	done := f.waitDone(st.JobID, 2*time.Minute)
	if done.State != "completed" {
		t.Fatalf("job while the zombie sleeps: %+v", done)
	}
	a.Signal(syscall.SIGCONT)
	if _, err := a.WaitLog(t.Context(), regexp.MustCompile(`lease lost`), 0, 30*time.Second); err != nil {
		t.Fatalf("zombie did not notice it lost the lease: %v\n%s", err, a.Log())
	}
	time.Sleep(2 * time.Second) // anything the zombie would still do, it does now

	objects, err := objstore.NewFSStore(filepath.Join(data, "store"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tileKey := tileKeys(t, f, st.JobID)[0]
	frameKey := st.Frames[0].FrameKey
	m, err := finalize.ReadManifest(ctx, objects, layout.TileManifestKey(frameKey, tileKey))
	if err != nil {
		t.Fatal(err)
	}
	if m.Meta["worker"] != "rescuer" {
		t.Fatalf("tile manifest promoted by %q, want rescuer", m.Meta["worker"])
	}
	attempts, err := objects.List(ctx, "attempts/"+layout.TileManifestKey(frameKey, tileKey)+"/")
	if err != nil {
		t.Fatal(err)
	}
	if len(attempts) != 1 {
		t.Fatalf("zombie uploaded tile results after losing its lease: %v", attempts)
	}
	if strings.Contains(a.Log(), "tile already promoted") || regexp.MustCompile(`level=INFO msg="frame assembled"`).MatchString(a.Log()) {
		t.Fatalf("zombie acted on the tile after waking:\n%s", a.Log())
	}
	after, r := f.status(st.JobID)
	if r.code != 0 || after.TilesCompleted != after.TilesTotal {
		t.Fatalf("job after the zombie woke: %s", r)
	}
	// The frame's assembly is acked just after the frame.assembled event that completed the
	// job, so the queue empties a moment after the status says so.
	waitQueue(t, f.NATSURL(), 0)
	out := filepath.Join(t.TempDir(), "z_####.png")
	if r := f.cli("outputs", st.JobID, "--out", out); r.code != 0 {
		t.Fatalf("outputs: %s", r)
	}
	samePixels(t, frameFile(out, 5), reference(t, scene, 5, oneTile...))
}

// tileKeys derives a job's tile keys from its frames (all tests here use oneTile settings).
func tileKeys(t *testing.T, f *farmProc, job string) []string {
	t.Helper()
	st, _ := f.status(job)
	var keys []string
	for _, fr := range st.Frames {
		ft, err := tiles.FrameTiles(fr.FrameKey, 64, 36, 64)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range ft {
			keys = append(keys, x.Key)
		}
	}
	if len(keys) == 0 {
		t.Fatalf("job %s has no tiles", job)
	}
	return keys
}

// The coordinator killed with SIGKILL between writing the outbox and publishing,
// and between publishing and deleting the outbox record: nothing lost, nothing rendered twice,
// and the duplicate publish is caught and counted.
func TestCoordinatorKilledAtOutboxSeams(t *testing.T) {
	t.Parallel()
	for _, seam := range []string{"outbox-before-publish", "outbox-after-publish"} {
		t.Run(seam, func(t *testing.T) {
			scene := example("shot")
			f := startServe(t, t.TempDir(), "--fault-crash", seam)
			args := append([]string{scene, "--frames", "6-7"}, small...)
			_, r := f.submit(args...)
			if r.code != 42 && r.code != 75 {
				t.Fatalf("submit to a coordinator about to crash: %s", r)
			}
			if !f.Coord.WaitExit(30 * time.Second) {
				t.Fatalf("coordinator did not crash at %s:\n%s", seam, f.Coord.Log())
			}
			if !strings.Contains(f.Coord.Log(), "fault injection: killing coordinator") {
				t.Fatalf("coordinator exited without reaching the seam:\n%s", f.Coord.Log())
			}

			f.restart("--workers", "2")
			st, r := f.submit(args...) // the cron job re-runs submit
			if r.code == 1 || r.code == 2 || r.code == 75 {
				t.Fatalf("re-submit after the crash: %s", r)
			}
			done := f.waitDone(st.JobID, 3*time.Minute)
			if done.State != "completed" || done.TilesCompleted != done.TilesTotal {
				t.Fatalf("job after the crash: %+v", done)
			}
			if done.TileAttempts != done.TilesTotal {
				t.Fatalf("%d tile attempts for %d tiles: a tile was rendered twice", done.TileAttempts, done.TilesTotal)
			}
			if seam == "outbox-after-publish" {
				dedup := metricValue(t, f.HTTP, `tilefarm_duplicates_suppressed_total{layer="publish_dedup"}`)
				manifest := metricValue(t, f.HTTP, `tilefarm_duplicates_suppressed_total{layer="worker_manifest_check"}`)
				if dedup+manifest < 1 {
					t.Fatalf("the republished outbox record was not caught: publish_dedup %v, manifest check %v", dedup, manifest)
				}
			}
			out := filepath.Join(t.TempDir(), "c_####.png")
			if r := f.cli("outputs", st.JobID, "--out", out); r.code != 0 {
				t.Fatalf("outputs: %s", r)
			}
			for _, fr := range []int{6, 7} {
				samePixels(t, frameFile(out, fr), reference(t, scene, fr, small...))
			}
		})
	}
}

// A tile that fails in every attempt is dead-lettered once its failure budget is spent, with
// its error; the other tiles and frames complete; status exits 1 and names it.
func TestPoisonTileIsDeadLettered(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	f := startServe(t, t.TempDir(), "--max-failures", "3")
	poisoned := f.worker("w", t.TempDir(), "--fault-panic-tile", "8:32,0,64,27")
	st, _ := f.submit(append([]string{scene, "--frames", "8-9"}, small...)...)
	done := f.waitDone(st.JobID, 3*time.Minute)
	_, r := f.status(st.JobID)
	if r.code != 1 || done.State != "failed" {
		t.Fatalf("status of a job with a poison tile: want exit 1, got %s", r)
	}
	if done.FramesCompleted != 1 || done.TilesFailed != 1 || done.TilesCompleted != done.TilesTotal-1 {
		t.Fatalf("want frame 9 and every other tile completed: %+v", done)
	}
	text := f.cli("status", st.JobID)
	if !strings.Contains(text.stdout, "frame 8") || !strings.Contains(text.stdout, "(32,0)-(64,27)") || !strings.Contains(text.stdout, "injected fault") || !strings.Contains(text.stdout, "[panic]") {
		t.Fatalf("status does not name the poison tile and its error:\n%s", text)
	}
	dlq := f.cli("dlq", "list")
	if dlq.code != 0 || strings.Count(dlq.stdout, "tiles.render") != 1 || !strings.Contains(dlq.stdout, "injected fault") {
		t.Fatalf("dlq list: %s", dlq)
	}
	// Exactly --max-failures attempts were made.
	if done.TileAttempts != done.TilesTotal-1+3 {
		t.Fatalf("tile attempts %d, want %d (each tile once, the poison tile 3 times)", done.TileAttempts, done.TilesTotal-1+3)
	}
	out := filepath.Join(t.TempDir(), "p_####.png")
	r = f.cli("outputs", st.JobID, "--out", out)
	if r.code != 1 || !strings.Contains(r.stderr, "1 of 2 frames") {
		t.Fatalf("outputs of a half-failed job: %s", r)
	}
	samePixels(t, frameFile(out, 9), reference(t, scene, 9, small...))

	// The operator fixes the cause (a healthy worker) and requeues the dead letter: the frame
	// recovers and the job completes.
	poisoned.Kill()
	f.worker("healthy", t.TempDir())
	seq := strings.Fields(strings.Split(dlq.stdout, "\n")[1])[0]
	if r := f.cli("dlq", "requeue", seq); r.code != 0 {
		t.Fatalf("dlq requeue %s: %s", seq, r)
	}
	healed := f.waitCode(st.JobID, 0, 2*time.Minute)
	if healed.FramesCompleted != 2 || healed.TilesFailed != 0 || healed.State != "completed" {
		t.Fatalf("job after requeue: %+v", healed)
	}
	if r := f.cli("dlq", "list"); strings.Contains(r.stdout, "tiles.render") {
		t.Fatalf("dead letter still listed after requeue: %s", r)
	}
	if r := f.cli("outputs", st.JobID, "--out", out); r.code != 0 {
		t.Fatalf("outputs after requeue: %s", r)
	}
	samePixels(t, frameFile(out, 8), reference(t, scene, 8, small...))
}

// The coordinator (and with it the embedded JetStream) killed with SIGKILL mid-render and
// started again: the worker reconnects, the coordinator catches up from EVENTS, nothing is
// lost and the frames equal the reference.
func TestCoordinatorKilledMidRender(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	f := startServe(t, t.TempDir(), "--ack-wait", "3s", "--lease-ttl", "3s")
	w := f.worker("survivor", t.TempDir(), "--fault-pass-delay", "40ms")
	st, _ := f.submit(append([]string{scene, "--frames", "12-13"}, small...)...)
	deadline := time.Now().Add(60 * time.Second)
	for {
		s, _ := f.status(st.JobID)
		if s.TilesCompleted >= 2 && s.TilesCompleted < s.TilesTotal {
			break
		}
		if s.TilesCompleted == s.TilesTotal || time.Now().After(deadline) {
			t.Fatalf("could not catch the job mid-render: %+v", s)
		}
		time.Sleep(50 * time.Millisecond)
	}
	f.Coord.Kill()
	time.Sleep(2 * time.Second) // the worker keeps going without its coordinator
	f.restart()
	done := f.waitCode(st.JobID, 0, 2*time.Minute)
	if done.TilesCompleted != done.TilesTotal || done.TilesFailed != 0 {
		t.Fatalf("job after the coordinator restart: %+v", done)
	}
	if !strings.Contains(w.Log(), "worker started") {
		t.Fatalf("worker log:\n%s", w.Log())
	}
	out := filepath.Join(t.TempDir(), "m_####.png")
	if r := f.cli("outputs", st.JobID, "--out", out); r.code != 0 {
		t.Fatalf("outputs: %s", r)
	}
	for _, fr := range []int{12, 13} {
		samePixels(t, frameFile(out, fr), reference(t, scene, fr, small...))
	}
}

// Property (never loses work): a job whose tile messages vanished from TILES unrendered (a
// purge here; an OS crash of an unsynced JetStream server in life) still completes, equal to
// the reference: the reconciler finds the tiles nothing can deliver and dispatches them again.
// The loss lands on work in progress: no worker has taken a tile when the stream is purged.
func TestLostTileMessagesAreDispatchedAgain(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	f := startServe(t, t.TempDir(), "--reconcile-every", "1s")
	st, r := f.submit(append([]string{scene, "--frames", "11"}, small...)...)
	if r.code != 42 {
		t.Fatalf("submit: %s", r)
	}
	js := f.js()
	tilesStream, err := js.Stream(t.Context(), queue.StreamTiles)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		info, err := tilesStream.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs == uint64(st.TilesTotal) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of the job's %d tiles in TILES after 30 s", info.State.Msgs, st.TilesTotal)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := tilesStream.Purge(t.Context()); err != nil {
		t.Fatal(err)
	}
	if now, _ := f.status(st.JobID); now.TilesCompleted != 0 {
		t.Fatalf("%d tiles completed before any worker ran", now.TilesCompleted)
	}
	f.worker("w", t.TempDir())
	if done := f.waitDone(st.JobID, 2*time.Minute); done.State != api.JobCompleted {
		t.Fatalf("job after its tiles were lost: %+v\n%s", done, f.Coord.Log())
	}
	if log := f.Coord.Log(); !strings.Contains(log, "tiles lost from the queue") || !strings.Contains(log, fmt.Sprintf("tiles=%d", st.TilesTotal)) {
		t.Fatalf("the coordinator never said it dispatched the %d lost tiles again:\n%s", st.TilesTotal, log)
	}
	out := filepath.Join(t.TempDir(), "l_####.png")
	if r := f.cli("outputs", st.JobID, "--out", out); r.code != 0 {
		t.Fatalf("outputs: %s", r)
	}
	samePixels(t, frameFile(out, 11), reference(t, scene, 11, small...))
}
