package bench

import (
	"bytes"
	"context"
	"fmt"
	"image/color"
	"image/png"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/blender/blendertest"
	"github.com/tilefarm/tilefarm/internal/farmtest"
	"github.com/tilefarm/tilefarm/raster"
)

// stillScenes are the .blend files BenchmarkBlenderStill renders, made once per benchmark:
// Cycles' defaults for a final frame (adaptive sampling at the default noise threshold 0.01,
// a grade in the compositor, 16-bit RGBA PNG) in one-frame and four-frame files, and the
// plate (no adaptive sampling, two view layers, a multilayer EXR).
type stillScenes struct {
	one, four, plate string
}

// stillSize is the resolution and samples of the scenes: the benchmark's, or the smoke test's.
type stillSize struct {
	width, height, spp, plateSPP int
}

// makeStills saves the scenes at size, each in its own directory.
func makeStills(tb testing.TB, size stillSize) stillScenes {
	tb.Helper()
	dir := tb.TempDir()
	blendertest.Run(tb, "--python", filepath.Join(blendertest.Root(tb), "blender", "testdata", "make_graded.py"), "--", blendertest.Example(tb), dir)
	graded := filepath.Join(dir, "graded.blend")
	line := blendertest.LineOf(tb, "3.4")
	res := fmt.Sprintf("sc = bpy.context.scene; r = sc.render; r.resolution_x, r.resolution_y = %d, %d; ", size.width, size.height)
	defaults := res + fmt.Sprintf("cy = sc.cycles; cy.samples = %d; cy.use_adaptive_sampling = True; cy.adaptive_threshold = 0.01; cy.adaptive_min_samples = 0; ", size.spp)
	return stillScenes{
		one:   line.SavedWith(tb, graded, defaults+"sc.frame_end = 1"),
		four:  line.SavedWith(tb, graded, defaults+"sc.frame_end = 4"),
		plate: line.SavedWith(tb, blendertest.Plate(tb), res+fmt.Sprintf("sc.cycles.samples = %d; sc.frame_end = 1", size.plateSPP)),
	}
}

// stillRun is whole processes timed from start to exit, cold (a fresh copy of the .blend and
// a fresh --data each time): the farm's `coordinator render` and Blender's own command line,
// run in turn.
type stillRun struct {
	farm, own time.Duration
	runs      int
	ties      int // pixels whose Cryptomatte ranks of equal coverage came in another order (channelsDiff)
}

func (r stillRun) add(o stillRun) stillRun {
	return stillRun{farm: r.farm + o.farm, own: r.own + o.own, runs: r.runs + o.runs, ties: r.ties + o.ties}
}

// stillCase is one comparison: farm flags against Blender flags on one scene.
type stillCase struct {
	blend      string
	farmArgs   []string // after `coordinator render COPY --data DIR`
	ownArgs    []string // between `blender -b COPY` and `-a`
	multilayer bool     // the output is a multilayer EXR (compared by channel), else a PNG
}

// measureStill runs c's farm render and Blender's own in turn, reps times each, and checks
// that every farm output equals Blender's own (sameRenders), or the two did not do the same
// work.
func measureStill(ctx context.Context, base string, bins farmtest.Binaries, binary string, c stillCase, reps int) (stillRun, error) {
	var r stillRun
	for i := range reps {
		dir := filepath.Join(base, fmt.Sprintf("still-%d", i))
		farm, own := filepath.Join(dir, "farm"), filepath.Join(dir, "own")
		for _, d := range []string{farm, own} {
			if err := copyFile(c.blend, filepath.Join(d, filepath.Base(c.blend))); err != nil {
				return r, err
			}
		}
		args := append([]string{"render", filepath.Join(farm, filepath.Base(c.blend)), "--data", filepath.Join(farm, "data")}, c.farmArgs...)
		start := time.Now()
		if out, err := exec.CommandContext(ctx, bins.Path("coordinator"), args...).CombinedOutput(); err != nil {
			return r, fmt.Errorf("coordinator %v: %v\n%s", args, err, out)
		}
		r.farm += time.Since(start)
		args = append(append([]string{"-b", filepath.Join(own, filepath.Base(c.blend))}, c.ownArgs...), "-a")
		start = time.Now()
		if out, err := exec.CommandContext(ctx, binary, args...).CombinedOutput(); err != nil {
			return r, fmt.Errorf("blender %v: %v\n%s", args, err, out)
		}
		r.own += time.Since(start)
		r.runs++
		if err := sameRenders(filepath.Join(own, "render"), filepath.Join(farm, "render"), &r.ties); err != nil {
			return r, err
		}
		if err := os.RemoveAll(dir); err != nil {
			return r, err
		}
	}
	return r, nil
}

// sameRenders compares every file Blender wrote under own (its File Output nodes' included)
// with the farm's at the same path: an EXR within 1e-5 relative in every channel, a PNG within
// one 16-bit level; ties counts the Cryptomatte pixels channelsDiff let pass as tied.
func sameRenders(own, farm string, ties *int) error {
	n := 0
	err := filepath.WalkDir(own, func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		rel, err := filepath.Rel(own, path)
		if err != nil {
			return err
		}
		want, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		got, err := os.ReadFile(filepath.Join(farm, rel))
		if err != nil {
			return fmt.Errorf("%w: the farm wrote no %s", errMismatch, rel)
		}
		n++
		switch strings.ToLower(filepath.Ext(rel)) {
		case ".exr":
			d, t, err := channelsDiff(want, got)
			if err != nil {
				return fmt.Errorf("%s: %w", rel, err)
			}
			*ties += t
			if d > 1e-5 {
				return fmt.Errorf("%w: %s differs from Blender's own by %g relative", errMismatch, rel, d)
			}
		case ".png":
			d, err := pngLevels(want, got)
			if err != nil {
				return fmt.Errorf("%s: %w", rel, err)
			}
			if d > 1 {
				return fmt.Errorf("%w: %s differs from Blender's own by %d 16-bit levels", errMismatch, rel, d)
			}
		default:
			return fmt.Errorf("%s: no comparison for this kind of file", rel)
		}
		return nil
	})
	if err == nil && n == 0 {
		err = fmt.Errorf("blender wrote nothing under %s", own)
	}
	return err
}

func copyFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	return os.WriteFile(to, data, 0o644)
}

// stillCases are the comparisons BenchmarkBlenderStill makes, by metric: the farm as an artist
// runs it on this machine against `blender -b -a` (same cores, one frame and four), and a still
// split across `--workers 2 --threads 1` against `blender -b -t 1 -a` (the speedup of two
// single-thread workers over one thread).
func stillCases(s stillScenes) map[string]stillCase {
	split := []string{"--workers", "2", "--threads", "1"}
	return map[string]stillCase{
		"1frame":      {blend: s.one},
		"4frames":     {blend: s.four},
		"plate-2x1":   {blend: s.plate, farmArgs: split, ownArgs: []string{"-t", "1"}},
		"default-2x1": {blend: s.one, farmArgs: split, ownArgs: []string{"-t", "1"}},
	}
}

// BenchmarkBlenderStill times whole `coordinator render` processes, cold, against Blender's own
// command line on the same files, run in turn, and reports farm/blender for one and four frames
// of a default-settings scene (480x270, 128 spp) with the farm's defaults, and the speedup
// (blender/farm) of `--workers 2 --threads 1` over `blender -t 1` on one frame of the plate
// (480x270, 64 spp) and of the default-settings scene.
func BenchmarkBlenderStill(b *testing.B) {
	ctx, base := benchContext(b), b.TempDir()
	bins, err := coordinatorBinary()
	if err != nil {
		b.Fatal(err)
	}
	cases := stillCases(makeStills(b, stillSize{width: 480, height: 270, spp: 128, plateSPP: 64}))
	total := map[string]stillRun{}
	for b.Loop() {
		for name, c := range cases {
			r, err := measureStill(ctx, base, bins, blendertest.Binary(b), c, 1)
			if err != nil {
				b.Fatalf("%s: %v", name, err)
			}
			total[name] = total[name].add(r)
		}
	}
	reportStill(b, total)
}

func reportStill(r reporter, total map[string]stillRun) {
	r.ReportMetric(ratio(total["1frame"].farm, total["1frame"].own), "1frame-farm/blender")
	r.ReportMetric(ratio(total["4frames"].farm, total["4frames"].own), "4frames-farm/blender")
	r.ReportMetric(ratio(total["plate-2x1"].own, total["plate-2x1"].farm), "plate-2x1-speedup")
	r.ReportMetric(ratio(total["default-2x1"].own, total["default-2x1"].farm), "default-2x1-speedup")
	r.ReportMetric(float64(total["plate-2x1"].ties), "plate-crypto-tie-pixels")
}

// pngLevels is the largest difference of two PNGs' 16-bit non-premultiplied channel values.
func pngLevels(want, got []byte) (int, error) {
	a, err := png.Decode(bytes.NewReader(want))
	if err != nil {
		return 0, fmt.Errorf("blender's own PNG: %w", err)
	}
	b, err := png.Decode(bytes.NewReader(got))
	if err != nil {
		return 0, fmt.Errorf("the farm's PNG: %w", err)
	}
	if a.Bounds() != b.Bounds() {
		return 0, fmt.Errorf("%w: sizes differ: %v and %v", errMismatch, a.Bounds(), b.Bounds())
	}
	worst := 0
	for y := a.Bounds().Min.Y; y < a.Bounds().Max.Y; y++ {
		for x := a.Bounds().Min.X; x < a.Bounds().Max.X; x++ {
			p := color.NRGBA64Model.Convert(a.At(x, y)).(color.NRGBA64)
			q := color.NRGBA64Model.Convert(b.At(x, y)).(color.NRGBA64)
			for _, d := range [4]int{int(p.R) - int(q.R), int(p.G) - int(q.G), int(p.B) - int(q.B), int(p.A) - int(q.A)} {
				worst = max(worst, d, -d)
			}
		}
	}
	return worst, nil
}

// cryptoCanonical orders ranks of exactly equal coverage by id, and only those: a pair of
// ranks swapped at a tie compares equal and is counted, a swap of unequal coverages still
// differs.
func TestCryptoCanonical(t *testing.T) {
	names := []string{"L.CryptoObject00.r", "L.CryptoObject00.g", "L.CryptoObject00.b", "L.CryptoObject00.a"}
	frame := func(px ...float32) *raster.Frame {
		return &raster.Frame{Width: len(px) / 4, Height: 1, Names: names, Pix: px}
	}
	a := frame(7, 0.5, 3, 0.5, 7, 0.75, 3, 0.25)
	b := frame(3, 0.5, 7, 0.5, 7, 0.75, 3, 0.25)
	ra, err := cryptoCanonical(a)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := cryptoCanonical(b)
	if err != nil {
		t.Fatal(err)
	}
	if px := (cryptoPixel{"L.CryptoObject", 0}); !slices.Equal(a.Pix, b.Pix) || !ra[px] || rb[px] || len(ra) != 1 || len(rb) != 0 {
		t.Fatalf("tied ranks: %v and %v, reordered %v and %v", a.Pix, b.Pix, ra, rb)
	}
	c := frame(3, 0.25, 7, 0.75)
	if r, _ := cryptoCanonical(c); len(r) != 0 || c.Pix[0] != 3 {
		t.Fatalf("ranks of unequal coverage were reordered: %v", c.Pix)
	}
}
