package coordinator

import (
	"errors"
	"strings"
	"testing"

	"github.com/tilefarm/tilefarm/blender"
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
			got, _, err := chooseBuild(own, tc.asked, tc.requires, tc.live, nil)
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

// A .blend renders on a live build of the Blender line that saved it, else of the nearest
// newer line, saying so, else it is refused naming its line and the live builds; and never on
// another line than the one that inspected it (docs/design.md, "Blender lines").
func TestChooseBuildByTheFileLine(t *testing.T) {
	const (
		b34 = "blender/3.4.1 (a) cycles-cpu/avx2"
		b42 = "blender/4.2.23 (b) cycles-cpu/avx2"
		b45 = "blender/4.5.15 (c) cycles-cpu/avx2"
		b50 = "blender/5.0.1 (d) cycles-cpu/avx2"
	)
	worker := func(name string, slots int, builds ...string) api.Worker {
		return api.Worker{Name: name, Slots: slots, Builds: builds}
	}
	old := worker("old", 1, b34, b42)   // serves two lines
	many := worker("many", 8, b45, b50) // more slots than any other
	for _, tc := range []struct {
		name             string
		saved, inspected string
		asked            string
		live             []api.Worker
		want             string
		note             string   // a part of the note, "" for none
		refused          []string // parts of the refusal
	}{
		{name: "its own line, though another has more slots", saved: "3.4", inspected: b34, live: []api.Worker{old, many}, want: b34},
		{name: "its own line, inspected by another build of it", saved: "4.5", inspected: "blender/4.5.3 (x) cycles-cpu/avx2", live: []api.Worker{old, many}, want: b45},
		{name: "the nearest newer line, said", saved: "4.3", inspected: b45, live: []api.Worker{old, many}, want: b45, note: "renders on Blender 4.5.15, the nearest newer line"},
		{name: "newer than every live build", saved: "5.0", inspected: b50, live: []api.Worker{old}, refused: []string{"saved by Blender 5.0", "3.4.1, 4.2.23"}},
		{name: "inspected by another line", saved: "4.2", inspected: b45, live: []api.Worker{old, many}, refused: []string{"inspected by Blender 4.5.15", "renders it on 4.2"}},
		{name: "--build chooses a newer line", saved: "4.2", inspected: b50, asked: "5.0.1", live: []api.Worker{old, many}, want: b50, note: "nearest newer"},
		{name: "--build of an older line", saved: "4.5", inspected: b45, asked: "4.2", live: []api.Worker{old, many}, refused: []string{"saved by Blender 4.5", "4.2.23"}},
		{name: "a description of no version fits any build", inspected: b34, live: []api.Worker{many}, want: b45},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &blender.Description{Blend: "shot.blend", Build: tc.inspected, FileVersion: tc.saved}
			got, note, err := chooseBuild(tc.inspected, tc.asked, nil, tc.live, d)
			if tc.refused != nil {
				if !errors.Is(err, api.ErrBadInput) {
					t.Fatalf("chooseBuild = %q, %v; want bad input", got, err)
				}
				for _, part := range tc.refused {
					if !strings.Contains(err.Error(), part) {
						t.Errorf("refusal %q does not say %q", err, part)
					}
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("chooseBuild = %q, %v; want %q", got, err, tc.want)
			}
			if (tc.note == "") != (note == "") || !strings.Contains(note, tc.note) {
				t.Fatalf("note %q, want one saying %q", note, tc.note)
			}
		})
	}
}
