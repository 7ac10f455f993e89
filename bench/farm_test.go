package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/client"
	"github.com/tilefarm/tilefarm/internal/coordinator"
	"github.com/tilefarm/tilefarm/internal/node"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/worker"
	"github.com/tilefarm/tilefarm/render"
	"github.com/tilefarm/tilefarm/tiles"
)

// errJobFailed means the farm finished a benchmark job in a state other than completed.
var errJobFailed = errors.New("farm job did not complete")

// statusPoll bounds how long waitCompleted sleeps when no projection change wakes it, so a
// missed notification costs at most this much, not a hang.
const statusPoll = 250 * time.Millisecond

// workload is one render measured both ways: the same frames at the same settings, rendered
// by the local reference renderer and through the farm.
type workload struct {
	width, height, spp int
	first, last        int
	tileSize           int
	parallel           int           // local goroutines and in-process farm workers
	worker             worker.Config // in-process workers; zero is what `coordinator render` uses
}

func (w workload) frames() int { return w.last - w.first + 1 }

// settings resolves the workload's settings the way a submission does: the scene's defaults
// with the non-zero overrides.
func (w workload) settings(scene *render.Scene) (render.Settings, error) {
	st, err := scene.Resolve(render.Overrides{Width: w.width, Height: w.height, SPP: w.spp})
	if err != nil {
		return st, fmt.Errorf("benchmark settings: %w", err)
	}
	return st, nil
}

// run is one timed render of a workload.
type run struct {
	elapsed time.Duration
	tiles   int
	png     map[int][]byte // encoded output by frame, checked outside the timed region
}

// renderLocal renders the workload with worker.Reference on w.parallel goroutines and encodes
// each frame as PNG, which is the work the farm's assembly also does. Parsing the scene is
// timed too: every farm worker parses it as well.
func renderLocal(ctx context.Context, bundle *bundle.Bundle, w workload) (run, error) {
	start := time.Now()
	scene, err := render.ParseScene(bundle.Scene, bundle.Assets(ctx, 0))
	if err != nil {
		return run{}, fmt.Errorf("parsing scene: %w", err)
	}
	st, err := w.settings(scene)
	if err != nil {
		return run{}, err
	}
	ref, err := worker.NewReference(ctx, jsonKinds, bundle, "")
	if err != nil {
		return run{}, err
	}
	r := run{png: make(map[int][]byte, w.frames())}
	for f := w.first; f <= w.last; f++ {
		img, err := ref.RenderFrame(ctx, st, f, w.tileSize, w.parallel, nil)
		if err != nil {
			return run{}, fmt.Errorf("rendering frame %d locally: %w", f, err)
		}
		outs, err := ref.Encode(ctx, img, f, st, []string{"png"})
		if err != nil {
			return run{}, fmt.Errorf("encoding frame %d: %w", f, err)
		}
		r.png[f] = outs[0].Data
	}
	r.elapsed = time.Since(start)
	rects, err := tiles.Split(st.Width, st.Height, w.tileSize)
	if err != nil {
		return run{}, fmt.Errorf("splitting frame: %w", err)
	}
	r.tiles = len(rects) * w.frames()
	return r, nil
}

// farmRun is one timed render through the farm.
type farmRun struct {
	run
	startup  time.Duration // StartCoordinator: embedded JetStream, stores, workers
	attempts int           // tile attempts the coordinator recorded; tiles means no retries
}

// renderFarm starts a fresh single-machine farm in dir (embedded JetStream, filesystem store,
// w.parallel in-process workers, the options `coordinator render` uses), submits the workload
// and waits until the job completes. elapsed runs from Submit to completion; start-up and
// shutdown are not in it.
func renderFarm(ctx context.Context, dir string, bundle *bundle.Bundle, w workload) (farmRun, error) {
	start := time.Now()
	n, err := node.StartCoordinator(ctx, node.CoordinatorOptions{
		DataDir: dir, Queue: queue.DefaultConfig(), Workers: w.parallel, Worker: w.worker, Kinds: jsonKinds, Log: quietLogger(),
	})
	if err != nil {
		return farmRun{}, fmt.Errorf("starting farm in %q: %w", dir, err)
	}
	defer n.Close()
	r := farmRun{startup: time.Since(start)}

	start = time.Now()
	if _, err := client.UploadScene(ctx, n.Coord, bundle, 0, nil); err != nil {
		return farmRun{}, fmt.Errorf("uploading benchmark scene: %w", err)
	}
	res, err := n.Coord.Submit(ctx, api.SubmitRequest{
		SceneVersion: bundle.Version(), First: w.first, Last: w.last, SPP: w.spp, Width: w.width, Height: w.height,
		TileSize: w.tileSize, Formats: []string{"png"},
	})
	if err != nil {
		return farmRun{}, fmt.Errorf("submitting benchmark job: %w", err)
	}
	st, err := waitCompleted(ctx, n.Coord, res.Status.JobID)
	if err != nil {
		return farmRun{}, err
	}
	r.elapsed = time.Since(start)
	r.tiles, r.attempts = st.TilesTotal, st.TileAttempts

	r.png = make(map[int][]byte, w.frames())
	for f := w.first; f <= w.last; f++ {
		data, err := n.Coord.FrameOutput(ctx, st.JobID, f, "png")
		if err != nil {
			return farmRun{}, fmt.Errorf("reading farm output of frame %d: %w", f, err)
		}
		r.png[f] = data
	}
	return r, nil
}

