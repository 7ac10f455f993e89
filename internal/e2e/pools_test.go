//go:build linux

package e2e

import (
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
)

// Property: a tile reaches only the workers of its pool (docs/design.md, "Dispatch"). A job
// requiring the tag gpu renders only on the gpu worker while the other idles; when the gpu
// worker leaves, status says the job waits for its pool; a job requiring a tag no live worker
// carries is refused at submit with the live pools listed; a worker with the tag finishes the
// job, equal to the reference.
func TestPoolsRouteTilesOnlyToTheirWorkers(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	f := startServe(t, t.TempDir())
	plain := f.worker("w-plain", t.TempDir())
	gpu := f.worker("w-gpu", t.TempDir(), "--tags", "gpu", "--fault-pass-delay", "150ms")
	waitWorkers(t, f, "w-gpu,w-plain", 30*time.Second)
	if r := f.cli("workers"); !regexp.MustCompile(`(?m)^w-gpu .*\sgpu\s`).MatchString(r.stdout) {
		t.Fatalf("workers does not show w-gpu's tag:\n%s", r.stdout)
	}
	st, r := f.submit(append([]string{scene, "--frames", "1", "--requires", "gpu"}, small...)...)
	if r.code != 42 || !strings.HasPrefix(st.Pool, "tilefarm/") || !strings.HasSuffix(st.Pool, ", tagged gpu") || !slices.Equal(st.Requires, []string{"gpu"}) {
		t.Fatalf("submit --requires gpu: pool %q requires %v: %s", st.Pool, st.Requires, r)
	}
	for deadline := time.Now().Add(time.Minute); ; {
		if now, _ := f.status(st.JobID); now.TilesCompleted > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("w-gpu completed no tile of the job:\n%s", gpu.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
	gpu.Signal(syscall.SIGTERM) // hands its tile back and leaves the directory
	if !gpu.WaitExit(15 * time.Second) {
		t.Fatalf("w-gpu did not stop on SIGTERM:\n%s", gpu.Log())
	}
	waitWorkers(t, f, "w-plain", 10*time.Second)
	for deadline := time.Now().Add(10 * time.Second); ; {
		now, _ := f.status(st.JobID)
		if now.State == api.JobCompleted {
			t.Fatalf("the job completed without a worker of its pool: %+v", now)
		}
		if strings.HasSuffix(now.WaitingFor, "tagged gpu") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never said the job waits for its pool: %+v", now)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if r := f.cli("status", st.JobID); !strings.Contains(r.stdout, "waiting for a live worker of the pool: tilefarm/") {
		t.Fatalf("status text does not say what the job waits for:\n%s", r.stdout)
	}

	_, r = f.submit(append([]string{scene, "--frames", "2", "--requires", "highmem"}, small...)...)
	if r.code != 1 || !strings.Contains(r.stderr, "no live worker can render this job") || !strings.Contains(r.stderr, "tagged highmem") ||
		!regexp.MustCompile(`live pools are: no tags[^|]*: w-plain`).MatchString(r.stderr) {
		t.Fatalf("a job no live worker can render: %s", r)
	}
	if _, r := f.submit(append([]string{scene, "--frames", "2", "--requires", "GPU!"}, small...)...); r.code != 1 || !strings.Contains(r.stderr, "tag") {
		t.Fatalf("a malformed tag: %s", r)
	}

	f.worker("w-gpu2", t.TempDir(), "--tags", "highmem,gpu")
	if done := f.waitDone(st.JobID, 2*time.Minute); done.State != api.JobCompleted || done.WaitingFor != "" {
		t.Fatalf("job after a worker of its pool came: %+v", done)
	}
	outputsEqualReference(t, f, st.JobID, scene, []int{1}, small...)
	// w-plain, idle all along, never took a tile or the assembly of the job.
	if strings.Contains(plain.Log(), st.JobID) {
		t.Fatalf("w-plain worked on the gpu job:\n%s", plain.Log())
	}
}

// Property: `submit --max-slots 1` on a farm of 3 slots: never more than one tile of the job
// renders at once, while a job without a limit on the same worker renders three at once.
func TestMaxSlotsLimitsTilesRenderingAtOnce(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	f := startServe(t, t.TempDir())
	w := f.worker("w", t.TempDir(), "--concurrency", "3", "--fault-pass-delay", "40ms", "--checkpoint-every", "0")
	limited, r := f.submit(append([]string{scene, "--frames", "1", "--max-slots", "1"}, small...)...)
	if r.code != 42 || limited.MaxSlots != 1 || !strings.Contains(limited.Pool, "at most 1 slots") {
		t.Fatalf("submit --max-slots 1: %s", r)
	}
	free, _ := f.submit(append([]string{scene, "--frames", "2"}, small...)...)
	for _, job := range []string{limited.JobID, free.JobID} {
		if done := f.waitDone(job, 2*time.Minute); done.State != api.JobCompleted {
			t.Fatalf("job %s: %+v", job, done)
		}
	}
	outputsEqualReference(t, f, limited.JobID, scene, []int{1}, small...)
	if got := maxTilesAtOnce(t, w.Log(), limited.JobID); got != 1 {
		t.Fatalf("the job limited to 1 slot had %d tiles rendering at once", got)
	}
	if got := maxTilesAtOnce(t, w.Log(), free.JobID); got < 2 {
		t.Fatalf("the job without a limit had at most %d tile rendering at once on 3 slots: the measure cannot see concurrency", got)
	}
}

// maxTilesAtOnce is the most tiles of job a worker's log shows in progress at one moment:
// each attempt spans its log lines from the first to the last ("checkpoint saved" after every
// pass, then its completion).
func maxTilesAtOnce(t *testing.T, log, job string) int {
	t.Helper()
	line := regexp.MustCompile(`time=(\S+) .*attempt_id=(\w+) .*job_id=` + regexp.QuoteMeta(job) + `\b`)
	type span struct{ from, to time.Time }
	spans := map[string]*span{}
	for _, m := range line.FindAllStringSubmatch(log, -1) {
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			t.Fatalf("log time %q: %v", m[1], err)
		}
		if s, ok := spans[m[2]]; ok {
			s.to = at
		} else {
			spans[m[2]] = &span{at, at}
		}
	}
	if len(spans) < 2 {
		t.Fatalf("the log shows %d attempts of job %s", len(spans), job)
	}
	most := 0
	for _, a := range spans {
		n := 0
		for _, b := range spans {
			if !b.from.After(a.from) && !b.to.Before(a.from) {
				n++
			}
		}
		most = max(most, n)
	}
	return most
}

// Property: a job's frames render on one Blender build, chosen by the farm among its live
// workers'. A .blend submitted from a machine whose Blender differs from every worker's (its
// CPU kernel the best this CPU has, the worker's capped at sse2) renders on the worker's build
// and equals that worker's local reference bit for bit. With two builds live, the artist's own
// is chosen when a worker runs it, --build picks another, and each job's tiles render only on
// the workers of its build.
func TestBlenderJobsRenderOnTheFarmsBuild(t *testing.T) {
	t.Parallel()
	blend := blenderExample(t)
	f := startServe(t, t.TempDir())
	capped := f.worker("w-sse2", t.TempDir(), "--blender-kernel", "sse2")
	waitWorkers(t, f, "w-sse2", time.Minute)
	first, r := f.submit(blend, "--frames", "1", "--format", "exr")
	if r.code != 42 || !strings.Contains(first.Build, "cycles-cpu/sse2 ") || !strings.Contains(r.stderr, "renders with the farm's") {
		t.Fatalf("submit from a machine of another build: build %q: %s", first.Build, r)
	}
	best := f.worker("w-best", t.TempDir())
	waitWorkers(t, f, "w-best,w-sse2", time.Minute)
	own, r := f.submit(blend, "--frames", "2", "--format", "exr")
	if r.code != 42 || own.Build == first.Build || strings.Contains(r.stderr, "renders with the farm's") {
		t.Fatalf("submit with the artist's build live: build %q: %s", own.Build, r)
	}
	asked, r := f.submit(blend, "--frames", "3", "--format", "exr", "--build", "cycles-cpu/sse2")
	if r.code != 42 || asked.Build != first.Build {
		t.Fatalf("submit --build cycles-cpu/sse2: build %q: %s", asked.Build, r)
	}
	if _, r := f.submit(blend, "--frames", "3", "--format", "exr", "--build", "no-such-build"); r.code != 1 || !strings.Contains(r.stderr, "no live worker") {
		t.Fatalf("submit --build of no live worker: %s", r)
	}
	dir := t.TempDir()
	for _, c := range []struct {
		st     api.Status
		frame  int
		kernel []string
	}{{first, 1, []string{"--blender-kernel", "sse2"}}, {own, 2, nil}, {asked, 3, []string{"--blender-kernel", "sse2"}}} {
		if done := f.waitDone(c.st.JobID, 3*time.Minute); done.State != api.JobCompleted {
			t.Fatalf("job of frame %d: %+v", c.frame, done)
		}
		out := filepath.Join(dir, "f_####.exr")
		if r := f.cli("outputs", c.st.JobID, "--out", out, "--format", "exr"); r.code != 0 {
			t.Fatalf("outputs: %s", r)
		}
		ref := filepath.Join(dir, "ref.exr")
		args := append([]string{"render", blend, "--frame", strconv.Itoa(c.frame), "--out", ref, "--format", "exr", "-q"}, c.kernel...)
		if r := run(t, "tileworker", args...); r.code != 0 {
			t.Fatalf("reference: %s", r)
		}
		sameFloats(t, frameFile(out, c.frame), ref)
	}
	if strings.Contains(capped.Log(), own.JobID) {
		t.Fatalf("w-sse2 worked on the job of the other build:\n%s", capped.Log())
	}
	if log := best.Log(); strings.Contains(log, first.JobID) || strings.Contains(log, asked.JobID) {
		t.Fatalf("w-best worked on a job of the sse2 build:\n%s", log)
	}
}
