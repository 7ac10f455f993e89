//go:build linux

package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/blender/blendertest"
	"github.com/tilefarm/tilefarm/internal/miniotest"
)

// makeStudio builds a studio-like project (blender/testdata/make_studio.py): shot.blend with a
// linked library and its own texture, an image sequence and single textures, files of size
// bytes beside them; it returns the project's directory.
func makeStudio(t *testing.T, files, size int) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "project")
	blendertest.Run(t, "--python", filepath.Join(blendertest.Root(t), "blender", "testdata", "make_studio.py"), "--",
		blendertest.Example(t), dir, strconv.Itoa(files), strconv.Itoa(size))
	return dir
}

// countFiles counts the regular files under dir: a project's files, each one the scene uses.
func countFiles(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	if err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			n++
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// sentRe reads submit's line about its upload (cli.uploadSummary).
var sentRe = regexp.MustCompile(`sent (\d+) of (\d+) files \(([^)]*)\) and the manifest`)

// sent returns the files submit said it sent and the files the scene has.
func sent(t *testing.T, r result) (files, of int) {
	t.Helper()
	m := sentRe.FindStringSubmatch(r.stderr)
	if m == nil {
		t.Fatalf("submit said nothing of its upload: %s", r)
	}
	files, _ = strconv.Atoi(m[1])
	of, _ = strconv.Atoi(m[2])
	return files, of
}

// frameIsBlendersOwn asserts that frame 1 of job, as `outputs` writes it in EXR, is Blender's
// own render of blend with the example's settings, within float rounding.
func frameIsBlendersOwn(t *testing.T, f *farmProc, job, blend string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "o_####.exr")
	if r := f.cli("outputs", job, "--out", out, "--format", "exr"); r.code != 0 {
		t.Fatalf("outputs: %s", r)
	}
	own := blendertest.ReadEXR(t, blendertest.OwnRender(t, blend, exampleSettings, 1, false))
	if d := blendertest.MaxRelDiff(blendertest.ReadEXR(t, frameFile(out, 1)).Pix, own.Pix); d > 1e-5 {
		t.Fatalf("frame 1 of %s differs from Blender's own render by %g relative, want rounding only", blend, d)
	}
}

