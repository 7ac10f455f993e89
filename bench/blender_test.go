package bench

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/blender"
	"github.com/tilefarm/tilefarm/blender/blendertest"
	"github.com/tilefarm/tilefarm/blender/blendscene"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/client"
	"github.com/tilefarm/tilefarm/internal/kinds"
	"github.com/tilefarm/tilefarm/internal/node"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/raster"
	"github.com/tilefarm/tilefarm/render"
)

// blenderWorkload is a Blender job: frames of the example scene with overrides (0 keeps the
// scene's), split into tiles and passes, on workers in-process workers.
type blenderWorkload struct {
	binary                     string // the Blender executable
	first, last                int
	warmup                     int // a frame rendered first, untimed, so the workers are warm
	width, height, spp, passes int
	tileSize, workers          int
}

// loadBlender inspects the example Blender scene into a bundle, outside any timed region.
func loadBlender(tb testing.TB, ctx context.Context) *bundle.Bundle {
	tb.Helper()
	k := blendscene.New(blendscene.Options{Binaries: []string{blendertest.Binary(tb)}}, scene.Env{Dir: tb.TempDir()})
	defer k.Close()
	b, err := k.Read(ctx, blendertest.Example(tb))
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// unpack writes a Blender scene bundle's files under dir, for Blender to open.
func unpack(b *bundle.Bundle, dir string) (*blender.Scene, error) {
	d, err := blender.ParseDescription(b.Scene)
	if err != nil {
		return nil, err
	}
	return blender.Unpack(context.Background(), dir, b.Version(), d, b)
}

func (w blenderWorkload) settings(b *bundle.Bundle) (render.Settings, error) {
	d, err := blender.ParseDescription(b.Scene)
	if err != nil {
		return render.Settings{}, err
	}
	return d.Resolve(render.Overrides{Width: w.width, Height: w.height, SPP: w.spp, Passes: w.passes})
}

// blenderRun is the farm measured against Blender's own command-line render of the same frames.
type blenderRun struct {
	farm, own time.Duration
	cold      time.Duration // the warm-up frame, Blender processes started
	ownFrames time.Duration // the frame times Blender's own render printed, summed: its rendering alone
	frames    int
	worst     float64 // largest relative difference of a farm float from Blender's own
	ties      int     // pixels whose Cryptomatte ranks of equal coverage came in another order (channelsDiff)
}

func (r blenderRun) add(o blenderRun) blenderRun {
	return blenderRun{farm: r.farm + o.farm, own: r.own + o.own, cold: r.cold + o.cold, ownFrames: r.ownFrames + o.ownFrames,
		frames: r.frames + o.frames, worst: max(r.worst, o.worst), ties: r.ties + o.ties}
}

// measureBlenderFarm renders the workload (a) with Blender's own command line, one process
// with as many threads as the farm has workers, timed as a whole process (start-up
// included: an artist pays it for every render), and (b) through a fresh in-process farm,
// timed from submit to completed, once its workers are warm: a farm's workers run for days,
// and their Blender processes with them. How long the cold warm-up frame took is reported
// too. Every farm frame must equal Blender's own to within rounding, or the two did not do the
// same work.
func measureBlenderFarm(ctx context.Context, base string, bundle *bundle.Bundle, w blenderWorkload) (blenderRun, error) {
	dir, err := os.MkdirTemp(base, "blender-*")
	if err != nil {
		return blenderRun{}, err
	}
	defer os.RemoveAll(dir)
	st, err := w.settings(bundle)
	if err != nil {
		return blenderRun{}, err
	}
	own, ownFrames, ownDir, err := blendersOwn(ctx, dir, bundle, st, w)
	if err != nil {
		return blenderRun{}, err
	}
	ks := kinds.Builtin(kinds.Options{Blender: blendscene.Options{Binaries: []string{w.binary}}},
		scene.Env{Dir: filepath.Join(dir, "worker"), Slots: w.workers})
	defer ks.Close()
	n, err := node.StartCoordinator(ctx, node.CoordinatorOptions{DataDir: filepath.Join(dir, "farm"), Queue: queue.DefaultConfig(),
		Workers: w.workers, Kinds: ks, Log: quietLogger()})
	if err != nil {
		return blenderRun{}, err
	}
	defer n.Close()
	if _, err := client.UploadScene(ctx, n.Coord, bundle, 0, nil); err != nil {
		return blenderRun{}, err
	}
	submit := func(first, last int) (string, time.Duration, error) {
		start := time.Now()
		res, err := n.Coord.Submit(ctx, api.SubmitRequest{SceneVersion: bundle.Version(), First: first, Last: last,
			SPP: w.spp, Width: w.width, Height: w.height, Passes: w.passes, TileSize: w.tileSize, Formats: []string{"exr"}})
		if err != nil {
			return "", 0, err
		}
		_, err = waitCompleted(ctx, n.Coord, res.Status.JobID)
		return res.Status.JobID, time.Since(start), err
	}
	// A cold farm: its workers start their Blender processes during the job.
	_, cold, err := submit(w.warmup, w.warmup)
	if err != nil {
		return blenderRun{}, err
	}
	// A warm farm, as a farm of long-running workers is: the frames measured.
	job, elapsed, err := submit(w.first, w.last)
	if err != nil {
		return blenderRun{}, err
	}
	r := blenderRun{farm: elapsed, cold: cold, own: own, ownFrames: ownFrames, frames: w.last - w.first + 1}
	for f := w.first; f <= w.last; f++ {
		data, err := n.Coord.FrameOutput(ctx, job, f, "exr")
		if err != nil {
			return blenderRun{}, err
		}
		got, err := raster.DecodeEXR(data)
		if err != nil {
			return blenderRun{}, err
		}
		want, err := readFrame(filepath.Join(ownDir, fmt.Sprintf("own_%04d.exr", f)))
		if err != nil {
			return blenderRun{}, err
		}
		d := blendertest.MaxRelDiff(got.Pix, want.Pix)
		if d > 1e-5 {
			return blenderRun{}, fmt.Errorf("%w: frame %d differs from Blender's own by %g relative", errMismatch, f, d)
		}
		r.worst = max(r.worst, d)
	}
	return r, nil
}

// blendersOwn renders the workload's frames with `blender -b -t WORKERS -a`, as an artist would
// on the machine, and returns how long the process took, the sum of the frame times Blender
// printed (scene sync, render and save of each frame, without start-up and scene load), and
// where the frames are.
func blendersOwn(ctx context.Context, dir string, bundle *bundle.Bundle, st render.Settings, w blenderWorkload) (total, frames time.Duration, out string, err error) {
	sc, err := unpack(bundle, filepath.Join(dir, "own-scene"))
	if err != nil {
		return 0, 0, "", err
	}
	out = filepath.Join(dir, "own")
	script := filepath.Join(dir, "own.py")
	if err := os.WriteFile(script, []byte(blendertest.OwnRenderSettings(st, false)), 0o644); err != nil {
		return 0, 0, "", err
	}
	args := []string{"-b", sc.Blend(), "--factory-startup", "--disable-autoexec", "-t", strconv.Itoa(w.workers),
		"--python-exit-code", "1", "--python", script,
		"-o", filepath.Join(out, "own_####"), "-s", strconv.Itoa(w.first), "-e", strconv.Itoa(w.last), "-a"}
	start := time.Now()
	log, err := exec.CommandContext(ctx, w.binary, args...).CombinedOutput()
	total = time.Since(start)
	if err != nil {
		return 0, 0, "", fmt.Errorf("blender's own render: %v\n%s", err, log)
	}
	frames, n := blenderFrameTimes(string(log))
	if want := w.last - w.first + 1; n != want {
		return 0, 0, "", fmt.Errorf("blender's own render printed %d frame times, want %d:\n%s", n, want, log)
	}
	return total, frames, out, nil
}

// frameTime is the line Blender prints after each frame it renders from the command line:
// " Time: 00:00.52 (Saving: 00:00.00)".
var frameTime = regexp.MustCompile(`(?m)^ Time: (\d+):(\d+\.\d+) \(Saving`)

// blenderFrameTimes sums the frame times in a Blender log and counts them.
func blenderFrameTimes(log string) (time.Duration, int) {
	var sum time.Duration
	ms := frameTime.FindAllStringSubmatch(log, -1)
	for _, m := range ms {
		min, _ := strconv.Atoi(m[1])
		sec, _ := strconv.ParseFloat(m[2], 64)
		sum += time.Duration((float64(min)*60 + sec) * float64(time.Second))
	}
	return sum, len(ms)
}

func readFrame(path string) (*raster.Frame, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return raster.DecodeEXR(data)
}

func reportBlenderFarm(r reporter, run blenderRun) {
	r.ReportMetric(ratio(run.farm, run.own), "farm/blender")
	r.ReportMetric(ratio(run.farm, run.ownFrames), "farm/blender-render")
	r.ReportMetric(run.cold.Seconds(), "cold-frame-s")
	r.ReportMetric(rate(run.frames, run.farm), "frames/s")
	r.ReportMetric(rate(run.frames, run.own), "blender-frames/s")
	r.ReportMetric(run.worst, "max-rel-diff")
	r.ReportMetric(float64(run.ties), "crypto-tie-pixels")
}

// passSetup unpacks the example Blender scene and starts a one-process pool (closed when tb
// ends) for tiles of spp samples in as many 1-sample passes.
func passSetup(tb testing.TB, ctx context.Context, spp int) (*blender.Pool, *blender.Scene, render.Settings) {
	tb.Helper()
	bundle := loadBlender(tb, ctx)
	sc, err := unpack(bundle, tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	st, err := blenderWorkload{spp: spp, passes: spp}.settings(bundle)
	if err != nil {
		tb.Fatal(err)
	}
	pool := blender.NewPool(blender.Options{Binary: blendertest.Binary(tb), Dir: tb.TempDir()})
	tb.Cleanup(func() { pool.Close() })
	return pool, sc, st
}

// passStats renders passes of one tile on one Blender process and returns where their time
// went: Blender's render calls, and the whole passes.
func passStats(ctx context.Context, pool *blender.Pool, sc *blender.Scene, st render.Settings, r render.Rect, passes int) (blender.Stats, error) {
	var total blender.Stats
	for range passes {
		t, err := blender.NewTile(ctx, pool, sc, st, 1, r)
		if err != nil {
			return total, err
		}
		if err := t.Render(ctx, 0, st.SPP); err != nil {
			return total, err
		}
		s := t.Stats()
		total.Passes += s.Passes
		total.Blender += s.Blender
		total.Total += s.Total
	}
	return total, nil
}

func reportPass(r reporter, s blender.Stats) {
	n := float64(s.Passes)
	r.ReportMetric((s.Total-s.Blender).Seconds()*1e3/n, "overhead-ms/pass")
	r.ReportMetric(s.Blender.Seconds()*1e3/n, "blender-ms/pass")
	r.ReportMetric(ratio(s.Total-s.Blender, s.Blender), "overhead/blender")
}

// exampleFarm is the example Blender shot at its own settings (160x120, 32 spp), 4 passes,
// the default tile size for Blender scenes (256 px: one tile a frame), frames 1-6, on 2 workers
// warmed up by frame 24.
var exampleFarm = blenderWorkload{first: 1, last: 6, warmup: 24, workers: 2}

// BenchmarkBlenderFarm renders frames of the example Blender scene through a farm of 2
// in-process workers and with Blender's own command line on 2 threads, and reports
// farm/blender (1.0 = the farm costs nothing over Blender rendering the frames itself).
func BenchmarkBlenderFarm(b *testing.B) {
	ctx, base := benchContext(b), b.TempDir()
	bundle := loadBlender(b, ctx)
	w := exampleFarm
	w.binary = blendertest.Binary(b)
	var total blenderRun
	for b.Loop() {
		r, err := measureBlenderFarm(ctx, base, bundle, w)
		if err != nil {
			b.Fatal(err)
		}
		total = total.add(r)
	}
	reportBlenderFarm(b, total)
}

// BenchmarkBlenderPass renders 1-sample passes of a 64x64 tile of the example on one Blender
// process, and reports the adapter's cost per pass beyond Blender's own render call.
func BenchmarkBlenderPass(b *testing.B) {
	ctx := benchContext(b)
	pool, sc, st := passSetup(b, ctx, 1)
	tile := render.Rect{X0: 48, Y0: 28, X1: 112, Y1: 92}
	if _, err := passStats(ctx, pool, sc, st, tile, 2); err != nil { // start Blender, open the scene
		b.Fatal(err)
	}
	var total blender.Stats
	for b.Loop() {
		s, err := passStats(ctx, pool, sc, st, tile, 10)
		if err != nil {
			b.Fatal(err)
		}
		total.Passes += s.Passes
		total.Blender += s.Blender
		total.Total += s.Total
	}
	reportPass(b, total)
}

// measurePlate renders the plate's frames 1-2 (two view layers, 116 channels, a compositor tree
// and a File Output node, multilayer EXR: docs/design.md, "Blender scenes") (a) with
// `blender -b plate.blend -t WORKERS -a`, timed as a whole process, and (b) through a warm
// in-process farm of as many workers, with no format asked (the .blend's own output), from
// submit to completed. Every channel of every farm frame must equal Blender's own to 1e-5, or
// the two did not do the same work.
func measurePlate(ctx context.Context, base, binary, plate string, workers int) (blenderRun, error) {
	dir, err := os.MkdirTemp(base, "plate-*")
	if err != nil {
		return blenderRun{}, err
	}
	defer os.RemoveAll(dir)
	k := blendscene.New(blendscene.Options{Binaries: []string{binary}}, scene.Env{Dir: filepath.Join(dir, "inspect")})
	b, err := k.Read(ctx, plate)
	k.Close()
	if err != nil {
		return blenderRun{}, err
	}
	data, err := os.ReadFile(plate)
	if err != nil {
		return blenderRun{}, err
	}
	own := filepath.Join(dir, "own")
	if err := os.MkdirAll(own, 0o755); err != nil {
		return blenderRun{}, err
	}
	if err := os.WriteFile(filepath.Join(own, "plate.blend"), data, 0o644); err != nil {
		return blenderRun{}, err
	}
	start := time.Now()
	log, err := exec.CommandContext(ctx, binary, "-b", filepath.Join(own, "plate.blend"), "--factory-startup", "--disable-autoexec",
		"-t", strconv.Itoa(workers), "-a").CombinedOutput()
	r := blenderRun{own: time.Since(start), frames: 2}
	if err != nil {
		return blenderRun{}, fmt.Errorf("blender's own render: %v\n%s", err, log)
	}
	if r.ownFrames, _ = blenderFrameTimes(string(log)); r.ownFrames == 0 {
		return blenderRun{}, fmt.Errorf("blender's own render printed no frame times:\n%s", log)
	}
	ks := kinds.Builtin(kinds.Options{Blender: blendscene.Options{Binaries: []string{binary}}}, scene.Env{Dir: filepath.Join(dir, "worker"), Slots: workers})
	defer ks.Close()
	n, err := node.StartCoordinator(ctx, node.CoordinatorOptions{DataDir: filepath.Join(dir, "farm"), Queue: queue.DefaultConfig(),
		Workers: workers, Kinds: ks, Log: quietLogger()})
	if err != nil {
		return blenderRun{}, err
	}
	defer n.Close()
	if _, err := client.UploadScene(ctx, n.Coord, b, 0, nil); err != nil {
		return blenderRun{}, err
	}
	submit := func(first, last, spp int) (string, time.Duration, error) {
		start := time.Now()
		res, err := n.Coord.Submit(ctx, api.SubmitRequest{SceneVersion: b.Version(), First: first, Last: last, SPP: spp})
		if err != nil {
			return "", 0, err
		}
		_, err = waitCompleted(ctx, n.Coord, res.Status.JobID)
		return res.Status.JobID, time.Since(start), err
	}
	if _, r.cold, err = submit(1, 1, 4); err != nil { // other frames: the workers warm up
		return blenderRun{}, err
	}
	job, elapsed, err := submit(1, 2, 0)
	if err != nil {
		return blenderRun{}, err
	}
	r.farm = elapsed
	for f := 1; f <= 2; f++ {
		got, err := n.Coord.FrameOutput(ctx, job, f, blender.FormatBlend)
		if err != nil {
			return blenderRun{}, err
		}
		want, err := os.ReadFile(filepath.Join(own, "render", fmt.Sprintf("plate_%04d.exr", f)))
		if err != nil {
			return blenderRun{}, err
		}
		d, ties, err := channelsDiff(want, got)
		if err != nil {
			return blenderRun{}, err
		}
		r.ties += ties
		if d > 1e-5 {
			return blenderRun{}, fmt.Errorf("%w: plate frame %d differs from Blender's own by %g relative", errMismatch, f, d)
		}
		r.worst = max(r.worst, d)
	}
	return r, nil
}

// channelsDiff is the largest |a-b| / max(|a|, 1) over every channel of two multilayer EXRs,
// matched by name; a channel of want missing in got is an error. Cryptomatte ranks of exactly
// equal coverage are compared in one canonical order (cryptoCanonical) and counted: their order
// is the one Cycles met the ids in, which a tile rendered in passes cannot know (docs/design.md,
// "Known limits of this design").
func channelsDiff(want, got []byte) (worst float64, tieSwaps int, err error) {
	a, _, err := raster.DecodeEXRChannels(want)
	if err != nil {
		return 0, 0, err
	}
	b, _, err := raster.DecodeEXRChannels(got)
	if err != nil {
		return 0, 0, err
	}
	if a.Width != b.Width || a.Height != b.Height {
		return 0, 0, fmt.Errorf("sizes differ: %dx%d and %dx%d", a.Width, a.Height, b.Width, b.Height)
	}
	ta, err := cryptoCanonical(a)
	if err != nil {
		return 0, 0, err
	}
	tb, err := cryptoCanonical(b)
	if err != nil {
		return 0, 0, err
	}
	for px := range ta {
		if !tb[px] {
			tieSwaps++
		}
	}
	for px := range tb {
		if !ta[px] {
			tieSwaps++
		}
	}
	ka, kb := len(a.Names), len(b.Names)
	for i, name := range a.Names {
		j := slices.Index(b.Names, name)
		if j < 0 {
			return 0, 0, fmt.Errorf("channel %s is missing", name)
		}
		for px := 0; px < a.Width*a.Height; px++ {
			x, y := float64(a.Pix[px*ka+i]), float64(b.Pix[px*kb+j])
			worst = max(worst, math.Abs(x-y)/max(math.Abs(x), 1))
		}
	}
	return worst, tieSwaps, nil
}

// cryptoRank is a Cryptomatte channel: layer.CryptoObject00.r is rank 0's id, .g its coverage,
// .b rank 1's id, .a its coverage.
var cryptoRank = regexp.MustCompile(`^(.*Crypto[A-Za-z]+)(\d\d)\.([rgba])$`)

// cryptoPixel is a pixel of one Cryptomatte pass.
type cryptoPixel struct {
	pass string
	px   int
}

// cryptoCanonical reorders, in every pixel of every Cryptomatte pass of f, each run of ranks of
// exactly equal coverage by their ids' bits, and returns the pixels of each pass it changed.
func cryptoCanonical(f *raster.Frame) (map[cryptoPixel]bool, error) {
	groups := map[string][]int{} // pass -> channel index of rank r's id at 2r, coverage at 2r+1
	for i, name := range f.Names {
		m := cryptoRank.FindStringSubmatch(name)
		if m == nil {
			continue
		}
		level, _ := strconv.Atoi(m[2])
		rank := 2*level + strings.IndexByte("rgba", m[3][0])/2
		slot := 2*rank + strings.IndexByte("rgba", m[3][0])%2
		g := groups[m[1]]
		for len(g) <= slot {
			g = append(g, -1)
		}
		g[slot] = i
		groups[m[1]] = g
	}
	k, reordered := len(f.Names), map[cryptoPixel]bool{}
	for pass, g := range groups {
		if slices.Contains(g, -1) || len(g)%2 != 0 {
			return nil, fmt.Errorf("cryptomatte pass %s lacks a channel", pass)
		}
		for px := 0; px < f.Width*f.Height; px++ {
			p := f.Pix[px*k : px*k+k]
			changed := false
			for r := 1; r < len(g)/2; r++ { // insertion sort, ids ascending within equal coverage
				for q := r; q > 0 && p[g[2*q+1]] == p[g[2*q-1]] && math.Float32bits(p[g[2*q]]) < math.Float32bits(p[g[2*q-2]]); q-- {
					p[g[2*q]], p[g[2*q-2]] = p[g[2*q-2]], p[g[2*q]]
					changed = true
				}
			}
			if changed {
				reordered[cryptoPixel{pass, px}] = true
			}
		}
	}
	return reordered, nil
}

// BenchmarkBlenderPlate renders the plate's two frames, every layer, pass and the compositor,
// through a farm of 2 in-process workers and with Blender's own command line on 2 threads, and
// reports farm/blender.
func BenchmarkBlenderPlate(b *testing.B) {
	ctx, base := benchContext(b), b.TempDir()
	var total blenderRun
	for b.Loop() {
		r, err := measurePlate(ctx, base, blendertest.Binary(b), blendertest.Plate(b), 2)
		if err != nil {
			b.Fatal(err)
		}
		total = total.add(r)
	}
	reportBlenderFarm(b, total)
}
