//go:build linux

package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Issue 2, must show 1: the reference renderer gives identical pixels for tile sizes 16, 37, 64
// and one full-frame tile.
func TestReferenceRenderTileSizesIdenticalPNG(t *testing.T) {
	t.Parallel()
	for _, ex := range []string{"cornell", "shot"} {
		scene := example(ex)
		var first string
		for _, tile := range []int{16, 37, 64, 4096} {
			out := filepath.Join(t.TempDir(), "t.png")
			r := run(t, "tileworker", "render", scene, "--frame", "3", "--out", out, "-q",
				"--width", "80", "--height", "60", "--spp", "4", "--tile", strconv.Itoa(tile))
			if r.code != 0 {
				t.Fatalf("%s tile %d: %s", ex, tile, r)
			}
			if first == "" {
				first = out
				continue
			}
			samePixels(t, out, first)
		}
	}
}

// Issue 2, bad input: a clear error naming the problem, exit 1, and no output file.
func TestReferenceRenderBadInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct {
		name  string
		scene string
		args  []string
		want  string
	}{
		{"malformed json", write("bad.json", `{"settings": {`), nil, "json"},
		{"unknown material", write("mat.json", strings.Replace(mustRead(t, example("cornell")), `"diffuse"`, `"plastik"`, 1)), nil, "plastik"},
		{"missing obj", write("obj.json", strings.Replace(mustRead(t, example("shot")), "torus.obj", "missing.obj", 1)), nil, "missing.obj"},
		{"absolute asset", write("abs.json", strings.Replace(mustRead(t, example("shot")), "torus.obj", "/etc/passwd", 1)), nil, "/etc/passwd"},
		{"dotdot asset", write("dd.json", strings.Replace(mustRead(t, example("shot")), "torus.obj", "../torus.obj", 1)), nil, ".."},
		{"unknown camera", example("shot"), []string{"--camera", "nope"}, "nope"},
		{"zero spp", example("shot"), []string{"--spp", "-1"}, "spp"},
		{"absurd width", example("shot"), []string{"--width", "100000"}, "width"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out := filepath.Join(dir, "out-"+strings.ReplaceAll(c.name, " ", "_")+".png")
			r := run(t, "tileworker", append([]string{"render", c.scene, "--out", out, "-q"}, c.args...)...)
			if r.code != 1 || !containsFold(r.stderr, c.want) {
				t.Fatalf("want exit 1 naming %q, got %s", c.want, r)
			}
			if _, err := os.Stat(out); err == nil {
				t.Fatalf("bad input left an output file %s", out)
			}
		})
	}
	if r := run(t, "tileworker", "render", example("shot")); r.code != 2 || !strings.Contains(r.stderr, "--out") {
		t.Fatalf("missing --out: want usage error, got %s", r)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(dir, ".*tmp*")); len(leftovers) > 0 {
		t.Fatalf("temp files left behind: %v", leftovers)
	}
}

func mustRead(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// SIGTERM: the worker checkpoints, releases its lease and hands the tile back at once, so a
// successor resumes it long before the ack-wait would have expired. The hand-back is free: with
// --max-deliver 1 the tile's next delivery is no lost one, and nothing is dead-lettered.
func TestWorkerSIGTERMHandsTileBack(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	f := startServe(t, t.TempDir(), "--ack-wait", "60s", "--lease-ttl", "60s", "--max-deliver", "1")
	ckpts := t.TempDir()
	a := f.worker("leaver", ckpts, slowWorker...)
	st, _ := f.submit(append([]string{scene, "--frames", "11"}, oneTile...)...)
	waitCheckpoint(t, a, 4)
	a.Signal(15) // SIGTERM
	if !a.WaitExit(15 * time.Second) {
		t.Fatalf("worker did not exit on SIGTERM:\n%s", a.Log())
	}
	if a.ExitCode() != 0 {
		t.Fatalf("worker exit code %d on SIGTERM:\n%s", a.ExitCode(), a.Log())
	}
	f.worker("successor", ckpts)
	// With a 60 s ack-wait and lease TTL, only a released lease and a Nak let this finish quickly.
	done := f.waitDone(st.JobID, 40*time.Second)
	if done.State != "completed" || done.SamplesRecovered < 4 {
		t.Fatalf("after SIGTERM: %+v", done)
	}
	f.assertNoDeadLetters()
	out := filepath.Join(t.TempDir(), "s_####.png")
	if r := f.cli("outputs", st.JobID, "--out", out); r.code != 0 {
		t.Fatalf("outputs: %s", r)
	}
	samePixels(t, frameFile(out, 11), reference(t, scene, 11, oneTile...))
}
