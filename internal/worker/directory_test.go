package worker

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/internal/scene/jsonscene"
)

// slowBuildKind is a kind whose renderer reports its build only once released, as a Blender
// that takes long to start does.
type slowBuildKind struct {
	jsonscene.Kind
	release chan struct{}
}

func (k slowBuildKind) Builds(ctx context.Context) ([]string, error) {
	select {
	case <-k.release:
		return []string{"slow/1"}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Property: a worker is in the directory from its start, with the builds its renderers
// reported so far and Starting set, while a slow renderer starts; its build is listed, and
// Starting cleared, once it reports it. A worker rendering is never missing from
// `coordinator workers`.
func TestWorkerIsListedWhileASlowRendererStarts(t *testing.T) {
	h := newRunHarness(t)
	slow := slowBuildKind{release: make(chan struct{})}
	w, _ := h.workerWith(t, Config{}, scene.Kinds{slow, jsonscene.Kind{}})
	ctx, cancel := context.WithCancel(h.ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = w.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	listed := func(want func(api.Worker) bool) bool {
		ws, err := h.queue.Workers.List(h.ctx)
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(ws, func(x api.Worker) bool { return x.Name == "w1" && want(x) })
	}
	builtin := jsonscene.Build()
	waitFor(t, "the worker listed with the built-in renderer's build while the slow one starts", func() bool {
		return listed(func(x api.Worker) bool { return slices.Equal(x.Builds, []string{builtin}) && x.Starting })
	})
	close(slow.release)
	waitFor(t, "the slow renderer's build listed once it reported it", func() bool {
		return listed(func(x api.Worker) bool {
			return slices.Contains(x.Builds, "slow/1") && slices.Contains(x.Builds, builtin) && !x.Starting
		})
	})
}

// waitFor polls cond for up to 10 s, failing the test with what it waited for.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10 s for %s", what)
		}
	}
}
