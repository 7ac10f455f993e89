//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/wire"
)

// Jobs that wait for jobs (docs/operations.md, "Jobs and workers": Jobs that wait for jobs), as the farm
// records them: the order of its EVENTS stream (the worker publishes tile.started once it holds
// a tile's lease, frame.assembled once a frame's outputs are promoted) and each event's time.

// recorded is one event of a frame as the farm recorded it.
type recorded struct {
	seq  uint64    // its EVENTS stream sequence: the order the farm saw things in
	time time.Time // when its worker published it
}

// frameEvents reads every event of the farm's EVENTS stream and returns, per frame key, the
// first tile.started and the first frame.assembled.
func frameEvents(t *testing.T, f *farmProc) (started, assembled map[string]recorded) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	stream, err := f.js().Stream(ctx, queue.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	started, assembled = map[string]recorded{}, map[string]recorded{}
	for last := uint64(0); last < info.State.LastSeq; {
		batch, err := cons.Fetch(256, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			meta, err := m.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			last = meta.Sequence.Stream
			var ev wire.Event
			if err := json.Unmarshal(m.Data(), &ev); err != nil {
				t.Fatalf("event %d: %v", last, err)
			}
			into := map[string]map[string]recorded{wire.EventTileStarted: started, wire.EventFrameAssembled: assembled}[ev.Type]
			if _, seen := into[ev.FrameKey]; into != nil && !seen {
				into[ev.FrameKey] = recorded{seq: last, time: ev.Time}
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatal(err)
		}
		if n == 0 {
			t.Fatalf("EVENTS ended at %d, before its last sequence %d", last, info.State.LastSeq)
		}
	}
	return started, assembled
}

// frameKeys maps a job's frame numbers to their frame keys.
func frameKeys(t *testing.T, f *farmProc, job string) map[int]string {
	t.Helper()
	st, r := f.status(job)
	if r.code != 0 {
		t.Fatalf("status %s: %s", job, r)
	}
	out := map[int]string{}
	for _, fr := range st.Frames {
		out[fr.Frame] = fr.FrameKey
	}
	return out
}

// Property: a job submitted --after another dispatches nothing until it completed: its first
// tile leases after the other's last frame was assembled. One submitted --after-frames starts
// frame N after frame N of the other completed, and before the other's last frame did (frame by
// frame, not job by job). While they wait, status exits 42 saying what they wait for, and jobs
// lists it.
func TestJobsStartAfterTheJobsTheyWaitFor(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	f := startServe(t, t.TempDir())
	// 4 tiles a frame; each job its own frames (another spp is another frame key).
	settings := func(spp string) []string {
		return []string{scene, "--frames", "1-3", "--width", "96", "--height", "54", "--tile", "48", "--spp", spp}
	}
	up, r := f.submit(settings("8")...)
	if r.code != 42 {
		t.Fatalf("submit the upstream: %s", r)
	}
	after, r := f.submit(append(settings("4"), "--after", up.JobID)...)
	if r.code != 42 || after.State != api.JobWaiting || after.WaitingFor != "job "+up.JobID {
		t.Fatalf("submit --after: want waiting for %s, exit 42: %s", up.JobID, r)
	}
	// Frame by frame, in the high band: released frames go before the upstream's rest.
	byFrame, r := f.submit(append(settings("2"), "--after-frames", up.JobID, "--priority", "10")...)
	if r.code != 42 || byFrame.State != api.JobWaiting {
		t.Fatalf("submit --after-frames: want waiting, exit 42: %s", r)
	}
	if st, r := f.status(after.JobID); r.code != 42 || st.State != api.JobWaiting {
		t.Fatalf("status of the waiting job: %s", r)
	}
	if text := f.cli("status", after.JobID).stdout; !strings.Contains(text, "waiting for job "+up.JobID) || !strings.Contains(text, "after "+up.JobID+" completed") {
		t.Fatalf("status does not say what the job waits for:\n%s", text)
	}
	if r := f.cli("jobs"); r.code != 0 || !strings.Contains(r.stdout, "waiting") || !strings.Contains(r.stdout, "frames 1-3 of job "+up.JobID) {
		t.Fatalf("jobs does not list what the waiting jobs wait for: %s", r)
	}

	// One slot, a pause after each pass: frames render one at a time, seen apart.
	f.worker("w", t.TempDir(), "--concurrency", "1", "--fault-pass-delay", "40ms")
	for _, job := range []string{after.JobID, byFrame.JobID} {
		if done := f.waitDone(job, 2*time.Minute); done.State != api.JobCompleted {
			t.Fatalf("job %s: %+v", job, done)
		}
	}
	started, assembled := frameEvents(t, f)
	upFrames, afterFrames, byFrames := frameKeys(t, f, up.JobID), frameKeys(t, f, after.JobID), frameKeys(t, f, byFrame.JobID)
	var upLast recorded
	for n := 1; n <= 3; n++ {
		a, ok := assembled[upFrames[n]]
		if !ok {
			t.Fatalf("no frame.assembled of upstream frame %d", n)
		}
		if a.seq > upLast.seq {
			upLast = a
		}
	}
	for n := 1; n <= 3; n++ {
		s := started[afterFrames[n]]
		if s.seq <= upLast.seq || s.time.Before(upLast.time) {
			t.Errorf("--after: frame %d's first tile started at event %d (%s), before the upstream's last frame was assembled at event %d (%s)",
				n, s.seq, s.time.Format(time.StampMicro), upLast.seq, upLast.time.Format(time.StampMicro))
		}
		s, a := started[byFrames[n]], assembled[upFrames[n]]
		if s.seq == 0 || s.seq <= a.seq || s.time.Before(a.time) {
			t.Errorf("--after-frames: frame %d's first tile started at event %d (%s), not after upstream frame %d was assembled at event %d (%s)",
				n, s.seq, s.time.Format(time.StampMicro), n, a.seq, a.time.Format(time.StampMicro))
		}
	}
	t.Logf("upstream's last frame assembled at event %d; --after's frames started at events %d, %d, %d; --after-frames' at %d, %d, %d after upstream frames at %d, %d, %d",
		upLast.seq, started[afterFrames[1]].seq, started[afterFrames[2]].seq, started[afterFrames[3]].seq,
		started[byFrames[1]].seq, started[byFrames[2]].seq, started[byFrames[3]].seq,
		assembled[upFrames[1]].seq, assembled[upFrames[2]].seq, assembled[upFrames[3]].seq)
	if first := started[byFrames[1]]; first.seq >= upLast.seq {
		t.Errorf("--after-frames: frame 1 started at event %d, only after the upstream's last frame (event %d): job by job, not frame by frame",
			first.seq, upLast.seq)
	}
}

// Property: a job waiting for a job that fails is blocked (exit 1, saying which job failed);
// once the operator requeues the dead letter and the job completes, it starts and completes.
// The monitor's jobs table shows it waiting with what for, then blocked with why.
func TestBlockedJobStartsWhenItsUpstreamIsRequeued(t *testing.T) {
	t.Parallel() // its own farm on free ports; most of its time is waiting
	scene := example("shot")
	f := startServe(t, t.TempDir(), "--max-failures", "1")
	oneFrame := func(spp string) []string {
		return []string{scene, "--frames", "4", "--width", "96", "--height", "54", "--tile", "48", "--spp", spp}
	}
	up, r := f.submit(oneFrame("8")...)
	if r.code != 42 {
		t.Fatalf("submit the upstream: %s", r)
	}
	down, r := f.submit(append(oneFrame("4"), "--after", up.JobID)...)
	if r.code != 42 {
		t.Fatalf("submit --after: %s", r)
	}
	b := newBrowser(t, "http://"+f.HTTP)
	b.open()
	row := fmt.Sprintf(`document.querySelector('#jobs tr[data-job=%q] [data-col=state]')`, down.JobID)
	b.waitTrue(fmt.Sprintf(`%s?.querySelector('.state')?.textContent === 'waiting' && %[1]s.querySelector('[data-why=waiting]')?.textContent === 'job %s'`, row, up.JobID), 10*time.Second)

	poisoned := f.worker("w", t.TempDir(), "--fault-panic-tile", "4:0,0,48,27")
	st := f.waitCode(down.JobID, 1, time.Minute)
	if st.State != api.JobBlocked || st.BlockedReason != "job "+up.JobID+" failed" || st.TileAttempts != 0 {
		t.Fatalf("the job waiting for a failed job: %+v", st)
	}
	if text := f.cli("status", down.JobID).stdout; !strings.Contains(text, "BLOCKED: job "+up.JobID+" failed") {
		t.Fatalf("status does not say why the job is blocked:\n%s", text)
	}
	b.waitTrue(fmt.Sprintf(`%s?.querySelector('[data-why=blocked]')?.textContent === 'job %s failed'`, row, up.JobID), 10*time.Second)
	b.route("#/jobs/" + down.JobID)
	b.waitTrue(fmt.Sprintf(`document.querySelector('#blocked')?.textContent === 'Blocked: job %s failed'`, up.JobID), 10*time.Second)
	b.screenshot("job-blocked")
	b.clean(false)
	// submit --wait of it again (a cron job's) stops at once: nothing happens without an operator.
	if r := f.cli(append([]string{"submit", "--wait", "--after", up.JobID}, oneFrame("4")...)...); r.code != 1 || !strings.Contains(r.stdout, "blocked") {
		t.Fatalf("submit --wait of the blocked job: want exit 1 at once, saying blocked: %s", r)
	}

	poisoned.Kill()
	f.worker("healthy", t.TempDir())
	dlq := f.cli("dlq", "list")
	lines := strings.Split(strings.TrimSpace(dlq.stdout), "\n")
	if dlq.code != 0 || len(lines) != 2 {
		t.Fatalf("dlq list: want one dead letter: %s", dlq)
	}
	seq := strings.Fields(lines[1])[0]
	if r := f.cli("dlq", "requeue", seq); r.code != 0 {
		t.Fatalf("dlq requeue %s: %s", seq, r)
	}
	done := f.waitCode(down.JobID, 0, time.Minute)
	if done.State != api.JobCompleted || done.BlockedReason != "" {
		t.Fatalf("the job once its upstream was requeued: %+v", done)
	}
	if st, r := f.status(up.JobID); r.code != 0 || st.State != api.JobCompleted {
		t.Fatalf("the requeued upstream: %s", r)
	}
}
