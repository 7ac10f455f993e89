//go:build linux

package e2e

import (
	"fmt"
	"image"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/blender/blendertest"
	"github.com/tilefarm/tilefarm/tiles"
)

// The farm writes the file a .blend asks for (docs/design.md, "Blender scenes"): these tests
// hold its output against Blender's own `blender -b FILE -a` of the same .blend, read by
// OpenImageIO channel by channel.

// ownRender copies blend into a fresh directory and renders it there as an artist would on
// line, `blender -b FILE -t 1 -a` (with expr, a Python line run first, e.g. a sample count),
// and returns the directory.
func ownRender(t *testing.T, line blendertest.Line, blend, expr string) string {
	t.Helper()
	dir := copyBlend(t, blend)
	args := []string{filepath.Join(dir, filepath.Base(blend)), "--disable-autoexec", "-t", "1"}
	if expr != "" {
		args = append(args, "--python-expr", expr)
	}
	blendertest.RunWith(t, line.Binary, append(args, "-a")...)
	return dir
}

// eachLine runs test as a parallel subtest for every Blender line the farm supports, with the
// .blend at blend as that line saves it (blendertest.Line.SavedWith, after expr of the line
// if it gives one).
func eachLine(t *testing.T, blend string, expr func(blendertest.Line) string, test func(t *testing.T, line blendertest.Line, blend string)) {
	for _, line := range blendertest.Lines(t) {
		t.Run(line.Name, func(t *testing.T) {
			t.Parallel()
			e := ""
			if expr != nil {
				e = expr(line)
			}
			test(t, line, line.SavedWith(t, blend, e))
		})
	}
}

// denoises says whether a line's build has a denoiser: Blender's own builds have
// OpenImageDenoise, Debian's 3.4 none.
func denoises(line blendertest.Line) bool { return line.Name != "3.4" }

// copyBlend copies a .blend (with no dependencies) into a fresh directory.
func copyBlend(t *testing.T, blend string) string {
	t.Helper()
	dir := t.TempDir()
	data, err := os.ReadFile(blend)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, filepath.Base(blend)), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// outputsUnder lists the files under dir, relative to it, but the .blend and the farm's data.
