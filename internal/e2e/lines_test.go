//go:build linux

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/blender/blendertest"
	"github.com/tilefarm/tilefarm/render"
)

// Property: on one farm whose workers each serve a subset of the Blender lines, a .blend
// renders on the line that saved it (docs/design.md, "Blender lines"): a file of 5.0 sent while
// only 3.4 and 4.2 workers are live is refused at submit, naming its line and the live builds,
// and nothing is queued; once 4.5 and 5.0 workers join, files saved by 3.4, 4.2, 4.5 and 5.0
// each render on their own line, equal to that line's own render, and a file of a line no
// worker runs (4.3) renders on the nearest newer one, 4.5, and submit says so.
func TestBlenderJobsRenderOnTheirOwnLine(t *testing.T) {
	t.Parallel()
	lines := blendertest.Lines(t)
	byName := map[string]blendertest.Line{}
	var all []string // every build, as the artist's machine runs them, to inspect with
	for _, l := range lines {
		byName[l.Name] = l
		all = append(all, "--blender", l.Binary)
	}
	// The example with its texture packed, as each line saves it.
	const pack = "bpy.ops.file.pack_all()"
	saved := map[string]string{}
	for _, l := range lines {
		saved[l.Name] = l.SavedWith(t, blenderExample(t), pack)
	}
	saved["4.3"] = withHeader(t, byName["4.2"], blenderExample(t), "BLENDER-v403")
	f := startServe(t, t.TempDir())
	older := f.worker("older", t.TempDir(), "--blender", byName["3.4"].Binary, "--blender", byName["4.2"].Binary)
	waitBuilds(t, f, "older", "3.4", "4.2")

	st := render.Settings{Camera: "Camera", Width: 96, Height: 72, SPP: 8, Seed: 7}
	small := []string{"--frames", "1", "--width", "96", "--height", "72", "--spp", "8", "--format", "exr"}
	_, r := f.submit(append(append([]string{saved["5.0"]}, small...), all...)...)
	if r.code != 1 || !strings.Contains(r.stderr, "saved by Blender 5.0") || !strings.Contains(r.stderr, "3.4.1, 4.2.23") {
		t.Fatalf("submit of a 5.0 file to 3.4 and 4.2 workers: want it refused naming 5.0 and the live builds, got %s", r)
	}
	if jobs := f.cli("jobs", "--json"); jobs.code != 0 || strings.Contains(jobs.stdout, "job-") {
		t.Fatalf("the refused submit queued something: %s", jobs)
	}

	f.worker("newer", t.TempDir(), "--blender", byName["4.5"].Binary, "--blender", byName["5.0"].Binary)
	waitBuilds(t, f, "newer", "4.5", "5.0")
	for _, name := range []string{"3.4", "4.2", "4.5", "5.0", "4.3"} {
		want := name
		if name == "4.3" {
			want = "4.5"
		}
		job, r := f.submit(append(append([]string{saved[name]}, small...), all...)...)
		if r.code != 42 && r.code != 3 && r.code != 0 {
			t.Fatalf("submit of the %s file: %s", name, r)
		}
		if !strings.HasPrefix(job.Build, "blender/"+want+".") {
			t.Fatalf("the %s file renders with %q, want Blender %s", name, job.Build, want)
		}
		if said := strings.Contains(r.stderr, "renders on Blender 4.5.15, the nearest newer line"); said != (name == "4.3") {
			t.Fatalf("submit of the %s file says it renders on the nearest newer line: %v: %s", name, said, r)
		}
		if done := f.waitDone(job.JobID, time.Minute); done.State != "completed" {
			t.Fatalf("the %s file's job: %+v", name, done)
		}
		out := t.TempDir()
		if r := f.cli("outputs", job.JobID, "--out", filepath.Join(out, "f_####.exr"), "--format", "exr"); r.code != 0 {
			t.Fatalf("outputs: %s", r)
		}
		got, err := filepath.Glob(filepath.Join(out, "*.exr"))
		if err != nil || len(got) != 1 {
			t.Fatalf("outputs of the %s file: %v %v", name, got, err)
		}
		own := blendertest.ReadEXR(t, byName[want].OwnRender(t, saved[name], st, 1, false))
		if d := blendertest.MaxRelDiff(blendertest.ReadEXR(t, got[0]).Pix, own.Pix); d > 1e-5 {
			t.Fatalf("the %s file's frame differs from Blender %s's own render by %g relative", name, want, d)
		}
		t.Logf("the %s file: rendered on %s, within 1e-5 of its own render", name, job.Build)
	}
	if older.Exited() {
		t.Fatal("the older worker died")
	}
	f.assertNoDeadLetters()
}

