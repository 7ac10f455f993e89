package coordinator

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/render"
)

// Which workers may render a job (docs/design.md, "Dispatch"): its renderer build, chosen here
// among the live workers' at submit, and the tags it requires.

// capabilities are what a live worker announced it can render.
func capabilities(w api.Worker) queue.Capabilities {
	return queue.Capabilities{Builds: w.Builds, Tags: w.Tags}
}

// renderer names the renderer of a build fingerprint: "blender" of "blender/3.4.1 (...) ...".
func renderer(build string) string {
	name, _, _ := strings.Cut(build, "/")
	return name
}

// chooseBuild picks the build that renders a job, so one build renders all of its frames;
// described is the build the job would have by itself (a .blend's: the Blender that inspected
// it, its artist's; a JSON scene's: this coordinator's). Among the live workers carrying the
// tags the job requires and running the scene's renderer: the builds asked for (a part of
// their fingerprint, e.g. "3.4.1" or "cycles-cpu/sse41"), narrowed by fit to those that can
// render the scene (a .blend's line, scene.BuildFilter, which may note its choice); of those,
// described if a worker runs it (nothing changes then), else the build with the most slots.
// With no live worker at all (a farm starting), or none fitting while a worker with the tags
// is still starting its renderers, the artist's build is kept and the job waits for its pool;
// with live workers none of which fits, ErrNoWorker, or bad input when fit refuses them all.
func chooseBuild(described, asked string, requires []string, live []api.Worker, fit scene.BuildFilter) (build, note string, err error) {
	slots := map[string]int{}
	for _, w := range live {
		if !(queue.Pool{Requires: requires}).Serves(capabilities(w)) {
			continue
		}
		for _, b := range w.Builds {
			if renderer(b) == renderer(described) && strings.Contains(b, asked) {
				slots[b] += max(w.Slots, 1)
			}
		}
	}
	builds := make([]string, 0, len(slots))
	for b := range slots {
		builds = append(builds, b)
	}
	slices.SortFunc(builds, func(a, b string) int { return cmp.Or(slots[b]-slots[a], strings.Compare(a, b)) })
	unknown := len(live) == 0 || len(builds) == 0 && starting(requires, live)
	if fit != nil && !unknown && len(builds) > 0 {
		if builds, note, err = fit.FitBuilds(builds); err != nil {
			return "", "", badInput("%v", err)
		}
	}
	switch {
	case unknown && asked == "":
		return described, "", nil
	case unknown:
		return "", "", badInput("no live worker runs a build matching %q yet: submit without --build, or once the farm's workers run", asked)
	case slices.Contains(builds, described) && asked == "":
		return described, note, nil
	case asked != "" && len(builds) > 1:
		return "", "", badInput("--build %q matches %d live builds: %s", asked, len(builds), strings.Join(builds, "; "))
	case len(builds) == 0:
		what := renderer(described)
		if asked != "" {
			what += " build matching " + fmt.Sprintf("%q", asked)
		}
		return "", "", noWorker(what, requires, live)
	}
	return builds[0], note, nil
}

// renderBuild chooses the renderer build that renders a job of a scene of kind, described by
// d, with settings st (chooseBuild): for a renderer whose build is in the frames' identity
// (Settings.Build, a Blender's), it replaces st.Build; for the built-in renderer it is the
// job's alone, starting from this coordinator's own build. A kind that names no build renders
// anywhere (""). The note is for the artist (a .blend rendering on a newer line than its own).
func (c *Coordinator) renderBuild(ctx context.Context, kind scene.Kind, d scene.Description, st *render.Settings, asked string, requires []string, live []api.Worker) (build, note string, err error) {
	fit, _ := d.(scene.BuildFilter)
	if st.Build != "" {
		b, note, err := chooseBuild(st.Build, asked, requires, live, fit)
		st.Build = b
		return b, note, err
	}
	builder, ok := kind.(scene.Builder)
	if !ok {
		if asked != "" {
			return "", "", badInput("build %q: a %s renders with any worker's renderer", asked, kind.Name())
		}
		return "", "", nil
	}
	own, err := builder.Builds(ctx)
	if err != nil || len(own) == 0 {
		return "", "", fmt.Errorf("the coordinator's build of the %s renderer: %w", kind.Name(), cmp.Or(err, errors.New("none")))
	}
	return chooseBuild(own[0], asked, requires, live, fit)
}

// checkPool refuses a job of pool p when workers are live and none of them is in p or may
// soon be (starting).
func checkPool(p queue.Pool, live []api.Worker) error {
	if len(live) == 0 || liveIn(p, live) > 0 || starting(p.Requires, live) {
		return nil
	}
	return noWorker(p.Build, p.Requires, live)
}

// starting reports whether a live worker carrying the tags requires is still starting its
// renderers (api.Worker.Starting): until it reports their builds, a job is not refused.
func starting(requires []string, live []api.Worker) bool {
	return slices.ContainsFunc(live, func(w api.Worker) bool {
		return w.Starting && (queue.Pool{Requires: requires}).Serves(queue.Capabilities{Tags: w.Tags})
	})
}

// liveIn counts the live workers of pool p.
func liveIn(p queue.Pool, live []api.Worker) int {
	n := 0
	for _, w := range live {
		if p.Serves(capabilities(w)) {
			n++
		}
	}
	return n
}

// noWorker is ErrNoWorker for a job needing build (may be "") and requires, listing the live
// workers by what they offer.
func noWorker(build string, requires []string, live []api.Worker) error {
	need := (queue.Pool{Build: build, Requires: requires}).String()
	return fmt.Errorf("%w: it needs %s; the live pools are: %s", api.ErrNoWorker, need, livePools(live))
}

// livePools describes the live workers grouped by what they offer: "tags gpu; blender/...:
// w1, w2 | no tags: w3".
func livePools(live []api.Worker) string {
	groups := map[string][]string{}
	for _, w := range live {
		tags := "no tags"
		if len(w.Tags) > 0 {
			tags = "tags " + strings.Join(w.Tags, ",")
		}
		offer := strings.Join(append([]string{tags}, w.Builds...), "; ")
		groups[offer] = append(groups[offer], w.Name)
	}
	keys := make([]string, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		keys[i] = k + ": " + strings.Join(groups[k], ", ")
	}
	return strings.Join(keys, " | ")
}

// jobPool is the pool of job j's tiles (poolOf with the job's own settings).
func jobPool(j *coorddb.Job) queue.Pool {
	return poolOf(j, &coorddb.Frame{Settings: j.Settings})
}