func outputsUnder(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case d.IsDir() && rel == "data":
			return filepath.SkipDir
		case d.IsDir() || strings.HasSuffix(rel, ".blend"):
			return nil
		}
		out = append(out, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// sameOutputs asserts the farm wrote the files Blender wrote, each equal to Blender's: every
// channel of an EXR within 1e-5 relative and its Cryptomatte header equal, a PNG within one
// level of its depth.
func sameOutputs(t *testing.T, own, farm string) {
	t.Helper()
	want, got := outputsUnder(t, own), outputsUnder(t, farm)
	if !slices.Equal(got, want) {
		t.Fatalf("the farm wrote %q, Blender wrote %q", got, want)
	}
	for _, name := range want {
		a, b := filepath.Join(own, name), filepath.Join(farm, name)
		switch filepath.Ext(name) {
		case ".exr":
			c := blendertest.CompareImages(t, a, b)
			c.Within(t, 1e-5)
			t.Logf("%s: %d channels within 1e-5 of Blender's, Cryptomatte header equal (%d fields), compression %v",
				name, c.Channels, c.CryptoFields, c.Compression)
		case ".png":
			if d := levelDiff(t, decodePNG(t, a), decodePNG(t, b)); d > 1 {
				t.Fatalf("%s differs from Blender's by %d levels", name, d)
			}
		default:
			t.Fatalf("unexpected output %s", name)
		}
	}
}

// levelDiff is the largest difference of two images of the same size in any channel, in
// levels of their depth, failing the test if their depth or channels differ.
func levelDiff(t *testing.T, a, b image.Image) int {
	t.Helper()
	if a.Bounds() != b.Bounds() || fmt.Sprintf("%T", a) != fmt.Sprintf("%T", b) {
		t.Fatalf("images differ in size or kind: %v %T, %v %T", a.Bounds(), a, b.Bounds(), b)
	}
	return blendertest.MaxLevelDiff(a, b)
}

// Property: with no --format, `coordinator render` of the plate writes the files `blender -b
// plate.blend -t 1 -a` writes, by the same names (the multilayer EXR at the .blend's output
// path, the File Output node's PNGs beside it): every channel of Blender's EXR (two view layers,
// their passes, Cryptomatte, denoising data, the composited result) within 1e-5 relative and the
// Cryptomatte header equal, whether a frame is one tile or 37 px tiles, on every Blender line
// (the plate as each line saves it, rendered on that line's build).
func TestBlenderPlateIsBlendersOwnOutput(t *testing.T) {
	t.Parallel()
	eachLine(t, blendertest.Plate(t), nil, func(t *testing.T, line blendertest.Line, plate string) {
		own := ownRender(t, line, plate, "")
		tiles := []string{"37"}
		if line.Name == "3.4" {
			tiles = append(tiles, "") // one tile a frame: the same path on every line
		}
		for _, tile := range tiles {
			farm := copyBlend(t, plate)
			args := []string{"render", filepath.Join(farm, "plate.blend"), "--data", filepath.Join(farm, "data"), "--workers", "2", "--json",
				"--blender", line.Binary}
			if tile != "" {
				args = append(args, "--tile", tile)
			}
			r := run(t, "coordinator", args...)
			if r.code != 0 {
				t.Fatalf("render with --tile %q: %s", tile, r)
			}
			t.Logf("Blender %s, tiles %q:", line.Name, tile)
			sameOutputs(t, own, farm)
		}
	})
}

// Property: a scene as Cycles leaves it for a final frame (adaptive sampling on, and denoising
// where the build has a denoiser) reads neighbouring pixels while rendering, so it renders
// whole, with those settings on, and its compositor's grade runs on the assembled frame: the
// farm's 16-bit RGBA PNG equals Blender's own within one 16-bit level, on every line. Denoised
// on the lines with OpenImageDenoise, it is Blender's own denoised file. Split on request, the
// settings are switched off and submit says so.
func TestBlenderWholeFrameKeepsAdaptiveSamplingAndGrade(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	blendertest.Run(t, "--python", filepath.Join(blendertest.Root(t), "blender", "testdata", "make_graded.py"), "--", blenderExample(t), dir)
	// As each line's new files are: denoising on and, from 4.2, the automatic sampling pattern,
	// where the build has a denoiser (Blender without one fails a render asking for it).
	defaults := func(line blendertest.Line) string {
		if !denoises(line) {
			return ""
		}
		return "cy = bpy.context.scene.cycles; cy.use_denoising = True; cy.sampling_pattern = 'AUTOMATIC'"
	}
	eachLine(t, filepath.Join(dir, "graded.blend"), defaults, func(t *testing.T, line blendertest.Line, graded string) {
		own := ownRender(t, line, graded, "")
		if got := outputsUnder(t, own); !slices.Equal(got, []string{"render/graded_0001.png"}) {
			t.Fatalf("Blender wrote %q", got)
		}
		farm := copyBlend(t, graded)
		// One process with every thread, the production setting of a Blender node.
		r := run(t, "coordinator", "render", filepath.Join(farm, "graded.blend"), "--data", filepath.Join(farm, "data"), "--workers", "1", "--threads", "2", "--json",
			"--blender", line.Binary)
		if r.code != 0 || !strings.Contains(r.stderr, "each frame renders whole") || !strings.Contains(r.stderr, "adaptive sampling") {
			t.Fatalf("render: want it to say the frame renders whole for adaptive sampling, got %s", r)
		}
		denoised := denoises(line)
		if said := strings.Contains(r.stderr, "denoising (OPENIMAGEDENOISE) needs the whole frame"); said != denoised {
			t.Fatalf("render on %s: says it denoises the whole frame: %v, want %v: %s", line.Name, said, denoised, r)
		}
		a, b := decodePNG(t, filepath.Join(own, "render", "graded_0001.png")), decodePNG(t, filepath.Join(farm, "render", "graded_0001.png"))
		if _, ok := b.(*image.NRGBA64); !ok {
			t.Fatalf("the farm's PNG is a %T, want 16-bit RGBA as the .blend asks", b)
		}
		d := levelDiff(t, a, b)
		if d > 1 {
			t.Fatalf("the farm's PNG differs from Blender's own by %d 16-bit levels, want at most 1", d)
		}
		t.Logf("Blender %s (denoised: %v): 16-bit RGBA PNG within %d level of Blender's own", line.Name, denoised, d)
		if line.Name != "3.4" {
			return
		}

		// --split: today's trade, said at submit, one line per setting switched off; the picture
		// is no longer Blender's.
		split := copyBlend(t, graded)
		r = run(t, "coordinator", "render", filepath.Join(split, "graded.blend"), "--data", filepath.Join(split, "data"), "--workers", "2", "--split", "--json",
			"--blender", line.Binary)
		if r.code != 0 || !strings.Contains(r.stderr, "adaptive sampling (noise threshold") || strings.Contains(r.stderr, "renders whole") {
			t.Fatalf("render --split: want it to say adaptive sampling is off, got %s", r)
		}
		if d := levelDiff(t, a, decodePNG(t, filepath.Join(split, "render", "graded_0001.png"))); d <= 1 {
			t.Fatalf("split with adaptive sampling off is within %d level of Blender's own: the test cannot tell the modes apart", d)
		}
	})
}

// A tileworker killed with SIGKILL in the middle of a tile of the plate: its Blender process
// dies with it, and another worker with an empty local directory resumes the tile from the
// remote checkpoint, rendering only the missing passes of every layer and pass (with two
// threads where the victim had one), into the file Blender itself writes; on every Blender line.
func TestBlenderPlateWorkerKilledMidTileResumesElsewhere(t *testing.T) {
	t.Parallel()
	eachLine(t, blendertest.Plate(t), nil, func(t *testing.T, line blendertest.Line, plate string) {
		killMidTile(t, line, plate)
	})
}

// Property: a light pass combines across sample ranges weighted by its colour pass, so a plate
// whose layers have the glossy and transmission light passes without their colour passes
// renders those colour passes in its tiles too (Description.Drop): its tiles still split into
// passes, a worker killed mid-tile is resumed from the checkpoint, and the file written is
// Blender's own, without the colour passes. On 3.4 and on 5.0, which names passes otherwise.
func TestBlenderLightPassWithoutItsColourStillResumes(t *testing.T) {
	t.Parallel()
	noColour := "[setattr(vl, a, False) for vl in bpy.context.scene.view_layers for a in ('use_pass_glossy_color', 'use_pass_transmission_color')]"
	for _, name := range []string{"3.4", "5.0"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			line := blendertest.LineOf(t, name)
			killMidTile(t, line, line.SavedWith(t, blendertest.Plate(t), noColour))
		})
	}
}

