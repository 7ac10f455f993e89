package node

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/client"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/internal/scene/jsonscene"
	"github.com/tilefarm/tilefarm/internal/scene/scenetest"
	"github.com/tilefarm/tilefarm/internal/worker"
	"github.com/tilefarm/tilefarm/raster"
	"github.com/tilefarm/tilefarm/render"
)

// A kind of scene the farm was never built with renders a job end to end once it is
// registered, and only then: read by its kind, stored and resolved by the coordinator, its
// tiles dispatched over a real JetStream and rendered and assembled by a worker, every pixel of
// every frame what the kind says it is. This is the property that a renderer is one package
// and one registration (docs/design.md, "Renderers").
func TestARegisteredKindRendersThroughTheFarm(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	doc := scenetest.Document{Width: 40, Height: 24, SPP: 6, First: 3, Last: 4}
	path := filepath.Join(t.TempDir(), "ramp"+scenetest.Ext)
	if err := os.WriteFile(path, doc.Encode(), 0o644); err != nil {
		t.Fatal(err)
	}
	kinds := scene.Kinds{scenetest.Gradient{}, jsonscene.Kind{}}
	b, kind, err := kinds.Read(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := kind.(scenetest.Gradient); !ok {
		t.Fatalf("read as a %s, want the gradient kind", kind.Name())
	}

	// A farm that does not know the kind refuses the bundle as bad input.
	plain := startNode(t, ctx, scene.Kinds{jsonscene.Kind{}})
	if _, err := client.UploadScene(ctx, plain.Coord, b, 0, nil); !errors.Is(err, api.ErrBadInput) {
		t.Fatalf("a farm without the kind stored its bundle: %v", err)
	}
	plain.Close()

	n := startNode(t, ctx, kinds)
	if _, err := client.UploadScene(ctx, n.Coord, b, 0, nil); err != nil {
		t.Fatal(err)
	}
	res, err := n.Coord.Submit(ctx, api.SubmitRequest{SceneVersion: b.Version(), SceneFrames: true, Formats: []string{"exr"}})
	if err != nil {
		t.Fatal(err)
	}
	st := res.Status
	if st.FramesTotal != 2 || st.TilesTotal != 2*3*2 {
		t.Fatalf("job of %d frames and %d tiles, want the scene's 2 frames of 3x2 tiles of the kind's 16 px", st.FramesTotal, st.TilesTotal)
	}
	for !st.State.Finished() {
		select {
		case <-ctx.Done():
			t.Fatalf("job still %s: %+v", st.State, st)
		case <-n.Coord.Changed():
		case <-time.After(200 * time.Millisecond):
		}
		if st, err = n.Coord.Status(ctx, st.JobID); err != nil {
			t.Fatal(err)
		}
	}
	if st.State != api.JobCompleted {
		t.Fatalf("job %s: %v", st.State, st.Failures)
	}
	settings, err := doc.Resolve(render.Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	for frame := doc.First; frame <= doc.Last; frame++ {
		data, err := n.Coord.FrameOutput(ctx, st.JobID, frame, "exr")
		if err != nil {
			t.Fatal(err)
		}
		img, err := raster.DecodeEXR(data)
		if err != nil {
			t.Fatal(err)
		}
		if img.Width != doc.Width || img.Height != doc.Height {
			t.Fatalf("frame %d is %dx%d", frame, img.Width, img.Height)
		}
		for y := range doc.Height {
			for x := range doc.Width {
				want := scenetest.Pixel(settings, frame, x, y)
				got := img.Pix[3*(y*img.Width+x):][:3]
				if got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
					t.Fatalf("frame %d pixel (%d,%d) = %v, the kind says %v", frame, x, y, got, want)
				}
			}
		}
		tile, err := n.Coord.TilePNG(ctx, st.JobID, frame, 0)
		if err != nil || len(tile) == 0 {
			t.Fatalf("tile preview of frame %d: %v", frame, err)
		}
	}
}

// startNode starts a coordinator with an embedded JetStream and two in-process workers that
// render the kinds.
func startNode(t *testing.T, ctx context.Context, kinds scene.Kinds) *Coordinator {
	t.Helper()
	n, err := StartCoordinator(ctx, CoordinatorOptions{DataDir: t.TempDir(), Queue: queue.DefaultConfig(), Workers: 2,
		Worker: worker.Config{FetchWait: 250 * time.Millisecond}, Kinds: kinds, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	return n
}
