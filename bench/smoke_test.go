package bench

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/bench/farmbench"
	"github.com/tilefarm/tilefarm/blender/blendertest"
	"github.com/tilefarm/tilefarm/render"
)

// TestBenchSmoke runs every benchmark body once at tiny sizes so CI exercises the code: the
// measurements must succeed (which includes the farm matching the reference pixel for pixel and
// resumed tiles matching fresh ones bit for bit) and every ratio and rate must be finite and
// positive. No timing is asserted.
func TestBenchSmoke(t *testing.T) {
	// A bound on a hang, not a timing: alone the bodies take about 30 s; beside the rest of
	// the test command on two cores, several times that.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	bundle := loadBundle(t, "shot")
	tiny := workload{width: 48, height: 27, spp: 2, first: 1, last: 2, tileSize: 16, parallel: 2}

	t.Run("FarmEfficiency", func(t *testing.T) {
		e, err := measureEfficiency(ctx, t.TempDir(), bundle, tiny)
		if err != nil {
			t.Fatal(err)
		}
		if want := 2 * 3 * 2; e.tiles != want { // 48x27 in 16 px tiles: 3x2 per frame
			t.Errorf("tiles = %d, want %d", e.tiles, want)
		}
		if e.attempts < e.tiles {
			t.Errorf("attempts = %d for %d tiles: some tile was never started", e.attempts, e.tiles)
		}
		m := metricSet{}
		reportEfficiency(m, e, 1)
		checkMetrics(t, m, "farm/local", "tiles/s", "local-tiles/s", "startup-s", "attempts/tile")
	})

	t.Run("PerTileOverhead", func(t *testing.T) {
		w := tiny
		w.last = w.first
		sizes := []int{8, 32}
		es, err := measurePerTile(ctx, t.TempDir(), bundle, w, sizes)
		if err != nil {
			t.Fatal(err)
		}
		if es[0].tiles != 6*4 || es[1].tiles != 2*1 {
			t.Errorf("tiles = %d and %d, want 24 and 2", es[0].tiles, es[1].tiles)
		}
		m := metricSet{}
		reportPerTile(m, sizes, es)
		checkMetrics(t, m, "t8-farm/local", "t32-farm/local")
		checkFinite(t, m, "t8-overhead-s/tile", "t32-overhead-s/tile", "marginal-s/tile")
	})

	t.Run("Resume", func(t *testing.T) {
		w := resumeWorkload{width: 48, height: 27, spp: 4, frame: 1, tileSize: 16, reps: 2, codecReps: 2}
		res, err := measureResume(ctx, bundle, w)
		if err != nil {
			t.Fatal(err)
		}
		if res.samplesRecovered != w.reps*w.spp/2 {
			t.Errorf("samples recovered = %d, want %d", res.samplesRecovered, w.reps*w.spp/2)
		}
		m := metricSet{}
		reportResume(m, res, w.spp, w.reps)
		checkMetrics(t, m, "resume/fresh", "ckpt-encode-MB/s", "ckpt-decode-MB/s", "ckpt-size/raw")
		if got := m["expected-resume/fresh"]; got != 0.5 {
			t.Errorf("expected-resume/fresh = %v, want 0.5 from a half-way checkpoint", got)
		}
	})

	t.Run("TakeOver", func(t *testing.T) {
		m := metricSet{}
		reportTakeOver(m, measureTakeOver(t, 1))
		checkMetrics(t, m, "takeover-p50-s", "takeover-p99-s", "p50/lease-ttl", "p99/lease-ttl")
	})

	t.Run("Dispatch", func(t *testing.T) {
		d, err := measureDispatch(ctx, t.TempDir(), 50)
		if err != nil {
			t.Fatal(err)
		}
		m := metricSet{}
		reportDispatch(m, d)
		checkMetrics(t, m, "publish-msgs/s", "fetch-ack-msgs/s", "msgs/s", "core-msgs/s", "dispatch/core", "publish/core")
	})

	t.Run("SceneUpload", func(t *testing.T) {
		u, err := measureUpload(ctx, t.TempDir(), gridBundle(20))
		if err != nil {
			t.Fatal(err)
		}
		m := metricSet{}
		reportUpload(m, u)
		checkMetrics(t, m, "bundle-MB", "upload-MB/s")
		checkFinite(t, m, "upload-peak/bundle")
	})

	t.Run("ShotDispatch", func(t *testing.T) {
		bins, err := coordinatorBinary()
		if err != nil {
			t.Fatal(err)
		}
		w := farmbench.DispatchShot{Frames: 4, Width: 96, Height: 64, TileSize: 16, Sync: "1s"}
		d, err := farmbench.MeasureShotDispatch(ctx, bins, t.TempDir(), bundle, w)
		if err != nil {
			t.Fatal(err)
		}
		if d.Tiles != 4*24 {
			t.Errorf("tiles = %d, want 96", d.Tiles)
		}
		m := metricSet{}
		reportShot(m, d, "")
		checkMetrics(t, m, "submit-s", "submit1-s", "submitN/submit1", "durable-tiles/s", "peak-rss-MB", "db-bytes/tile",
			"done-db-bytes/tile", "events/s")
	})

	t.Run("BlenderFarm", func(t *testing.T) {
		w := blenderWorkload{binary: blendertest.Binary(t), first: 1, last: 2, warmup: 3, width: 96, height: 72, spp: 8, passes: 2,
			tileSize: 32, workers: 2}
		r, err := measureBlenderFarm(ctx, t.TempDir(), loadBlender(t, ctx), w)
		checkBlenderRun(t, r, err)
	})

	t.Run("BlenderPlate", func(t *testing.T) {
		r, err := measurePlate(ctx, t.TempDir(), blendertest.Binary(t), blendertest.Plate(t), 2)
		checkBlenderRun(t, r, err)
	})

	t.Run("BlenderStill", func(t *testing.T) {
		bins, err := coordinatorBinary()
		if err != nil {
			t.Fatal(err)
		}
		total := map[string]stillRun{}
		for name, c := range stillCases(makeStills(t, stillSize{width: 96, height: 54, spp: 8, plateSPP: 4})) {
			r, err := measureStill(ctx, t.TempDir(), bins, blendertest.Binary(t), c, 1)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			total[name] = r
		}
		m := metricSet{}
		reportStill(m, total)
		checkMetrics(t, m, "1frame-farm/blender", "4frames-farm/blender", "plate-2x1-speedup", "default-2x1-speedup")
	})

	t.Run("StudioScene", func(t *testing.T) {
		bins, err := farmBinaries()
		if err != nil {
			t.Fatal(err)
		}
		p := studioProject{files: 16, size: 2048} // tex/t_0007.png, which the resubmit changes, among them
		project := makeStudioProject(t, t.TempDir(), p)
		run, err := measureStudio(t, ctx, bins, t.TempDir(), project, p)
		if err != nil {
			t.Fatal(err)
		}
		s, err := measureSmall(ctx, bins, t.TempDir(), project, p, true)
		if err != nil || s.code != 42 && s.code != 3 {
			t.Fatalf("a small submit: exit %d, %v", s.code, err)
		}
		m := metricSet{}
		reportStudio(m, run, map[string]smallRun{"16x2KiB": s})
		checkMetrics(t, m, "first-files-sent", "second-files-sent", "submit-peak-rss-MB", "16x2KiB-files/s")
	})

	t.Run("BlenderPass", func(t *testing.T) {
		pool, sc, st := passSetup(t, ctx, 2)
		s, err := passStats(ctx, pool, sc, st, render.Rect{X0: 48, Y0: 28, X1: 64, Y1: 44}, 2)
		if err != nil {
			t.Fatal(err)
		}
		if s.Passes != 4 {
			t.Errorf("passes = %d, want 4 (2 tiles of 2 passes)", s.Passes)
		}
		m := metricSet{}
		reportPass(m, s)
		checkMetrics(t, m, "overhead-ms/pass", "blender-ms/pass", "overhead/blender")
	})
}

