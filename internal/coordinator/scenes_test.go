package coordinator

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/client"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/objstore"
)

// Property: scene gc deletes the manifests of scenes no job names once they are older than
// its grace, and no other: a scene a job names stays whatever its age, a young one stays, and
// a submission naming a deleted scene is told it is missing (client.IsSceneMissing), so the
// client uploads it again and the job is made (docs/design.md, "Scenes by content").
func TestCollectScenesKeepsWhatJobsName(t *testing.T) {
	h := newHarness(t, Config{})
	shot := shotBundle(t)
	used := h.submit(t, h.request(1, 1, 16, 16, 16))
	orphan := memBundle(t, shot, nil)
	orphan.Scene = bytes.Replace(orphan.Scene, []byte("{"), []byte("{ "), 1) // another version of the same scene
	ov := h.putScene(t, orphan)

	// A file no scene names (an interrupted upload's), and the mesh both scenes name.
	stray := []byte("uploaded, then the submit was interrupted")
	strayRef := api.ContentRef{SHA256: bundle.FromMemory("", nil, map[string][]byte{"s": stray}).Files["s"].SHA256, Size: int64(len(stray))}
	if err := h.c.PutContent(h.ctx, strayRef, bytes.NewReader(stray)); err != nil {
		t.Fatal(err)
	}
	mesh := shot.Files[shot.Names()[0]].SHA256
	if deleted, err := h.c.CollectScenes(h.ctx, time.Hour); err != nil || len(deleted) != 0 {
		t.Fatalf("scene gc within the grace deleted %v, %v", deleted, err)
	}
	h.c.now = func() time.Time { return time.Now().UTC().Add(2 * time.Hour) }
	deleted, err := h.c.CollectScenes(h.ctx, time.Hour)
	if err != nil || !slices.Equal(deleted, []string{ov}) {
		t.Fatalf("scene gc past the grace deleted %v, %v; want the scene no job names, %s", deleted, err, ov)
	}
	if ok, _ := h.c.HasScene(h.ctx, used.Status.SceneVersion); !ok {
		t.Fatal("scene gc deleted the scene a job names")
	}
	if _, err := h.objects.Stat(h.ctx, layout.SceneKey(ov)); !errors.Is(err, objstore.ErrNotFound) {
		t.Fatalf("the collected scene's manifest: %v, want gone", err)
	}
	if _, err := h.objects.Stat(h.ctx, layout.ContentKey(strayRef.SHA256)); !errors.Is(err, objstore.ErrNotFound) {
		t.Fatalf("a file no scene names, past the grace: %v, want gone", err)
	}
	if _, err := h.objects.Stat(h.ctx, layout.ContentKey(mesh)); err != nil {
		t.Fatalf("the mesh a kept scene names: %v, want kept", err)
	}
	req := h.request(1, 1, 16, 16, 16)
	req.SceneVersion = ov
	if _, err := h.c.Submit(h.ctx, req); !client.IsSceneMissing(err) || !errors.Is(err, api.ErrBadInput) {
		t.Fatalf("a submission naming the collected scene: %v, want it missing", err)
	}
	// Uploaded again, the scene's files are there already: only the manifest is stored.
	rep, err := client.UploadScene(h.ctx, h.c, orphan, 0, nil)
	if err != nil || !rep.ManifestSent || rep.SentFiles != 0 {
		t.Fatalf("uploading the collected scene again: %+v, %v", rep, err)
	}
	if _, err := h.c.Submit(h.ctx, req); err != nil {
		t.Fatalf("a submission once the scene is back: %v", err)
	}
}

// Property: a scene's new files cost the store one request each to find them missing and one to
// store them, not one more when the manifest naming them is checked: the coordinator remembers
// what it stored moments ago (stored, freshUpload). A file it did not store is asked about.
func TestManifestCheckTrustsFreshUploads(t *testing.T) {
	h := newHarness(t, Config{})
	files := map[string][]byte{}
	for i := range 20 {
		files[fmt.Sprintf("meshes/m%02d.obj", i)] = []byte(fmt.Sprintf("v 0 0 %d\nv 1 0 0\nv 0 1 0\nf 1 2 3\n", i))
	}
	scene := []byte(`{"settings": {"camera": "c", "width": 8, "height": 6}, "cameras": [{"name": "c", "position": [0,0,3], "look_at": [0,0,0]}],` +
		` "materials": [{"name": "m", "type": "diffuse"}], "objects": [`)
	first := true
	for name := range files {
		if !first {
			scene = append(scene, ',')
		}
		first = false
		scene = append(scene, []byte(`{"type": "mesh", "file": "`+name+`", "material": "m"}`)...)
	}
	scene = append(scene, "]}"...)
	b := bundle.FromMemory("many.json", scene, files)
	counting := objstore.NewCounting(h.objects)
	h.c.objects = counting
	if _, err := client.UploadScene(h.ctx, h.c, b, 0, nil); err != nil {
		t.Fatal(err)
	}
	stats := 0
	for _, r := range counting.Requests() {
		if r.Kind == "Stat" && strings.HasPrefix(r.Key, layout.ContentPrefix) {
			stats++
		}
	}
	if stats != len(files) {
		t.Fatalf("%d stats of content for %d new files, want %d (one each, to find it missing)", stats, len(files), len(files))
	}
	// Past the freshness, the manifest's check asks the store again.
	h.c.now = func() time.Time { return time.Now().UTC().Add(2 * freshUpload) }
	again := bundle.FromMemory("again.json", scene, files)
	again.Scene = append([]byte(" "), again.Scene...)
	before := len(counting.Requests())
	if err := h.c.PutScene(h.ctx, again.Version(), again.Encode()); err != nil {
		t.Fatal(err)
	}
	stats = 0
	for _, r := range counting.Requests()[before:] {
		if r.Kind == "Stat" && strings.HasPrefix(r.Key, layout.ContentPrefix) {
			stats++
		}
	}
	if stats != len(files) {
		t.Fatalf("a manifest checked after the uploads went stale asked about %d files, want %d", stats, len(files))
	}
}

// Property: a file's upload may take as long as a slow link needs: at least 256 KiB a second
// beyond ten minutes, so a 2 GB file is not cut off by the server's 10-minute read timeout.
func TestUploadDeadlineGrowsWithTheFile(t *testing.T) {
	for size, least := range map[int64]time.Duration{0: 10 * time.Minute, 2 << 30: 10*time.Minute + 8192*time.Second} {
		if got := uploadDeadline(size); got < least {
			t.Errorf("uploadDeadline(%d) = %v, want at least %v", size, got, least)
		}
	}
}