// Property: a scene travels by content (docs/design.md, "Scenes by content"). The first submit
// of a project sends every file once; after one texture changes the second sends that file and
// the new manifest, nothing else; a frame of the project (a linked library with its own
// texture, an image sequence, textures) renders equal to Blender's own render of it; and the
// worker's node keeps each file once, by hash, however many jobs use it.
func TestSceneFilesTravelByContent(t *testing.T) {
	t.Parallel()
	m := miniotest.Start(t)
	project := makeStudio(t, 60, 4096)
	blend := filepath.Join(project, "shot.blend")
	f := startServeStore(t, t.TempDir(), m.URL(), m.Env())
	node := t.TempDir()
	f.worker("w", node)
	exr := []string{"--format", "exr"}

	first, r := f.submit(append([]string{blend, "--frames", "1"}, exr...)...)
	if r.code != 42 && r.code != 3 {
		t.Fatalf("first submit: %s", r)
	}
	n, of := sent(t, r)
	// 60 files, the shot, the library, its texture, the example's and the baked point cache:
	// the library's texture is a copy of the example's, the same content, sent once.
	total := countFiles(t, project)
	if of != total || n != total-1 {
		t.Fatalf("the first submit sent %d of %d files, want %d of %d (one content twice)", n, of, total-1, total)
	}
	done := f.waitDone(first.JobID, 2*time.Minute)
	assertExact(t, done)

	// One texture changes: a new scene version, and only that file is sent.
	tex := filepath.Join(project, "tex", "t_0007.png")
	data, err := os.ReadFile(tex)
	if err != nil {
		t.Fatal(err)
	}
	data[0] ^= 0xff
	if err := os.WriteFile(tex, data, 0o644); err != nil {
		t.Fatal(err)
	}
	second, r := f.submit(append([]string{blend, "--frames", "1"}, exr...)...)
	if r.code != 42 && r.code != 3 && r.code != 0 {
		t.Fatalf("second submit: %s", r)
	}
	if n, of := sent(t, r); n != 1 || of != total {
		t.Fatalf("after one texture changed the submit sent %d of %d files, want 1: %s", n, of, r.stderr)
	}
	if second.SceneVersion == first.SceneVersion {
		t.Fatal("a changed texture kept the scene version")
	}
	again := f.waitDone(second.JobID, 2*time.Minute)
	assertExact(t, again)
	if r := f.cli("submit", blend, "--frames", "1", "--format", "exr", "--json"); !strings.Contains(r.stderr, "the farm has this scene already") {
		t.Fatalf("a third submit of the same files: %s", r)
	}

	frameIsBlendersOwn(t, f, second.JobID, blend)
	// The node keeps each content once: the first job's and the changed texture; the point
	// cache was unpacked beside the .blend, where Blender reads it.
	cached := 0
	if err := filepath.WalkDir(filepath.Join(node, "scenes", "content"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && len(d.Name()) == 64 {
			cached++
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if cached != total {
		t.Fatalf("the node's cache holds %d files, want %d (%d contents of the first job, one changed texture)", cached, total, total-1)
	}
	caches, _ := filepath.Glob(filepath.Join(node, "scenes", "blender", second.SceneVersion, "blendcache_shot", "*.bphys"))
	if baked, _ := filepath.Glob(filepath.Join(project, "blendcache_shot", "*.bphys")); len(baked) == 0 || len(caches) != len(baked) {
		t.Fatalf("the worker unpacked %d of the %d baked point cache files", len(caches), len(baked))
	}
	t.Logf("figures: first submit sent %d of %d files, the second 1 and the manifest; cache %d files", total-1, total, cached)
}

// Property: a scene on the studio's shared storage sends nothing but its manifest; a worker
// reads its files from its own mount of the share, verified against the hashes taken at
// submit, and renders it equal to Blender's own; a file changed on the share after submit
// fails its tile with an error naming the file.
func TestSharedStorageSendsOnlyTheManifest(t *testing.T) {
	t.Parallel()
	share := makeStudio(t, 6, 1024)
	blend := filepath.Join(share, "shot.blend")
	// The worker mounts the share elsewhere: a link to it, as a node's own mount point.
	mount := filepath.Join(t.TempDir(), "mnt")
	if err := os.Symlink(share, mount); err != nil {
		t.Fatal(err)
	}
	f := startServe(t, t.TempDir())
	w := f.worker("w", t.TempDir(), "--shared", share+"="+mount)
	st, r := f.submit(blend, "--frames", "1", "--format", "exr", "--shared", share)
	if r.code != 42 && r.code != 3 {
		t.Fatalf("submit: %s", r)
	}
	total := countFiles(t, share)
	if n, of := sent(t, r); n != 0 || of != total || !strings.Contains(r.stderr, strconv.Itoa(total)+" on the share") {
		t.Fatalf("a scene on the share sent %d of %d files: %s", n, of, r.stderr)
	}
	if objs, _ := os.ReadDir(filepath.Join(f.Data, "store", "content")); len(objs) != 0 {
		t.Fatalf("%d files were stored for a scene on the share", len(objs))
	}
	assertExact(t, f.waitDone(st.JobID, 2*time.Minute))
	frameIsBlendersOwn(t, f, st.JobID, blend)

	// A file changed on the share after submit: the worker loading the scene fails the tile,
	// naming the file. Frame 2 is submitted with the files as they are (nothing is sent, the farm
	// has the scene), one changes, and a new worker takes the tile.
	w.Kill()
	late, r := f.submit(blend, "--frames", "2", "--format", "exr", "--shared", share)
	if r.code != 42 || late.SceneVersion != st.SceneVersion || !strings.Contains(r.stderr, "the farm has this scene already") {
		t.Fatalf("submit of another frame of the same scene: %s", r)
	}
	if err := os.WriteFile(filepath.Join(share, "tex", "t_0002.png"), []byte("edited after submit"), 0o644); err != nil {
		t.Fatal(err)
	}
	f.worker("w2", t.TempDir(), "--shared", share+"="+mount)
	failed := f.waitDone(late.JobID, 2*time.Minute)
	if failed.State != "failed" || !strings.Contains(strings.Join(failed.Failures, "\n"), "tex/t_0002.png") ||
		!strings.Contains(strings.Join(failed.Failures, "\n"), "changed since submit") {
		t.Fatalf("a shared file changed after submit: %+v, want the job failed naming tex/t_0002.png", failed)
	}
	t.Log("figures: files uploaded for a shared scene 0")
}
