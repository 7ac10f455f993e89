package bench

import (
	"context"
	"os"
	"sync"
	"testing"

	"github.com/tilefarm/tilefarm/bench/farmbench"
	"github.com/tilefarm/tilefarm/internal/farmtest"
	"github.com/tilefarm/tilefarm/internal/queue"
)

var (
	binOnce sync.Once
	bins    farmtest.Binaries
	binErr  error
)

// coordinatorBinary builds cmd/coordinator once per test binary.
func coordinatorBinary() (farmtest.Binaries, error) {
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tilefarm-bench-bin")
		if err != nil {
			binErr = err
			return
		}
		bins, binErr = farmtest.Build(dir, farmtest.BuildOptions{Commands: []string{"coordinator"}})
	})
	return bins, binErr
}

// startCoordinatorProcess starts `coordinator serve --workers 0` with its data under dir and
// its log there too, and waits until it is healthy.
func startCoordinatorProcess(ctx context.Context, dir string, extra ...string) (*farmtest.Farm, error) {
	bins, err := coordinatorBinary()
	if err != nil {
		return nil, err
	}
	return farmbench.StartCoordinator(ctx, bins, dir, extra...)
}

func reportShot(r reporter, d farmbench.ShotDispatch, prefix string) {
	r.ReportMetric(d.SubmitN.Seconds(), prefix+"submit-s")
	r.ReportMetric(d.SubmitOne.Seconds(), prefix+"submit1-s")
	r.ReportMetric(ratio(d.SubmitN, d.SubmitOne), prefix+"submitN/submit1")
	r.ReportMetric(rate(d.Tiles, d.Durable), prefix+"durable-tiles/s")
	r.ReportMetric(float64(d.PeakRSS)/(1<<20), prefix+"peak-rss-MB")
	r.ReportMetric(float64(d.DBBytes)/float64(d.Tiles), prefix+"db-bytes/tile")
	r.ReportMetric(float64(d.DBBytesDone)/float64(d.Tiles), prefix+"done-db-bytes/tile")
	r.ReportMetric(rate(d.Tiles, d.Applied), prefix+"events/s")
}

// BenchmarkShotDispatch: a 240-frame 1920x1080 shot in 64 px tiles (122,400 tiles) submitted
// to a coordinator process with no workers, with the embedded JetStream syncing every second
// (the default) and on every write.
func BenchmarkShotDispatch(b *testing.B) {
	bundle := loadBundle(b, "shot")
	for _, sync := range []string{string(queue.DefaultSync), string(queue.SyncAlways)} {
		b.Run("sync="+sync, func(b *testing.B) {
			for range b.N {
				bins, err := coordinatorBinary()
				if err != nil {
					b.Fatal(err)
				}
				d, err := farmbench.MeasureShotDispatch(b.Context(), bins, b.TempDir(), bundle, farmbench.DispatchShot{Frames: 240, Width: 1920, Height: 1080, TileSize: 64, Sync: sync})
				if err != nil {
					b.Fatal(err)
				}
				reportShot(b, d, "")
			}
		})
	}
}
