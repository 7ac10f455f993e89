//go:build linux

package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/blender/addon"
	"github.com/tilefarm/tilefarm/blender/blendertest"
	"github.com/tilefarm/tilefarm/internal/api"
)

// The Blender add-on (blender/addon, docs/artists.md), driven in the pinned headless Blender as
// an artist drives its panel: installed from its zip, its scene settings set, its operators
// run against a farm of real processes (internal/e2e/testdata/addon_steps.py runs the steps).

// addonToken is the API token of the add-on tests' farms.
const addonToken = "addon-tests-api-token-0123456789"

// addonStep is one step of addon_steps.py as it reported it.
type addonStep struct {
	Step   string         `json:"step"`
	Result []string       `json:"result"`
	Error  string         `json:"error"` // the ERROR report, if any
	Props  map[string]any `json:"props"` // scene.tilefarm after the step
	Saved  bool           `json:"saved"`
	Dirty  bool           `json:"dirty"`
}

func (s addonStep) prop(name string) string {
	switch v := s.Props[name].(type) {
	case string:
		return v
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case bool:
		return strconv.FormatBool(v)
	}
	return ""
}

// addonFarm starts a coordinator that requires addonToken, with workers of the given names.
func addonFarm(t *testing.T, workers ...string) *farmProc {
	t.Helper()
	tokenFile := filepath.Join(t.TempDir(), "api-token")
	if err := os.WriteFile(tokenFile, []byte(addonToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := newFarm(t, t.TempDir())
	f.Env = []string{"TILEFARM_API_TOKEN=" + addonToken}
	f.restart("--api-token-file", tokenFile)
	for _, w := range workers {
		f.worker(w, t.TempDir(), "--concurrency", "2", "--tags", "cpu")
	}
	return f
}

// exampleCopy copies the Blender example (scene.blend and its texture) into a directory of the
// test's, where the add-on's steps may save it, and returns the .blend's path.
func exampleCopy(t *testing.T) string {
	t.Helper()
	src := filepath.Dir(blenderExample(t))
	dir := t.TempDir()
	for _, name := range []string{"scene.blend", filepath.Join("textures", "checker.png")} {
		data, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "scene.blend")
}

// runAddon installs the add-on from the zip blender/addon writes into a headless Blender (with
// --factory-startup and a user configuration of its own, as a fresh install), runs the steps
// of plan, and returns what each step reported and Blender's output. A Python traceback
// anywhere fails the test: the add-on turns every failure into a report.
func runAddon(t *testing.T, plan ...map[string]any) ([]addonStep, result) {
	t.Helper()
	return runAddonOn(t, blendertest.LineOf(t, "3.4"), plan...)
}

// runAddonOn is runAddon in the Blender of line (its bpy module for the lines from 4.2).
func runAddonOn(t *testing.T, line blendertest.Line, plan ...map[string]any) ([]addonStep, result) {
	t.Helper()
	dir := t.TempDir()
	zipPath := filepath.Join(dir, "tilefarm-addon.zip")
	var zip bytes.Buffer
	if err := addon.WriteZip(&zip); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(zipPath, zip.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	planPath := filepath.Join(dir, "plan.json")
	data, err := json.Marshal(append([]map[string]any{{"install": zipPath}}, plan...))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(planPath, data, 0o644); err != nil {
		t.Fatal(err)
	}
	script, err := filepath.Abs(filepath.Join("testdata", "addon_steps.py"))
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := blendertest.Command(line.Binary, dir, "--python", script, "--", planPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(os.Environ(), "BLENDER_USER_SCRIPTS="+filepath.Join(dir, "scripts"), "BLENDER_USER_CONFIG="+filepath.Join(dir, "config"),
		// Nothing of the test's own environment: the add-on takes the farm from its settings.
		"TILEFARM_API_TOKEN=", "TILEFARM_SERVER=", "TILEFARM_COORDINATOR=",
		// Nor its Blender: the add-on inspects with the very Blender it runs in.
		"TILEFARM_BLENDER=")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(patience * 3 * time.Minute):
		_ = cmd.Process.Kill()
		err = <-done
	}
	r := result{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	if r.code != 0 {
		t.Fatalf("blender with the add-on: %s", r)
	}
	if strings.Contains(r.stdout+r.stderr, "Traceback") {
		t.Fatalf("a Python traceback reached Blender's output:\n%s", r)
	}
	var steps []addonStep
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "TILEFARM_STEP ")
		if !ok {
			continue
		}
		var s addonStep
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			t.Fatalf("step line %q: %v", line, err)
		}
		steps = append(steps, s)
	}
	if len(steps) != len(plan)+1 {
		t.Fatalf("%d steps reported, want %d:\n%s", len(steps), len(plan)+1, r)
	}
	if s := steps[0]; !slices.Contains(s.Result, "FINISHED") || s.Error != "" {
		t.Fatalf("installing the add-on from its zip: %+v\n%s", s, r)
	}
	return steps[1:], r
}

// Property: the add-on submits the saved .blend with its panel's settings, which stick in the
// .blend, through `coordinator submit`, and follows the job to the end: the frames equal
// `tileworker render`'s pixel for pixel.
func TestBlenderAddonSubmitsAndFollowsTheJob(t *testing.T) {
	t.Parallel()
	f := addonFarm(t, "w")
	blend := exampleCopy(t)
	server := "http://" + f.HTTP
	steps, r := runAddon(t,
		map[string]any{"prefs": map[string]any{"coordinator": bins.Path("coordinator"), "token": addonToken}},
		map[string]any{"open": blend},
		map[string]any{"set": map[string]any{"server": server, "use_scene_range": false, "frame_start": 1, "frame_end": 2,
			"priority": 5, "preview": 2, "tile_size": 80, "passes": 2, "requires": "cpu"}},
		map[string]any{"save": true},
		map[string]any{"open": blend},
		map[string]any{"draw": true},
		map[string]any{"op": "submit"},
		map[string]any{"follow": patience * 120},
		map[string]any{"draw": true},
		map[string]any{"wait": 30},
	)
	reopened, before, submitted, followed, drawn, waited := steps[4], steps[5], steps[6], steps[7], steps[8], steps[9]
	for name, want := range map[string]string{"server": server, "use_scene_range": "false", "frame_start": "1", "frame_end": "2",
		"priority": "5", "preview": "2", "tile_size": "80", "passes": "2", "requires": "cpu", "unsplittable": "WHOLE"} {
		if got := reopened.prop(name); got != want {
			t.Errorf("scene.tilefarm.%s = %q after saving and opening the .blend again, want %q", name, got, want)
		}
	}
	if !reopened.Saved || reopened.Dirty {
		t.Fatalf("the reopened .blend: saved %v, dirty %v", reopened.Saved, reopened.Dirty)
	}
	job := submitted.prop("job_id")
	if submitted.Error != "" || !slices.Contains(submitted.Result, "FINISHED") || !strings.HasPrefix(job, "job-") {
		t.Fatalf("tilefarm.submit: %+v\n%s", submitted, r)
	}
	if got, want := submitted.prop("monitor_url"), server+"/#/jobs/"+job; got != want {
		t.Errorf("monitor_url = %q, want %q", got, want)
	}
	if !strings.Contains(r.stdout, "Submitted job "+job) {
		t.Errorf("no report says the job was submitted:\n%s", r.stdout)
	}
	// The upload is reported as submit says it (the scene and its texture, both new to the
	// farm); its progress lines are shown while it runs, never kept as notes.
	if !strings.Contains(r.stdout, "scene.blend: sent 2 of 2 files") || strings.Contains(r.stdout, "uploading ") {
		t.Errorf("the reports do not say what the upload sent, or keep its progress lines:\n%s", r.stdout)
	}
	// Followed as the user interface's timer does, then asked once more with tilefarm.refresh.
	if followed.Error != "" || !slices.Contains(followed.Result, "FINISHED") || followed.prop("job_state") != "completed" ||
		followed.prop("progress") != "100" || !strings.Contains(followed.prop("job_detail"), "frames 2/2") {
		t.Fatalf("following the job: %+v\n%s", followed, r)
	}
	if waited.Error != "" || waited.prop("job_state") != "completed" || waited.prop("progress") != "100" {
		t.Fatalf("tilefarm.refresh of the finished job: %+v\n%s", waited, r)
	}
	// The panel: the settings and the button before, the job, its progress and its monitor link after.
	for _, want := range []string{"prop:server", "prop:frame_start", "prop:priority", "prop:unsplittable", "prop:requires", "operator:tilefarm.submit"} {
		if !slices.Contains(before.Result, want) || !slices.Contains(drawn.Result, want) {
			t.Errorf("the panel does not draw %s: %q, %q", want, before.Result, drawn.Result)
		}
	}
	for _, want := range []string{"label:Job " + job, "label:completed, 100%", "label:frames 2/2, tiles 8/8", "operator:tilefarm.refresh", "operator:wm.url_open"} {
		if !slices.Contains(drawn.Result, want) {
			t.Errorf("the panel of the finished job does not show %q: %q", want, drawn.Result)
		}
	}
	if slices.Contains(before.Result, "operator:tilefarm.refresh") {
		t.Errorf("the panel shows a job before one was submitted: %q", before.Result)
	}

	// The farm has the job as the panel asked for it.
	st, sr := f.status(job)
	if sr.code != 0 || st.State != api.JobCompleted {
		t.Fatalf("status of the add-on's job: %s", sr)
	}
	if st.FirstFrame != 1 || st.LastFrame != 2 || st.Priority != 5 || !slices.Equal(st.Requires, []string{"cpu"}) ||
		st.TilesTotal != 8 || !slices.Equal(st.PreviewFrames, []int{1, 2}) || st.Scene != "scene.blend" {
		t.Fatalf("the add-on's job is not as its panel asked: %s", sr)
	}
	out := filepath.Join(t.TempDir(), "f_####.png")
	if r := f.cli("outputs", job, "--out", out, "--format", "png"); r.code != 0 {
		t.Fatalf("outputs: %s", r)
	}
	for frame := 1; frame <= 2; frame++ {
		samePixels(t, frameFile(out, frame), reference(t, blend, frame, "--passes", "2", "--format", "png", "-j", "2"))
	}
}

// The add-on refuses what the farm would not render as the artist sees it, and reports every
// failure of the farm as a Blender error with its reason, never a traceback: a file never saved,
// unsaved changes, no coordinator command, settings coordinator submit refuses, no token or a
// wrong one, a farm that is down (at submit and while following a job). Nothing reaches the farm.
func TestBlenderAddonReportsWhyItCannotSubmit(t *testing.T) {
	t.Parallel() // its own farm on free ports; most of its time is waiting
	f := addonFarm(t)
	blend := exampleCopy(t)
	server := "http://" + f.HTTP
	down := "http://" + freePort(t) // nothing listens there
	wrong := "not-the-farms-token-0123456789"
	coordinator := bins.Path("coordinator")
	type expectation struct {
		what string
		want []string
	}
	var plan []map[string]any
	expect := map[int]expectation{} // the steps that must report an error, by their index in plan
	step := func(s map[string]any) { plan = append(plan, s) }
	refused := func(op, what string, want ...string) {
		expect[len(plan)] = expectation{what, want}
		step(map[string]any{"op": op})
	}
	step(map[string]any{"prefs": map[string]any{"coordinator": coordinator, "token": addonToken}})
	step(map[string]any{"new": true})
	step(map[string]any{"set": map[string]any{"server": server}})
	refused("submit", "a file never saved", "Save the .blend first", "the farm renders the saved file")
	step(map[string]any{"open": blend})
	step(map[string]any{"dirty": true})
	refused("submit", "unsaved changes", "The .blend has unsaved changes", "save it first")
	// The edit thrown away (headless, a file saved after an edit would open as changed: only the
	// user interface's event loop marks a file saved or opened as unchanged).
	step(map[string]any{"open": blend})
	step(map[string]any{"set": map[string]any{"server": server, "use_scene_range": false, "frame_start": 1, "frame_end": 1}})
	step(map[string]any{"prefs": map[string]any{"coordinator": filepath.Join(t.TempDir(), "coordinator")}})
	refused("submit", "a missing coordinator command", "The coordinator command", "does not exist", "preferences")
	// Another program of the name, here a shell script in a directory with a space and a
	// non-ASCII letter in its name, is not taken for tilefarm's coordinator.
	impostor := filepath.Join(t.TempDir(), "my tools é", "coordinator")
	if err := os.MkdirAll(filepath.Dir(impostor), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(impostor, []byte("#!/bin/sh\necho 'coordinator of trains 1.0'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	step(map[string]any{"prefs": map[string]any{"coordinator": impostor}})
	refused("submit", "another program called coordinator", "is not tilefarm's coordinator", "coordinator of trains 1.0")
	step(map[string]any{"prefs": map[string]any{"coordinator": coordinator}})
	step(map[string]any{"set": map[string]any{"frame_start": 2, "frame_end": 1}})
	refused("submit", "a reversed frame range", "The farm refused the job", "frame range 2-1 is reversed")
	step(map[string]any{"set": map[string]any{"frame_start": 1, "frame_end": 1}})
	step(map[string]any{"prefs": map[string]any{"token": wrong}})
	refused("submit", "a wrong token", "The farm at "+server+" refused the API token", "Preferences > Add-ons > tilefarm")
	step(map[string]any{"prefs": map[string]any{"token": ""}})
	refused("submit", "no token", "The farm at "+server+" needs its API token", "Preferences > Add-ons > tilefarm")
	step(map[string]any{"prefs": map[string]any{"token": addonToken}})
	step(map[string]any{"set": map[string]any{"server": down}})
	refused("submit", "a farm that is down", "busy or unreachable", "coordinator unavailable at "+down, "connection refused")
	step(map[string]any{"set": map[string]any{"job_id": "job-0123456789abcdef01234567", "job_server": down}})
	refused("refresh", "following a job on a farm that is down", "The farm at "+down+" is unreachable", "Connection refused")
	step(map[string]any{"set": map[string]any{"job_server": server}})
	step(map[string]any{"prefs": map[string]any{"token": wrong}})
	refused("refresh", "following a job with a wrong token", "The farm at "+server+" refused the API token")
	step(map[string]any{"prefs": map[string]any{"token": addonToken}})
	refused("refresh", "following a job the farm does not have", "The farm at "+server+" has no job job-0123456789abcdef01234567")
	// Several addresses: the one down is passed over, the farm's answer is the one that answered.
	step(map[string]any{"set": map[string]any{"job_server": down + "," + server}})
	refused("refresh", "following a job at two addresses, the first down", "The farm at "+server+" has no job job-0123456789abcdef01234567")
	other := "http://" + freePort(t)
	step(map[string]any{"set": map[string]any{"job_server": down + "," + other}})
	refused("refresh", "following a job at two addresses, both down", "The farm at "+down+" is unreachable", "The farm at "+other+" is unreachable")

	steps, r := runAddon(t, plan...)
	for at, c := range expect {
		s := steps[at]
		if !strings.HasPrefix(s.Error, "Error: ") || slices.Contains(s.Result, "FINISHED") {
			t.Errorf("%s: want an ERROR report, got %+v\n%s", c.what, s, r.stdout)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(s.Error, w) {
				t.Errorf("%s: the report %q does not say %q", c.what, s.Error, w)
			}
		}
		if s.Step == "submit" && s.prop("job_id") != "" {
			t.Errorf("%s: a job id was set: %+v", c.what, s)
		}
	}
	if !steps[5].Dirty {
		t.Fatalf("the edit did not leave unsaved changes: %+v", steps[5])
	}
	if jobs := f.cli("jobs", "--json"); jobs.code != 0 || strings.Contains(jobs.stdout, "job-") {
		t.Fatalf("a refused submission reached the farm: %s\n%s", jobs, r)
	}
}

// Property: the add-on submits from the artist's Blender of every line, as that line saved the
// file, inspected by that very Blender (its bpy module's Python for the lines from 4.2), and
// says which build the farm chose: the one of the file's line.
func TestBlenderAddonSubmitsOnEveryLine(t *testing.T) {
	t.Parallel()
	lines := blendertest.Lines(t)
	args := []string{"--concurrency", "2", "--tags", "cpu"}
	for _, l := range lines {
		args = append(args, "--blender", l.Binary)
	}
	f := addonFarm(t)
	f.worker("w", t.TempDir(), args...)
	server := "http://" + f.HTTP
	for _, line := range lines {
		t.Run(line.Name, func(t *testing.T) {
			t.Parallel()
			blend := line.SavedWith(t, blenderExample(t), "bpy.ops.file.pack_all()")
			steps, r := runAddonOn(t, line,
				map[string]any{"prefs": map[string]any{"coordinator": bins.Path("coordinator"), "token": addonToken}},
				map[string]any{"open": blend},
				map[string]any{"set": map[string]any{"server": server, "use_scene_range": false, "frame_start": 1, "frame_end": 1, "requires": "cpu"}},
				map[string]any{"save": true},
				map[string]any{"open": blend},
				map[string]any{"op": "submit"},
				map[string]any{"follow": patience * 120},
			)
			submitted, followed := steps[5], steps[6]
			job := submitted.prop("job_id")
			if submitted.Error != "" || !slices.Contains(submitted.Result, "FINISHED") || !strings.HasPrefix(job, "job-") {
				t.Fatalf("tilefarm.submit on %s: %+v\n%s", line.Name, submitted, r)
			}
			if want := "The farm renders it with Blender " + line.Name + "."; !strings.Contains(r.stdout, want) {
				t.Fatalf("no report says %q:\n%s", want, r.stdout)
			}
			if followed.prop("job_state") != "completed" {
				t.Fatalf("following the job on %s: %+v\n%s", line.Name, followed, r)
			}
			if st, sr := f.status(job); sr.code != 0 || !strings.HasPrefix(st.Build, "blender/"+line.Name+".") {
				t.Fatalf("the add-on's job on %s: %s", line.Name, sr)
			}
		})
	}
}
