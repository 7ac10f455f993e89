//go:build linux

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/miniotest"
	"github.com/tilefarm/tilefarm/objstore"
)

// A distributed, erasure-coded MinIO of four nodes loses one node to kill -9 while tiles are
// rendering: one node down keeps write quorum (3 of 4 drives), so the farm, talking to node 0,
// completes the job with no failure, nothing dead-lettered and frames equal to the local
// reference; once restarted, the killed node serves every manifest and object, including those
// written while it was down.
func TestMinIOClusterFarmSurvivesANodeKill(t *testing.T) {
	t.Parallel()
	c := miniotest.StartCluster(t, 4)
	scene := example("shot")
	frames := []int{1, 2, 3, 4}
	f := startServeStore(t, t.TempDir(), c.URL(), c.Env())
	slow := []string{"--fault-pass-delay", "100ms", "--checkpoint-every", "0"}
	f.worker("node-a", t.TempDir(), slow...)
	f.worker("node-b", t.TempDir(), slow...)
	st, _ := f.submit(append([]string{scene, "--frames", "1-4"}, small...)...)

	deadline := time.Now().Add(time.Minute)
	for {
		s, _ := f.status(st.JobID)
		if s.TilesCompleted >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no progress before the kill: %+v", s)
		}
		time.Sleep(100 * time.Millisecond)
	}
	victim := c.Node(2)
	victim.Kill()
	// The kill must hit work in progress: tiles completed before it, and tiles still to render after it.
	if s, _ := f.status(st.JobID); s.TilesCompleted == 0 || s.TilesCompleted >= s.TilesTotal || s.State == "completed" {
		t.Fatalf("the node kill did not hit a job in progress: %d of %d tiles completed, %s; slow the workers down",
			s.TilesCompleted, s.TilesTotal, s.State)
	}

	done := f.waitDone(st.JobID, 2*time.Minute)
	victim.Restart(t)
	if done.State != "completed" || done.TilesFailed != 0 || done.TilesCompleted != done.TilesTotal {
		t.Fatalf("job after the node kill: %+v", done)
	}
	f.assertNoDeadLetters()
	outputsEqualReference(t, f, st.JobID, scene, frames, small...)

	// The restarted node serves what was promoted while it was down: every manifest and every
	// object it names, checksums verified.
	ctx := context.Background()
	objects, err := objstore.NewS3Store(ctx, victim.Endpoint, c.Bucket, false, c.AccessKey, c.SecretKey)
	if err != nil {
		t.Fatal(err)
	}
	// The preview movie is encoded after the job completed: wait for it, as it is one more manifest.
	f.waitMovie(st.JobID, api.MovieReady, 2*time.Minute)
	manifests, err := objects.List(ctx, finalize.ManifestPrefix)
	if want := done.TilesTotal + len(frames) + 1; err != nil || len(manifests) != want {
		t.Fatalf("manifests through the restarted node: %d (%v), want %d (tiles, frames, the movie)", len(manifests), err, want)
	}
	for _, mi := range manifests {
		key := strings.TrimSuffix(strings.TrimPrefix(mi.Key, finalize.ManifestPrefix), ".json")
		man, err := finalize.ReadManifest(ctx, objects, key)
		if err != nil {
			t.Fatalf("manifest %s through the restarted node: %v", key, err)
		}
		for _, o := range man.Objects {
			if _, err := finalize.ReadObject(ctx, objects, man, o.Name); err != nil {
				t.Fatalf("manifest %s object %s through the restarted node: %v", key, o.Name, err)
			}
		}
	}
}