func killMidTile(t *testing.T, line blendertest.Line, plate string) {
	f := startServe(t, t.TempDir(), "--ack-wait", "4s", "--lease-ttl", "4s")
	// One tile per frame, 8 passes of 32 samples, each checkpointed remotely as it ends.
	const spp, pass = 256, 32
	settings := []string{"--tile", "96", "--spp", strconv.Itoa(spp), "--passes", strconv.Itoa(spp / pass), "--blender", line.Binary}
	a := f.worker("victim", t.TempDir(), "--checkpoint-every", "0", "--remote-checkpoint-every", "0", "--blender", line.Binary, "--threads", "1")
	st, r := f.submit(append([]string{plate, "--frames", "2"}, settings...)...)
	if r.code != 42 && r.code != 3 {
		t.Fatalf("submit: %s", r)
	}
	if !strings.HasPrefix(st.Build, "blender/"+line.Name+".") {
		t.Fatalf("the job renders with %q, want Blender %s", st.Build, line.Name)
	}
	ft, err := tiles.FrameTiles(st.Frames[0].FrameKey, 96, 72, 96)
	if err != nil || len(ft) != 1 {
		t.Fatalf("tiles of the frame: %v %v", ft, err)
	}
	waitRemoteCheckpoint(t, f, ft[0].Key, 2*pass)
	// The tile's progress shows in the job's status while it renders, pass by pass.
	for deadline := time.Now().Add(10 * time.Second); ; {
		now, _ := f.status(st.JobID)
		if now.SamplesDone >= 2*pass && now.TilesCompleted == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status shows %d/%d samples done while the tile renders, want at least %d", now.SamplesDone, now.SamplesTotal, 2*pass)
		}
		time.Sleep(50 * time.Millisecond)
	}
	children := blenderChildren(t, a.Pid())
	if len(children) == 0 {
		t.Fatal("the victim runs no Blender process")
	}
	a.Kill()
	if now, _ := f.status(st.JobID); now.State == "completed" || now.TilesCompleted != 0 {
		t.Fatalf("the kill landed after the tile was done: %+v", now)
	}
	for _, pid := range children {
		if !processGone(pid, 10*time.Second) {
			t.Fatalf("Blender process %d outlived its killed worker", pid)
		}
	}

	// An empty local directory: only the remote checkpoint. One slot with two threads, where the
	// victim's passes had one (a thread count is in no tile's identity).
	b := f.worker("successor", t.TempDir(), "--blender", line.Binary, "--concurrency", "1", "--threads", "2")
	done := f.waitDone(st.JobID, 4*time.Minute)
	if done.State != "completed" {
		t.Fatalf("job after the kill: %+v", done)
	}
	if done.SamplesRecovered < 2*pass || done.SamplesRecovered%pass != 0 || done.SamplesRecovered >= spp {
		t.Fatalf("samples recovered %d: want whole passes, at least the %d checkpointed before the kill", done.SamplesRecovered, 2*pass)
	}
	// The driver says each pass it renders: the successor rendered only the passes the
	// checkpoint lacked, from the first it lacked.
	passes := regexp.MustCompile(`tilefarm: rendered samples (\d+)-\d+ of tile \S+ of frame \d+ with (\d+) threads`).FindAllStringSubmatch(b.Log(), -1)
	if want := (spp - done.SamplesRecovered) / pass; len(passes) != want || passes[0][1] != strconv.Itoa(done.SamplesRecovered) || passes[0][2] != "2" {
		t.Fatalf("the successor rendered passes from %q, want the %d missing ones from sample %d, with 2 threads", passes, want, done.SamplesRecovered)
	}
	if !strings.Contains(b.Log(), "resuming from checkpoint") {
		t.Fatal("the successor did not say it resumed from the checkpoint")
	}
	farm := t.TempDir()
	if r := f.cli("outputs", st.JobID, "--dir", farm); r.code != 0 {
		t.Fatalf("outputs: %s", r)
	}
	own := ownRender(t, line, plate, fmt.Sprintf("import bpy; sc = bpy.context.scene; sc.cycles.samples = %d; sc.frame_start = sc.frame_end = 2", spp))
	sameOutputs(t, own, farm)
	f.assertNoDeadLetters()
}
