package coordinator

import (
	"errors"
	"testing"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/queue"
)

// A job is refused only for what the live workers are known not to render: a worker still
// starting its renderers (api.Worker.Starting) has not told its builds yet, so a job it may
// soon render waits for its pool instead of being refused (docs/design.md, "Dispatch").
func TestChooseBuildWaitsForStartingWorkers(t *testing.T) {
	const own, other = "blender/3.4.1 cpu", "blender/4.2.0 cpu"
	ready := api.Worker{Name: "ready", Slots: 2, Builds: []string{other}}
	startingBare := api.Worker{Name: "starting", Slots: 1, Starting: true}
	startingGPU := api.Worker{Name: "gpu", Slots: 1, Starting: true, Tags: []string{"gpu"}}
	for _, tc := range []struct {
		name     string
		asked    string
		requires []string
		live     []api.Worker
		want     string
		err      error // nil, api.ErrNoWorker or api.ErrBadInput
	}{
		{name: "no worker keeps the artist's build", live: nil, want: own},
		{name: "only a starting worker keeps the artist's build", live: []api.Worker{startingBare}, want: own},
		{name: "a ready worker's build is taken", live: []api.Worker{ready, startingBare}, want: other},
		{name: "a starting worker without the tags refuses", requires: []string{"highmem"}, live: []api.Worker{startingBare}, err: api.ErrNoWorker},
		{name: "a starting worker with the tags waits", requires: []string{"gpu"}, live: []api.Worker{ready, startingGPU}, want: own},
		{name: "asked build while starting is a bad request", asked: "4.5", live: []api.Worker{startingBare}, err: api.ErrBadInput},
		{name: "asked build of no ready worker refuses", asked: "4.5", live: []api.Worker{ready}, err: api.ErrNoWorker},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := chooseBuild(own, tc.asked, tc.requires, tc.live)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("chooseBuild = %q, %v; want %v", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("chooseBuild = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// checkPool refuses a pool no live worker serves, unless a worker with its tags is still
// starting and may yet serve it.
func TestCheckPoolWaitsForStartingWorkers(t *testing.T) {
	p := queue.Pool{Build: "tilefarm/pt-2"}
	ready := api.Worker{Name: "ready", Builds: []string{"blender/3.4.1"}}
	starting := api.Worker{Name: "starting", Starting: true}
	if err := checkPool(p, []api.Worker{ready}); !errors.Is(err, api.ErrNoWorker) {
		t.Fatalf("a pool no ready worker serves: %v, want ErrNoWorker", err)
	}
	if err := checkPool(p, []api.Worker{ready, starting}); err != nil {
		t.Fatalf("a pool a starting worker may serve: %v", err)
	}
	if err := checkPool(queue.Pool{Build: p.Build, Requires: []string{"gpu"}}, []api.Worker{ready, starting}); !errors.Is(err, api.ErrNoWorker) {
		t.Fatalf("a pool requiring a tag no worker carries: %v, want ErrNoWorker", err)
	}
	if err := checkPool(p, []api.Worker{{Name: "in", Builds: []string{p.Build}}}); err != nil {
		t.Fatalf("a pool a ready worker serves: %v", err)
	}
}