// waitCompleted waits for a job to finish, woken by every projection change, as
// `coordinator render` does.
func waitCompleted(ctx context.Context, c *coordinator.Coordinator, jobID string) (api.Status, error) {
	timer := time.NewTimer(statusPoll)
	defer timer.Stop()
	for {
		changed := c.Changed() // before Status, so no change between the two is missed
		st, err := c.Status(ctx, jobID)
		if err != nil {
			return st, fmt.Errorf("reading status of job %s: %w", jobID, err)
		}
		switch st.State {
		case api.JobCompleted:
			return st, nil
		case api.JobFailed:
			return st, fmt.Errorf("%w: job %s is %s: %v", errJobFailed, jobID, st.State, st.Failures)
		}
		timer.Reset(statusPoll)
		select {
		case <-ctx.Done():
			return st, fmt.Errorf("waiting for job %s (%d/%d tiles): %w", jobID, st.TilesCompleted, st.TilesTotal, ctx.Err())
		case <-changed:
		case <-timer.C:
		}
	}
}

// efficiency is the farm measured against the local reference on the same workload. Values
// add up over benchmark iterations.
type efficiency struct {
	local, farm, startup time.Duration
	tiles, attempts      int
}

func (e efficiency) add(o efficiency) efficiency {
	return efficiency{local: e.local + o.local, farm: e.farm + o.farm, startup: e.startup + o.startup,
		tiles: e.tiles + o.tiles, attempts: e.attempts + o.attempts}
}

// ratio is farm time over local time: 1 means the farm costs nothing.
func (e efficiency) ratio() float64 { return ratio(e.farm, e.local) }

// overheadPerTile is the farm's extra time per tile in seconds. It can come out negative on a
// noisy machine when the overhead is small.
func (e efficiency) overheadPerTile() float64 {
	return (e.farm - e.local).Seconds() / float64(e.tiles)
}

// measureEfficiency renders w locally, then through a farm in a fresh directory under base
// (removed afterwards), and checks that both produced the same pixels and the same tiling.
func measureEfficiency(ctx context.Context, base string, bundle *bundle.Bundle, w workload) (efficiency, error) {
	dir, err := os.MkdirTemp(base, "farm-*")
	if err != nil {
		return efficiency{}, fmt.Errorf("creating farm data dir: %w", err)
	}
	defer os.RemoveAll(dir)
	local, err := renderLocal(ctx, bundle, w)
	if err != nil {
		return efficiency{}, err
	}
	fr, err := renderFarm(ctx, dir, bundle, w)
	if err != nil {
		return efficiency{}, err
	}
	if fr.tiles != local.tiles {
		return efficiency{}, fmt.Errorf("farm rendered %d tiles, the local tiling has %d", fr.tiles, local.tiles)
	}
	for f := w.first; f <= w.last; f++ {
		if err := samePNG(fr.png[f], local.png[f]); err != nil {
			return efficiency{}, fmt.Errorf("frame %d: %w", f, err)
		}
	}
	return efficiency{local: local.elapsed, farm: fr.elapsed, startup: fr.startup, tiles: fr.tiles, attempts: fr.attempts}, nil
}

// reportEfficiency reports the farm/local ratio and throughput of summed iterations.
func reportEfficiency(r reporter, e efficiency, iterations int) {
	r.ReportMetric(e.ratio(), "farm/local")
	r.ReportMetric(rate(e.tiles, e.farm), "tiles/s")
	r.ReportMetric(rate(e.tiles, e.local), "local-tiles/s")
	r.ReportMetric(e.startup.Seconds()/float64(iterations), "startup-s")
	r.ReportMetric(float64(e.attempts)/float64(e.tiles), "attempts/tile")
}

// measurePerTile measures the same workload at each tile size; see reportPerTile.
func measurePerTile(ctx context.Context, base string, bundle *bundle.Bundle, w workload, sizes []int) ([]efficiency, error) {
	out := make([]efficiency, len(sizes))
	for i, size := range sizes {
		ws := w
		ws.tileSize = size
		e, err := measureEfficiency(ctx, base, bundle, ws)
		if err != nil {
			return nil, fmt.Errorf("tile size %d: %w", size, err)
		}
		out[i] = e
	}
	return out, nil
}

// reportPerTile reports, for each tile size, the farm overhead per tile
// ((farm - local) / tiles, local rendered with the same tiling) and the farm/local ratio; with
// two sizes also the marginal overhead of one more tile, which leaves out the per-frame costs
// (submit, assembly) that the plain per-tile figure spreads over the tiles.
func reportPerTile(r reporter, sizes []int, es []efficiency) {
	for i, size := range sizes {
		r.ReportMetric(es[i].overheadPerTile(), fmt.Sprintf("t%d-overhead-s/tile", size))
		r.ReportMetric(es[i].ratio(), fmt.Sprintf("t%d-farm/local", size))
	}
	if len(sizes) == 2 && es[0].tiles != es[1].tiles {
		extra := (es[0].farm - es[0].local) - (es[1].farm - es[1].local)
		r.ReportMetric(extra.Seconds()/float64(es[0].tiles-es[1].tiles), "marginal-s/tile")
	}
}
