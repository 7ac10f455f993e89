package bench

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/bench/farmbench"
	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/client"
)

// gridBundle is a scene whose one asset is an OBJ grid of n x n vertices (about 80 bytes of
// OBJ text per vertex): a big submission.
func gridBundle(n int) *bundle.Bundle {
	var obj bytes.Buffer
	for y := range n {
		for x := range n {
			fmt.Fprintf(&obj, "v %.5f %.5f %.5f\n", float64(x)/float64(n), float64(y)/float64(n), float64((x*y)%7)/100)
		}
	}
	for y := range n - 1 {
		for x := range n - 1 {
			a := y*n + x + 1
			fmt.Fprintf(&obj, "f %d %d %d\nf %d %d %d\n", a, a+1, a+n, a+1, a+n+1, a+n)
		}
	}
	scene := `{"cameras": [{"name": "cam", "position": [0.5, 0.5, 2], "look_at": [0.5, 0.5, 0]}],
  "materials": [{"name": "m", "type": "diffuse"}],
  "objects": [{"type": "mesh", "file": "grid.obj", "material": "m"}]}`
	return bundle.FromMemory("grid.json", []byte(scene), map[string][]byte{"grid.obj": obj.Bytes()})
}

// uploadCost is what uploading one scene bundle cost the coordinator.
type uploadCost struct {
	bundleBytes int
	peakDelta   int64 // growth of the coordinator's peak resident set during the upload
	elapsed     time.Duration
}

// measureUpload starts a coordinator process and uploads b to it, measuring how far the
// upload raised the process's peak memory.
func measureUpload(ctx context.Context, dir string, b *bundle.Bundle) (uploadCost, error) {
	res := uploadCost{}
	srv, err := startCoordinatorProcess(ctx, dir, "--nats-listen", "127.0.0.1:0")
	if err != nil {
		return res, err
	}
	defer srv.Close()
	total, _ := b.Bytes()
	res.bundleBytes = int(total) + len(b.Scene)
	before, err := farmbench.PeakRSS(srv.Coord.Pid())
	if err != nil {
		return res, err
	}
	start := time.Now()
	if _, err := client.UploadScene(ctx, client.New(srv.HTTP, ""), b, 0, nil); err != nil {
		return res, fmt.Errorf("uploading a %d-byte scene: %w", res.bundleBytes, err)
	}
	res.elapsed = time.Since(start)
	after, err := farmbench.PeakRSS(srv.Coord.Pid())
	if err != nil {
		return res, err
	}
	res.peakDelta = after - before
	return res, nil
}

func reportUpload(r reporter, u uploadCost) {
	r.ReportMetric(float64(u.bundleBytes)/(1<<20), "bundle-MB")
	r.ReportMetric(float64(u.peakDelta)/float64(u.bundleBytes), "upload-peak/bundle")
	r.ReportMetric(float64(u.bundleBytes)/(1<<20)/u.elapsed.Seconds(), "upload-MB/s")
}

// BenchmarkSceneUpload: a scene with a 1000 x 1000 vertex OBJ mesh (about 80 MB of bundle)
// uploaded to a coordinator process: how much its peak memory grows per bundle byte while it
// reads, validates (parsing the mesh) and stores the bundle.
func BenchmarkSceneUpload(b *testing.B) {
	bundle := gridBundle(1000)
	for range b.N {
		u, err := measureUpload(b.Context(), b.TempDir(), bundle)
		if err != nil {
			b.Fatal(err)
		}
		reportUpload(b, u)
	}
}