// checkMetrics asserts that each named metric was reported and is finite and positive.
func checkMetrics(t *testing.T, m metricSet, units ...string) {
	t.Helper()
	for _, u := range units {
		v, ok := m[u]
		if !ok {
			t.Errorf("metric %q not reported (have %v)", u, m)
			continue
		}
		if !finitePositive(v) {
			t.Errorf("metric %q = %v, want finite and positive", u, v)
		}
	}
}

// checkFinite asserts that each named metric was reported and is finite; overheads may be
// negative when they drown in noise.
func checkFinite(t *testing.T, m metricSet, units ...string) {
	t.Helper()
	for _, u := range units {
		v, ok := m[u]
		if !ok {
			t.Errorf("metric %q not reported (have %v)", u, m)
			continue
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			t.Errorf("metric %q = %v, want finite", u, v)
		}
	}
}

// checkBlenderRun checks a farm's run of two Blender frames against Blender's own and its
// metrics.
func checkBlenderRun(t *testing.T, r blenderRun, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if r.frames != 2 {
		t.Errorf("frames = %d, want 2", r.frames)
	}
	m := metricSet{}
	reportBlenderFarm(m, r)
	checkMetrics(t, m, "farm/blender", "farm/blender-render", "cold-frame-s", "frames/s", "blender-frames/s")
	checkFinite(t, m, "max-rel-diff")
}
