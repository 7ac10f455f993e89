//go:build linux

package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/queue"
)

// framesCompleted sums the completed tiles of the given frames of a status.
func tilesOfFrames(st api.Status, frames ...int) int {
	n := 0
	for _, f := range st.Frames {
		for _, want := range frames {
			if f.Frame == want {
				n += f.TilesCompleted
			}
		}
	}
	return n
}

// Cancel (with an ETA shown while the job renders): no tile of the cancelled job starts after it (the tile in flight is dropped at its
// next pass), a frame another job also asked for still completes for that job, the cancelled
// job says so with exit 1, and a later job asking for a dropped frame revives it.
func TestCancelDropsTheJobButNotASharedFrame(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	f := startServe(t, t.TempDir())
	w := f.worker("w", t.TempDir(), "--fault-pass-delay", "100ms", "--checkpoint-every", "0")
	a, r := f.submit(append([]string{scene, "--frames", "1-3"}, small...)...)
	if r.code != 42 {
		t.Fatalf("submit A: %s", r)
	}
	b, _ := f.submit(append([]string{scene, "--frames", "3"}, small...)...) // shares frame 3 with A
	deadline := time.Now().Add(time.Minute)
	for {
		st, _ := f.status(a.JobID)
		if st.TilesCompleted >= 1 && st.ETASeconds != nil && *st.ETASeconds > 0 {
			if st.State == api.JobCompleted {
				t.Fatalf("job A finished before the cancel: %+v", st)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job A made no progress, or status gave no ETA: %+v", st)
		}
		time.Sleep(100 * time.Millisecond)
	}
	r = f.cli("cancel", a.JobID, "--json")
	var cancelled api.Status
	if err := json.Unmarshal([]byte(r.stdout), &cancelled); err != nil || r.code != 1 || cancelled.State != api.JobCancelled {
		t.Fatalf("cancel: %s", r)
	}
	atCancel := tilesOfFrames(cancelled, 1, 2)
	if atCancel >= 12 {
		t.Fatalf("frames 1-2 were done before the cancel (%d tiles): the cancel hit nothing", atCancel)
	}
	done := f.waitDone(b.JobID, 2*time.Minute)
	if done.State != api.JobCompleted {
		t.Fatalf("job B, sharing frame 3 with the cancelled job: %+v", done)
	}
	outputsEqualReference(t, f, b.JobID, scene, []int{3}, small...)
	if _, err := w.WaitLog(t.Context(), regexp.MustCompile(`dropping tile`), 0, 30*time.Second); err != nil {
		t.Fatalf("the worker never dropped a tile of the cancelled job: %v\n%s", err, w.Log())
	}
	time.Sleep(2 * time.Second) // anything still rendering for A would land now
	st, r := f.status(a.JobID)
	if r.code != 1 || st.State != api.JobCancelled || !strings.Contains(f.cli("status", a.JobID).stdout, "cancelled") {
		t.Fatalf("status of the cancelled job: %s", r)
	}
	// With one slot, at most the tile rendering at the cancel may still finish (if it was on its
	// last pass); no tile of frames 1-2 may start after the cancel.
	if after := tilesOfFrames(st, 1, 2); after > atCancel+1 {
		t.Fatalf("%d tiles of the cancelled job's own frames completed after the cancel (%d before)", after-atCancel, atCancel)
	}
	if r := f.cli("cancel", a.JobID); r.code != 1 || !strings.Contains(r.stdout, "cancelled") {
		t.Fatalf("cancelling again: %s", r)
	}
	if r := f.cli("cancel", b.JobID); r.code != 1 || !strings.Contains(r.stderr, "already completed") {
		t.Fatalf("cancelling a completed job: %s", r)
	}
	if r := f.cli("cancel", "job-nope"); r.code != 1 || !strings.Contains(r.stderr, `no job "job-nope"`) {
		t.Fatalf("cancelling an unknown job: %s", r)
	}
	// A new job asking for a dropped frame gets it rendered after all.
	c, _ := f.submit(append([]string{scene, "--frames", "1"}, small...)...)
	if done := f.waitDone(c.JobID, 2*time.Minute); done.State != api.JobCompleted {
		t.Fatalf("job asking again for a dropped frame: %+v", done)
	}
	outputsEqualReference(t, f, c.JobID, scene, []int{1}, small...)
}

// Priorities are dispatch order: with a large low-priority job queued first, a later
// high-priority job, and a job moved from the low band to the high one with reprioritize,
// are rendered before any tile of the large one.
func TestPriorityRendersTheLaterHighJobFirst(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	f := startServe(t, t.TempDir())
	low, _ := f.submit(append([]string{scene, "--frames", "1-4", "--priority", "-10"}, small...)...)
	high, _ := f.submit(append([]string{scene, "--frames", "5", "--priority", "50"}, small...)...)
	moved, _ := f.submit(append([]string{scene, "--frames", "6", "--priority", "-50"}, small...)...)
	r := f.cli("reprioritize", moved.JobID, "60", "--json")
	var st api.Status
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || r.code != 0 || st.Priority != 60 {
		t.Fatalf("reprioritize: %s", r)
	}
	if r := f.cli("reprioritize", moved.JobID, "500"); r.code != 1 || !strings.Contains(r.stderr, "priority 500") {
		t.Fatalf("reprioritize out of range: %s", r)
	}
	if r := f.cli("reprioritize", moved.JobID, "high"); r.code != 2 {
		t.Fatalf("reprioritize with a word: %s", r)
	}
	// Every tile is queued before any worker runs: 6 frames of 6 tiles, and frame 6's tiles
	// twice (its low-band copies stay behind and are acked as duplicates later).
	js := f.js()
	deadline := time.Now().Add(30 * time.Second)
	for {
		s, err := js.Stream(t.Context(), queue.StreamTiles)
		if err == nil {
			if info, err := s.Info(t.Context()); err == nil && info.State.Msgs >= 42 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the tiles were never all queued")
		}
		time.Sleep(100 * time.Millisecond)
	}
	w := f.worker("w", t.TempDir(), "--checkpoint-every", "0")
	for _, job := range []string{high.JobID, moved.JobID, low.JobID} {
		if done := f.waitDone(job, 3*time.Minute); done.State != api.JobCompleted {
			t.Fatalf("job %s: %+v", job, done)
		}
	}
	// The worker's one slot logs each pass it renders: every pass of the high band comes before
	// the first pass of the low-priority job.
	firstLow, lastHigh := -1, -1
	for i, line := range strings.Split(w.Log(), "\n") {
		if !strings.Contains(line, "checkpoint saved") {
			continue
		}
		switch {
		case strings.Contains(line, "job_id="+low.JobID) && firstLow < 0:
			firstLow = i
		case strings.Contains(line, "job_id="+high.JobID), strings.Contains(line, "job_id="+moved.JobID):
			lastHigh = i
		}
	}
	if firstLow < 0 || lastHigh < 0 || firstLow < lastHigh {
		t.Fatalf("a tile of the low-priority job rendered before the high band was empty (first low pass at line %d, last high at %d)",
			firstLow, lastHigh)
	}
	outputsEqualReference(t, f, moved.JobID, scene, []int{6}, small...)
}

// workersList runs `workers --json`.
func workersList(t *testing.T, f *farmProc) []api.Worker {
	t.Helper()
	r := f.cli("workers", "--json")
	var res struct {
		Workers []api.Worker `json:"workers"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &res) != nil || res.Workers == nil {
		t.Fatalf("workers --json: %s", r)
	}
	return res.Workers
}

func names(ws []api.Worker) string {
	var out []string
	for _, w := range ws {
		out = append(out, w.Name)
	}
	return strings.Join(out, ",")
}

// waitWorkers polls `workers` until the live names are want and none of them is still starting
// its renderers (api.Worker.Starting): until then a worker's builds are not known, and a job
// submitted keeps the artist's build.
func waitWorkers(t *testing.T, f *farmProc, want string, d time.Duration) []api.Worker {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ws := workersList(t, f)
		if names(ws) == want && !slices.ContainsFunc(ws, func(w api.Worker) bool { return w.Starting }) {
			return ws
		}
		if time.Now().After(deadline) {
			t.Fatalf("live workers %q, want %q after %v", names(ws), want, d)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// Blocklisting and the worker directory: `workers` lists real worker processes; a worker that
// fails a job's tiles stops taking them and the job completes on another worker; a killed
// worker leaves the list within its TTL; and a job every live worker blocklisted fails, saying so.
func TestBlocklistedWorkerStopsTakingTheJob(t *testing.T) {
	t.Parallel() // its own farm on free ports; most of its time is waiting
	scene := example("shot")
	f := startServe(t, t.TempDir())
	// w-bad fails tile (0,0)-(32,27) of frame 1, whatever the job, and blocklists a job at once.
	bad := f.worker("w-bad", t.TempDir(), "--fault-panic-tile", "1:0,0,32,27", "--blocklist-after", "1", "--checkpoint-every", "0")
	good := f.worker("w-good", t.TempDir(), "--checkpoint-every", "0")
	ws := waitWorkers(t, f, "w-bad,w-good", 30*time.Second)
	for _, w := range ws {
		if w.Slots != 1 || w.Host == "" || time.Since(w.LastSeen) > queue.WorkerTTL {
			t.Fatalf("worker entry %+v", w)
		}
	}
	// w-good is frozen right after a heartbeat, so w-bad takes the job's tiles, and w-good still
	// counts as live for the TTL. Its last pull request expires on the server well before the
	// job is submitted, so no tile is delivered to the frozen process.
	for deadline := time.Now().Add(20 * time.Second); ; {
		fresh := false
		for _, w := range workersList(t, f) {
			fresh = fresh || (w.Name == "w-good" && time.Since(w.LastSeen) < 500*time.Millisecond)
		}
		if fresh {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("w-good never beat")
		}
		time.Sleep(50 * time.Millisecond)
	}
	good.Signal(syscall.SIGSTOP)
	time.Sleep(time.Second)
	q, _ := f.submit(append([]string{scene, "--frames", "1"}, small...)...)
	if _, err := bad.WaitLog(t.Context(), regexp.MustCompile(`blocklisting job`), 0, 30*time.Second); err != nil {
		t.Fatalf("w-bad never blocklisted the job: %v\n%s", err, bad.Log())
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, _ := f.status(q.JobID)
		if strings.Join(st.BlocklistedWorkers, ",") == "w-bad" {
			if st.State == api.JobCompleted || st.State == api.JobFailed {
				t.Fatalf("job ended while w-good was frozen: %+v", st)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never showed w-bad blocklisting the job: %+v", st)
		}
		time.Sleep(200 * time.Millisecond)
	}
	var blocked []string
	for _, w := range workersList(t, f) {
		if w.Name == "w-bad" {
			blocked = w.Blocklisted
		}
	}
	if strings.Join(blocked, ",") != q.JobID {
		t.Fatalf("workers shows w-bad blocklisting %v, want [%s]", blocked, q.JobID)
	}
	good.Signal(syscall.SIGCONT)
	if done := f.waitDone(q.JobID, 2*time.Minute); done.State != api.JobCompleted {
		t.Fatalf("job on the healthy worker: %+v", done)
	}
	outputsEqualReference(t, f, q.JobID, scene, []int{1}, small...)
	// After blocklisting the job, w-bad rendered none of its tiles: it handed them all back.
	badLog := bad.Log()
	after := badLog[strings.Index(badLog, "blocklisting job"):]
	if regexp.MustCompile(`checkpoint saved.*job_id=` + q.JobID).MatchString(after) {
		t.Fatalf("w-bad rendered a tile of the job after blocklisting it:\n%s", badLog)
	}
	if !strings.Contains(after, "handing back a tile of a blocklisted job") {
		t.Fatalf("w-bad never had to hand back a tile of the job it blocklisted:\n%s", badLog)
	}
	// A killed worker leaves the list within its TTL.
	good.Kill()
	killed := time.Now()
	waitWorkers(t, f, "w-bad", queue.WorkerTTL+10*time.Second)
	t.Logf("killed worker gone after %v", time.Since(killed).Round(time.Second))
	// Every live worker blocklisted the next job: it fails, saying so, instead of bouncing.
	p, _ := f.submit(scene, "--frames", "1", "--spp", "4", "--width", "96", "--height", "54", "--tile", "32")
	failed := f.waitDone(p.JobID, time.Minute)
	text := f.cli("status", p.JobID)
	if failed.State != api.JobFailed || text.code != 1 || !strings.Contains(text.stdout, "every live worker of its pool (w-bad) blocklisted") {
		t.Fatalf("job every worker blocklisted: %s", text)
	}
}

// Property: hand-backs are free. A worker that blocklisted a job sits idle while the healthy
// worker is kept busy by another job: it takes the job's one tile again each time the tile
// comes back unclaimed and hands it back, more often than MaxDeliver (3 here, so the test
// need not outwait the growing grace a blocklisting worker leaves the others), without a hot
// loop. The tile is never dead-lettered, and renders on the healthy worker once it is free.
func TestBlocklistHandBacksNeverDeadLetterAHealthyTile(t *testing.T) {
	t.Parallel() // its own farm on free ports; most of its time is waiting
	scene := example("shot")
	const maxDeliver = 3
	f := startServe(t, t.TempDir(), "--max-deliver", strconv.Itoa(maxDeliver))
	good := f.worker("w-good", t.TempDir(), "--fault-pass-delay", "1500ms", "--passes", "24", "--checkpoint-every", "0")
	busy, _ := f.submit(scene, "--frames", "2", "--width", "64", "--height", "36", "--spp", "48", "--tile", "64")
	waitCheckpoint(t, good, 2) // w-good renders the busy job's one tile for about 36 s
	// w-bad fails the other job's one tile and blocklists the job at once.
	bad := f.worker("w-bad", t.TempDir(), "--concurrency", "2", "--fault-panic-tile", "1:0,0,64,36", "--blocklist-after", "1")
	start := time.Now()
	tiny := []string{"--width", "64", "--height", "36", "--spp", "2", "--tile", "64"} // two passes on w-good
	q, _ := f.submit(append([]string{scene, "--frames", "1"}, tiny...)...)
	handBack := regexp.MustCompile(`handing back a tile of a blocklisted job.* delivery=(\d+)`)
	maxDelivery := 0
	for deadline := time.Now().Add(90 * time.Second); maxDelivery <= maxDeliver; {
		if st, _ := f.status(q.JobID); st.State == api.JobFailed || st.TilesFailed != 0 {
			t.Fatalf("the handed-back tile failed (delivery %d):\n%s", maxDelivery, f.cli("status", q.JobID).stdout)
		}
		for _, m := range handBack.FindAllStringSubmatch(bad.Log(), -1) {
			n, _ := strconv.Atoi(m[1])
			maxDelivery = max(maxDelivery, n)
		}
		if time.Now().After(deadline) {
			t.Fatalf("w-bad handed the tile back only up to delivery %d:\n%s", maxDelivery, bad.Log())
		}
		time.Sleep(250 * time.Millisecond)
	}
	if st, _ := f.status(busy.JobID); st.State == api.JobCompleted {
		t.Fatalf("the healthy worker was idle before the hand-backs passed MaxDeliver: %+v", st)
	}
	// No hot loop: at most about one hand-back a second per slot.
	if n, secs := strings.Count(bad.Log(), "handing back a tile of a blocklisted job"), time.Since(start).Seconds(); float64(n) > 2*(secs+2) {
		t.Fatalf("w-bad handed back %d times in %.0f s: a hot loop", n, secs)
	}
	if done := f.waitDone(q.JobID, 2*time.Minute); done.State != api.JobCompleted || done.TilesFailed != 0 {
		t.Fatalf("job after more than MaxDeliver hand-backs: %+v", done)
	}
	f.assertNoDeadLetters()
	outputsEqualReference(t, f, q.JobID, scene, []int{1}, tiny...)
}

// Backpressure: over --max-pending-tiles a submission gets HTTP 429 with a Retry-After and the
// CLI exits 75 saying when to retry; a resubmission of a known job is still answered.
func TestBackpressureRefusesWithRetryAfter(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	f := startServe(t, t.TempDir(), "--workers", "0", "--max-pending-tiles", "10")
	first, r := f.submit(append([]string{scene, "--frames", "1"}, small...)...) // 6 tiles
	if r.code != 42 {
		t.Fatalf("first submission: %s", r)
	}
	_, r = f.submit(append([]string{scene, "--frames", "2"}, small...)...) // 6 more: 12 > 10
	if r.code != 75 || !regexp.MustCompile(`retry in \d+s`).MatchString(r.stderr) || !strings.Contains(r.stderr, "limit of 10 pending tiles") {
		t.Fatalf("submission over the limit: %s", r)
	}
	if again, r := f.submit(append([]string{scene, "--frames", "1"}, small...)...); r.code != 42 || again.JobID != first.JobID {
		t.Fatalf("resubmission of a known job while busy: %s", r)
	}
	body, _ := json.Marshal(api.SubmitRequest{SceneVersion: first.SceneVersion, First: 3, Last: 3, Width: 96, Height: 54,
		SPP: 8, TileSize: 32})
	resp, err := http.Post("http://"+f.HTTP+"/v1/jobs", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	secs, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if resp.StatusCode != http.StatusTooManyRequests || err != nil || secs < 1 {
		t.Fatalf("HTTP submission over the limit: %s, Retry-After %q", resp.Status, resp.Header.Get("Retry-After"))
	}
	if r := f.cli("jobs"); r.code != 0 || strings.Count(r.stdout, "job-") != 1 {
		t.Fatalf("a refused submission left a job behind: %s", r)
	}
}

// JSON logs are the default off a terminal, and every line of a tile's life carries its job,
// frame, tile, attempt and worker.
func TestJSONLogsByDefault(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	f := startServe(t, t.TempDir())
	w := startEnv(t, []string{"TILEFARM_LOG_FORMAT="}, "tileworker", "--nats", f.NATSURL(), "--store", f.Store,
		"--checkpoints", t.TempDir(), "--name", "wj", "--concurrency", "1", "--log-level", "debug", "--checkpoint-every", "0")
	st, _ := f.submit(append([]string{scene, "--frames", "1"}, small...)...)
	if done := f.waitDone(st.JobID, time.Minute); done.State != api.JobCompleted {
		t.Fatalf("job: %+v", done)
	}
	w.Signal(syscall.SIGTERM)
	w.WaitExit(30 * time.Second)
	tileLines := 0
	sc := bufio.NewScanner(strings.NewReader(w.Log()))
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("a log line that is not JSON: %q", sc.Text())
		}
		if _, ok := line["tile_key"]; !ok {
			continue
		}
		tileLines++
		for _, k := range []string{"job_id", "frame_key", "attempt_id", "worker", "time", "level", "msg"} {
			if _, ok := line[k]; !ok {
				t.Errorf("tile log line without %s: %s", k, sc.Text())
			}
		}
		if line["job_id"] != st.JobID || line["worker"] != "wj" {
			t.Errorf("tile log line names another job or worker: %s", sc.Text())
		}
	}
	if tileLines < 6 {
		t.Fatalf("%d log lines about tiles for a 6-tile job:\n%s", tileLines, w.Log())
	}
}

// The read commands print one JSON value in the documented shape, and every command exits by
// the contract.
func TestReadCommandsJSONAndExitCodes(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	f := startServe(t, t.TempDir(), "--workers", "1")
	st, _ := f.submit(append([]string{scene, "--frames", "1"}, small...)...)
	f.waitDone(st.JobID, time.Minute)
	for _, c := range []struct {
		args []string
		code int
		keys []string // top-level keys of the JSON value (of its first element for an array)
	}{
		{[]string{"status", st.JobID, "--json"}, 0, []string{"job_id", "state", "frames_total", "frames_completed", "tiles_total", "tiles_completed", "priority", "outputs"}},
		{[]string{"jobs", "--json"}, 0, []string{"job_id", "state", "priority"}},
		{[]string{"workers", "--json"}, 0, []string{"workers"}},
		{[]string{"dlq", "list", "--json"}, 0, nil},
		{[]string{"status", "job-nope", "--json"}, 1, nil},
		{[]string{"watch", st.JobID, "--json"}, 0, []string{"job_id", "state"}},
		{[]string{"reprioritize", "job-nope", "3"}, 1, nil},
		{[]string{"dlq", "requeue", "999"}, 1, nil},
		{[]string{"dlq", "requeue", "x"}, 2, nil},
		{[]string{"cancel"}, 2, nil},
	} {
		r := f.cli(c.args...)
		if r.code != c.code {
			t.Errorf("coordinator %v: exit %d, want %d: %s", c.args, r.code, c.code, r)
			continue
		}
		if c.code != 0 {
			continue
		}
		var v any
		if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
			t.Errorf("coordinator %v: not one JSON value: %v\n%s", c.args, err, r.stdout)
			continue
		}
		if arr, ok := v.([]any); ok {
			if len(arr) == 0 {
				if c.keys != nil {
					t.Errorf("coordinator %v: empty array", c.args)
				}
				continue
			}
			v = arr[0]
		}
		obj, _ := v.(map[string]any)
		for _, k := range c.keys {
			if _, ok := obj[k]; !ok {
				t.Errorf("coordinator %v: no %q in %s", c.args, k, fmt.Sprint(obj))
			}
		}
	}
}