// withHeader is blend saved uncompressed by line with its header made head: a file as a line
// the farm has no build of would write it (Blender reads the files of older lines, so the
// nearest newer line renders it).
func withHeader(t *testing.T, line blendertest.Line, blend, head string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "other.blend")
	blendertest.RunWith(t, line.Binary, blend, "--python-expr",
		"import bpy; bpy.ops.file.pack_all(); bpy.ops.wm.save_as_mainfile(filepath="+blendertest.PyString(out)+", copy=True, compress=False)")
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) < len(head) || !strings.HasPrefix(string(data), "BLENDER") {
		t.Fatalf("%s does not start with a plain header", out)
	}
	copy(data, head)
	if err := os.WriteFile(out, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}

// waitBuilds waits until the worker name is listed with builds of every one of lines.
func waitBuilds(t *testing.T, f *farmProc, name string, lines ...string) {
	t.Helper()
	c := f.api()
	deadline := time.Now().Add(patience * 30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		ws, err := c.Workers(ctx)
		cancel()
		for _, w := range ws {
			if w.Name != name || w.Starting {
				continue
			}
			if slices.ContainsFunc(lines, func(l string) bool {
				return !slices.ContainsFunc(w.Builds, func(b string) bool { return strings.HasPrefix(b, "blender/"+l+".") })
			}) {
				t.Fatalf("worker %s runs %q, want builds of %q", name, w.Builds, lines)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker %s not listed with its builds: %v %v", name, ws, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Property: a Blender build that is not one is a clear error where it is given: a --blender
// that does not exist at the command line (exit 2), a Python without bpy at submit (exit 1,
// nothing sent) and at a worker's start (logged, and the worker offers only its good builds),
// and a .blend newer than every build of the submitting machine at submit (exit 1).
func TestBlenderBadBuildsAreClearErrors(t *testing.T) {
	t.Parallel()
	const noBpy = "/usr/bin/python3" // Debian's Python, without bpy
	if r := run(t, "tileworker", "--blender", "/nonexistent/blender"); r.code != 2 || !strings.Contains(r.stderr, "/nonexistent/blender is not an executable Blender") {
		t.Fatalf("tileworker --blender of no file: %s", r)
	}
	r := run(t, "coordinator", "submit", blenderExample(t), "--server", "127.0.0.1:1", "--blender", noBpy)
	if r.code != 1 || !strings.Contains(r.stderr, noBpy+`" is not a Blender build`) || !strings.Contains(r.stderr, "cannot import bpy") {
		t.Fatalf("submit with a Python without bpy: %s", r)
	}
	five := blendertest.LineOf(t, "5.0").Saved(t, blenderExample(t))
	r = run(t, "coordinator", "submit", five, "--server", "127.0.0.1:1", "--blender", blendertest.LineOf(t, "3.4").Binary)
	if r.code != 1 || !strings.Contains(r.stderr, "saved by Blender 5.0, which none of this machine's builds can read (blender/3.4.1") {
		t.Fatalf("submit of a 5.0 file with only Blender 3.4: %s", r)
	}

	f := startServe(t, t.TempDir())
	w := f.worker("mixed", t.TempDir(), "--blender", noBpy, "--blender", blendertest.LineOf(t, "3.4").Binary)
	waitBuilds(t, f, "mixed", "3.4")
	ws, err := f.api().Workers(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range ws {
		if n := len(slices.DeleteFunc(slices.Clone(x.Builds), func(b string) bool { return !strings.HasPrefix(b, "blender/") })); n != 1 {
			t.Fatalf("the worker offers %q, want its one good Blender build", x.Builds)
		}
	}
	if log := w.Log(); !strings.Contains(log, "renderer unavailable") || !strings.Contains(log, noBpy) || !strings.Contains(log, "cannot import bpy") {
		t.Fatalf("the worker does not say its Python without bpy is no build:\n%s", log)
	}
}
