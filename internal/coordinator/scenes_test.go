package coordinator

import (
	"bytes"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
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
