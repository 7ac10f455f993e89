package bench

import (
	"context"
	"runtime"
	"testing"
	"time"
)

// benchTimeout bounds one benchmark, so a stuck farm fails instead of hanging the run.
const benchTimeout = 5 * time.Minute

// shotWorkload is examples/shot at its own reduced size (192x108, 16 spp), the size the
// brief's budget of about two minutes for `-benchtime 1x` allows.
func shotWorkload(first, last, tileSize int) workload {
	return workload{width: 192, height: 108, spp: 16, first: first, last: last, tileSize: tileSize,
		parallel: runtime.GOMAXPROCS(0)}
}

// perTileSizes are the tilings BenchmarkPerTileOverhead compares: 84 and 6 tiles per frame.
var perTileSizes = []int{16, 64}

// shotResume is a 64x64 tile at the centre of the shot's 192x108 frame with 64 samples, so a
// fresh render takes long enough to dwarf timer noise.
func shotResume() resumeWorkload {
	return resumeWorkload{width: 192, height: 108, spp: 64, frame: 1, tileSize: 64, reps: 3, codecReps: 300}
}

// dispatchMessages is how many tile messages BenchmarkDispatch pushes through per iteration.
const dispatchMessages = 2000

func benchContext(b *testing.B) context.Context {
	ctx, cancel := context.WithTimeout(b.Context(), benchTimeout)
	b.Cleanup(cancel)
	return ctx
}

// BenchmarkFarmEfficiency renders frames 1-4 of examples/shot locally with worker.Reference on
// GOMAXPROCS goroutines (the baseline) and through a fresh in-process farm with GOMAXPROCS
// workers, and reports farm/local (1.0 = the farm costs nothing) and tiles/s.
func BenchmarkFarmEfficiency(b *testing.B) {
	w := shotWorkload(1, 4, 64)
	bundle := loadBundle(b, "shot")
	ctx, base := benchContext(b), b.TempDir()
	var total efficiency
	n := 0
	for b.Loop() {
		e, err := measureEfficiency(ctx, base, bundle, w)
		if err != nil {
			b.Fatal(err)
		}
		total = total.add(e)
		n++
	}
	reportEfficiency(b, total, n)
}

// BenchmarkPerTileOverhead renders frame 1 of examples/shot with 16 px and 64 px tiles, locally
// and through the farm, and reports the farm's overhead in seconds per tile for each tiling.
func BenchmarkPerTileOverhead(b *testing.B) {
	w := shotWorkload(1, 1, 0)
	bundle := loadBundle(b, "shot")
	ctx, base := benchContext(b), b.TempDir()
	total := make([]efficiency, len(perTileSizes))
	for b.Loop() {
		es, err := measurePerTile(ctx, base, bundle, w, perTileSizes)
		if err != nil {
			b.Fatal(err)
		}
		for i := range total {
			total[i] = total[i].add(es[i])
		}
	}
	reportPerTile(b, perTileSizes, total)
}

// BenchmarkResume times resuming a 64x64 tile from a half-way checkpoint against rendering it
// fresh (the ratio should be about 0.5) and the checkpoint codec's encode/decode MB/s.
func BenchmarkResume(b *testing.B) {
	w := shotResume()
	bundle := loadBundle(b, "shot")
	ctx := benchContext(b)
	var total resumeResult
	reps := 0
	for b.Loop() {
		res, err := measureResume(ctx, bundle, w)
		if err != nil {
			b.Fatal(err)
		}
		total = total.add(res)
		reps += w.reps
	}
	reportResume(b, total, w.spp, reps)
}

// BenchmarkDispatch pushes tile messages through the TILES stream the way the outbox relay and
// the workers do, and compares the rate with plain core-NATS delivery in the same run.
func BenchmarkDispatch(b *testing.B) {
	ctx, base := benchContext(b), b.TempDir()
	var total dispatchResult
	for b.Loop() {
		d, err := measureDispatch(ctx, base, dispatchMessages)
		if err != nil {
			b.Fatal(err)
		}
		total = total.add(d)
	}
	reportDispatch(b, total)
}
