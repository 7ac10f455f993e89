//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/miniotest"
	"github.com/tilefarm/tilefarm/internal/proctest"
	"github.com/tilefarm/tilefarm/objstore"
	"github.com/tilefarm/tilefarm/raster"
)

func s3Store(t *testing.T, m *miniotest.Server) objstore.Store {
	t.Helper()
	s, err := objstore.NewS3Store(context.Background(), m.Endpoint, m.Bucket, false, m.AccessKey, m.SecretKey)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func frameFile(pattern string, frame int) string {
	return strings.Replace(pattern, "####", fmt.Sprintf("%04d", frame), 1)
}

// sameEXR asserts two EXR files hold bit-identical float pixels.
func sameEXR(t *testing.T, got, want string) {
	t.Helper()
	read := func(p string) *raster.Frame {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		f, err := raster.DecodeEXR(data)
		if err != nil {
			t.Fatalf("decoding %s: %v", p, err)
		}
		return f
	}
	a, b := read(got), read(want)
	if a.Width != b.Width || a.Height != b.Height {
		t.Fatalf("%s is %dx%d, reference %dx%d", got, a.Width, a.Height, b.Width, b.Height)
	}
	for i := range a.Pix {
		if math.Float32bits(a.Pix[i]) != math.Float32bits(b.Pix[i]) {
			t.Fatalf("%s differs from the reference at float %d: %v vs %v", got, i, a.Pix[i], b.Pix[i])
		}
	}
}

// serve + two tileworker processes + MinIO render frames equal to the local
// reference, and `outputs` downloads them (PNG and OpenEXR) through verified manifests.
func TestMinIOFarmEqualsReference(t *testing.T) {
	t.Parallel()
	m := miniotest.Start(t)
	scene := example("shot")
	f := startServeStore(t, t.TempDir(), m.URL(), m.Env())
	dirA, dirB := t.TempDir(), t.TempDir()
	w1 := f.worker("node-a", dirA)
	w2 := f.worker("node-b", dirB)
	st, r := f.submit(append([]string{scene, "--frames", "1-3", "--format", "exr"}, small...)...)
	if r.code != 42 && r.code != 3 {
		t.Fatalf("submit: %s", r)
	}
	done := f.waitDone(st.JobID, 3*time.Minute)
	if done.State != "completed" || done.TileAttempts != done.TilesTotal {
		t.Fatalf("job: %+v", done)
	}
	for _, w := range []*proctest.Proc{w1, w2} {
		if !strings.Contains(w.Log(), "worker started") {
			t.Fatalf("worker did not start:\n%s", w.Log())
		}
	}
	for _, w := range []*proctest.Proc{w1, w2} {
		// In a clean run every message is acked once: no redelivery reaches the manifest check.
		if strings.Contains(w.Log(), "ack failed") || strings.Contains(w.Log(), "tile already promoted") {
			t.Fatalf("a tile was delivered again in a clean run:\n%s", w.Log())
		}
	}
	// Workers keep the scene's files in their content cache, by hash.
	cached := 0
	for _, d := range []string{dirA, dirB} {
		entries, _ := filepath.Glob(filepath.Join(d, "scenes", "content", "*", "*"))
		cached += len(entries)
	}
	if cached == 0 {
		t.Fatalf("no worker cached a file of scene %s", done.SceneVersion)
	}

	dir := t.TempDir()
	png, exr := filepath.Join(dir, "s_####.png"), filepath.Join(dir, "s_####.exr")
	if r := f.cli("outputs", st.JobID, "--out", png); r.code != 0 || strings.Count(r.stdout, ".png") != 3 {
		t.Fatalf("outputs png: %s", r)
	}
	if r := f.cli("outputs", st.JobID, "--out", exr); r.code != 0 {
		t.Fatalf("outputs exr: %s", r)
	}
	for fr := 1; fr <= 3; fr++ {
		samePixels(t, frameFile(png, fr), reference(t, scene, fr, small...))
		refEXR := filepath.Join(t.TempDir(), "ref.exr")
		if r := run(t, "tileworker", append([]string{"render", scene, "--frame", strconv.Itoa(fr), "--out", refEXR, "-q"}, small...)...); r.code != 0 {
			t.Fatalf("reference exr: %s", r)
		}
		sameEXR(t, frameFile(exr, fr), refEXR)
	}

	// Each output format has a manifest naming it with its checksum and the build fingerprint.
	objects := s3Store(t, m)
	for _, format := range []string{"png", "exr"} {
		man, err := finalize.ReadManifest(context.Background(), objects, layout.FrameManifestKey(done.Frames[0].FrameKey, format))
		if err != nil {
			t.Fatal(err)
		}
		name, _ := layout.FrameOutputName(format)
		o, ok := man.Object(name)
		if !ok || len(o.SHA256) != 64 || o.Size == 0 || !strings.Contains(man.Build, "render/") {
			t.Fatalf("%s manifest: %+v", format, man)
		}
	}
	// Without a request for png16 there is none, and asking for it is a clear error (exit 1).
	png16 := filepath.Join(dir, "s16_####.png")
	if r := f.cli("outputs", st.JobID, "--out", png16, "--format", "png16"); r.code != 1 || !strings.Contains(r.stderr, "png16") {
		t.Fatalf("outputs of a format never requested: %s", r)
	}
	// Asking for it (submit --wait) assembles the finished frames again without rendering a tile.
	st16, r := f.submit(append([]string{scene, "--frames", "1-3", "--format", "png16", "--wait"}, small...)...)
	if r.code != 0 || st16.JobID == st.JobID || st16.TilesReused != st16.TilesTotal || st16.TilesRendered != 0 {
		t.Fatalf("submit --wait for png16: %s", r)
	}
	if again, _ := f.status(st.JobID); again.TileAttempts != done.TileAttempts {
		t.Fatalf("png16 request rendered tiles again: %d attempts, before %d", again.TileAttempts, done.TileAttempts)
	}
	if r := f.cli("outputs", st16.JobID, "--out", png16, "--format", "png16"); r.code != 0 {
		t.Fatalf("outputs png16: %s", r)
	}
	for fr := 1; fr <= 3; fr++ {
		ref16 := filepath.Join(t.TempDir(), "ref16.png")
		if r := run(t, "tileworker", append([]string{"render", scene, "--frame", strconv.Itoa(fr), "--out", ref16, "--format", "png16", "-q"}, small...)...); r.code != 0 {
			t.Fatalf("reference png16: %s", r)
		}
		samePixels(t, frameFile(png16, fr), ref16)
	}
}

// A worker killed mid-tile, and the tile finished on another node with an empty
// checkpoint directory, resumed from the remote checkpoint in MinIO.
func TestRemoteCheckpointResumesOnAnotherNode(t *testing.T) {
	t.Parallel()
	m := miniotest.Start(t)
	scene := example("shot")
	f := startServeStore(t, t.TempDir(), m.URL(), m.Env(), "--ack-wait", "3s", "--lease-ttl", "3s")
	a := f.worker("node-a", t.TempDir(), append(slowWorker, "--remote-checkpoint-every", "0")...)
	st, _ := f.submit(append([]string{scene, "--frames", "10"}, oneTile...)...)
	waitCheckpoint(t, a, 8)
	a.Kill()

	objects := s3Store(t, m)
	ckpts, err := objects.List(context.Background(), layout.CheckpointKey(""))
	if err != nil || len(ckpts) != 1 {
		t.Fatalf("remote checkpoints after the kill: %v %v", ckpts, err)
	}
	b := f.worker("node-b", t.TempDir()) // another node: empty local checkpoint dir
	done := f.waitDone(st.JobID, 2*time.Minute)
	if done.State != "completed" || done.SamplesRecovered <= 0 {
		t.Fatalf("job after the kill: state %s, samples recovered %d: %+v", done.State, done.SamplesRecovered, done)
	}
	if !strings.Contains(b.Log(), "resuming from checkpoint") {
		t.Fatalf("node-b did not resume from the remote checkpoint:\n%s", b.Log())
	}
	out := filepath.Join(t.TempDir(), "r_####.png")
	if r := f.cli("outputs", st.JobID, "--out", out); r.code != 0 {
		t.Fatalf("outputs: %s", r)
	}
	samePixels(t, frameFile(out, 10), reference(t, scene, 10, oneTile...))
	if left, _ := objects.List(context.Background(), layout.CheckpointKey("")); len(left) != 0 {
		t.Fatalf("remote checkpoint not deleted after the tile completed: %v", left)
	}
}

// MinIO stopped for 20 seconds mid-render, longer than MaxDeliver ack-waits: workers retry in
// place and take no new work meanwhile, nothing is dead-lettered or lost, frames equal the
// reference; then gc deletes only unreferenced objects and every manifest still resolves.
func TestMinIOOutageThenGC(t *testing.T) {
	t.Parallel() // its own farm on free ports; most of its time is waiting
	m := miniotest.Start(t)
	scene := example("shot")
	// An outage of five ack-waits, with a failure budget of one and a safety net of three
	// deliveries: an outage that spent deliveries or failures would dead-letter every tile.
	f := startServeStore(t, t.TempDir(), m.URL(), m.Env(), "--ack-wait", "4s", "--lease-ttl", "4s", "--max-deliver", "3", "--max-failures", "1")
	slow := []string{"--fault-pass-delay", "100ms", "--checkpoint-every", "0"}
	w1 := f.worker("node-a", t.TempDir(), slow...)
	w2 := f.worker("node-b", t.TempDir(), slow...)
	st, _ := f.submit(append([]string{scene, "--frames", "1-4"}, small...)...)

	deadline := time.Now().Add(2 * time.Minute)
	for {
		s, _ := f.status(st.JobID)
		if s.TilesCompleted >= 3 {
			if s.TilesCompleted == s.TilesTotal {
				t.Fatal("render finished before the outage could start; slow the workers down")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no progress before the outage: %+v", s)
		}
		time.Sleep(100 * time.Millisecond)
	}
	m.Stop(t)
	time.Sleep(20 * time.Second)
	m.Restart(t)

	done := f.waitDone(st.JobID, 3*time.Minute)
	if done.State != "completed" || done.TilesFailed != 0 || done.TilesCompleted != done.TilesTotal {
		t.Fatalf("job after the outage: %+v", done)
	}
	logs := w1.Log() + w2.Log()
	if !strings.Contains(logs, "infrastructure unavailable; retrying in place") ||
		!strings.Contains(logs, "object store unavailable: not taking new work") || !strings.Contains(logs, "object store available again") {
		t.Fatalf("no worker retried in place and paused for the outage:\n%s\n%s", w1.Log(), w2.Log())
	}
	if dlq := f.cli("dlq", "list"); dlq.code != 0 || strings.Contains(dlq.stdout, "tiles.") {
		t.Fatalf("something was dead-lettered: %s", dlq)
	}
	out := filepath.Join(t.TempDir(), "o_####.png")
	if r := f.cli("outputs", st.JobID, "--out", out); r.code != 0 {
		t.Fatalf("outputs: %s", r)
	}
	for fr := 1; fr <= 4; fr++ {
		samePixels(t, frameFile(out, fr), reference(t, scene, fr, small...))
	}

	// gc: plant what crashed attempts leave behind (an attempt no manifest names, a checkpoint
	// of a tile promoted since), then collect with no grace period.
	ctx := context.Background()
	objects := s3Store(t, m)
	tileManifests, err := objects.List(ctx, finalize.ManifestPrefix+layout.TileManifests)
	if err != nil || len(tileManifests) == 0 {
		t.Fatalf("tile manifests: %d, %v", len(tileManifests), err)
	}
	promotedTile := strings.TrimSuffix(path.Base(tileManifests[0].Key), ".json")
	orphans := []string{"attempts/tiles/" + strings.Repeat("ab", 32) + "/deadbeef/rgb.f32", layout.CheckpointKey(promotedTile)}
	unfinished := layout.CheckpointKey(strings.Repeat("cd", 32)) // a tile never promoted: kept, whatever its age
	if err := objects.Put(ctx, unfinished, []byte("checkpoint")); err != nil {
		t.Fatal(err)
	}
	for _, k := range orphans {
		if err := objects.Put(ctx, k, []byte("orphan")); err != nil {
			t.Fatal(err)
		}
	}
	// The preview movie is encoded after the job completed: wait for it, as it is one more manifest.
	f.waitMovie(st.JobID, api.MovieReady, 2*time.Minute)
	manifests, err := objects.List(ctx, finalize.ManifestPrefix)
	if want := done.TilesTotal + 4 + 1; err != nil || len(manifests) != want {
		t.Fatalf("manifests before gc: %d (%v), want %d (tiles, frames, the movie)", len(manifests), err, want)
	}
	if r := runEnv(t, f.Env, "coordinator", "gc", "--store", m.URL(), "--grace", "0s"); r.code != 2 || !strings.Contains(r.stderr, "--force") {
		t.Fatalf("gc with no grace period and no --force: %s", r)
	}
	r := runEnv(t, f.Env, "coordinator", "gc", "--store", m.URL(), "--grace", "0s", "--force", "--json")
	if r.code != 0 {
		t.Fatalf("gc: %s", r)
	}
	var rep finalize.GCReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("gc report: %v\n%s", err, r)
	}
	for _, k := range orphans {
		if _, err := objects.Stat(ctx, k); err == nil {
			t.Fatalf("gc left the orphan %s", k)
		}
	}
	if _, err := objects.Stat(ctx, unfinished); err != nil {
		t.Fatalf("gc deleted the checkpoint of a tile not promoted: %v", err)
	}
	if len(rep.Referenced) == 0 {
		t.Fatalf("gc saw no referenced objects: %+v", rep)
	}
	for _, mi := range manifests {
		key := strings.TrimSuffix(strings.TrimPrefix(mi.Key, finalize.ManifestPrefix), ".json")
		man, err := finalize.ReadManifest(ctx, objects, key)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range man.Objects {
			if _, err := finalize.ReadObject(ctx, objects, man, o.Name); err != nil {
				t.Fatalf("manifest %s no longer resolves after gc: %v", key, err)
			}
		}
	}
}
