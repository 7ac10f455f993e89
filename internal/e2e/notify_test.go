//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/internal/notify"
	"github.com/tilefarm/tilefarm/internal/queue"
)

const notifySecret = "the e2e farm's notification secret"

// hookReceiver is a webhook receiver of the test's own: it verifies every delivery's signature
// and timestamp as docs/operations.md tells receivers to (notify.Verify) and keeps, per path,
// the events it accepted (answered 200). hold, when it returns true for a delivery, holds that
// one until release is closed and then refuses it (503).
type hookReceiver struct {
	*httptest.Server
	hold    func(path string, ev notify.Event) bool
	held    chan struct{} // closed when a delivery is held
	release chan struct{}

	mu       sync.Mutex
	attempts int
	bad      []string
	accepted map[string][]notify.Event // by path
}

func newHookReceiver(t *testing.T) *hookReceiver {
	r := &hookReceiver{accepted: map[string][]notify.Event{}, held: make(chan struct{}), release: make(chan struct{})}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		var ev notify.Event
		valid := notify.Verify([]byte(notifySecret), body, req.Header.Get(notify.TimestampHeader), req.Header.Get(notify.SignatureHeader), time.Now(), notify.DefaultTolerance) == nil &&
			json.Unmarshal(body, &ev) == nil
		r.mu.Lock()
		r.attempts++
		hold := valid && r.hold != nil && r.hold(req.URL.Path, ev)
		if hold {
			r.hold = nil
		}
		r.mu.Unlock()
		if hold {
			close(r.held)
			<-r.release
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if !valid {
			r.bad = append(r.bad, fmt.Sprintf("%s %s %s: %s", req.URL.Path, req.Header.Get(notify.TimestampHeader), req.Header.Get(notify.SignatureHeader), body))
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		r.accepted[req.URL.Path] = append(r.accepted[req.URL.Path], ev)
	}))
	t.Cleanup(func() {
		select {
		case <-r.release:
		default:
			close(r.release)
		}
		r.Close()
	})
	return r
}

// state is how many deliveries were attempted, what each path accepted and what was wrong.
func (r *hookReceiver) state() (int, map[string][]notify.Event, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	acc := map[string][]notify.Event{}
	for p, evs := range r.accepted {
		acc[p] = slices.Clone(evs)
	}
	return r.attempts, acc, slices.Clone(r.bad)
}

// described names events as "type job-prefix [frame]", sorted, for comparing what arrived.
func described(evs []notify.Event) []string {
	var out []string
	for _, ev := range evs {
		s := ev.Type + " " + ev.JobID[:12]
		if ev.Frame != nil {
			s += fmt.Sprintf(" %d", *ev.Frame)
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// The coordinator killed with SIGKILL between recording a job's events and delivering them,
// twice: at the notifier's seam before any delivery of the first event (the kill lands before
// the receiver saw anything), and by the test while the receiver holds the first delivery of a
// completion (it saw no successful delivery of it). After each restart the receiver gets every
// event exactly once, with a valid signature, at the farm-wide URL and the job's own, and the
// NOTIFY stream holds each event once.
func TestNotificationsSurviveCoordinatorKills(t *testing.T) {
	t.Parallel() // its own farm on free ports; most of its time is waiting
	scene := example("shot")
	r := newHookReceiver(t)
	f := newFarm(t, t.TempDir())
	f.Env = append(f.Env, notify.EnvSecret+"="+notifySecret)
	// The job's receiver is the test's own, on loopback, which a job's receivers may not reach
	// by default; the farm-wide one is the operator's and may.
	f.ServeArgs = []string{"--workers", "1", "--notify", r.URL + "/farm", "--notify-allow", "127.0.0.0/8"}
	f.restart("--fault-crash", "notify-before-deliver")

	st1, res := f.submit(append([]string{scene, "--frames", "1-2", "--notify", r.URL + "/job?token=kept-secret", "--notify-frames"}, small...)...)
	if res.code != 42 && res.code != 3 {
		t.Fatalf("submit: %s", res)
	}
	if !f.Coord.WaitExit(60 * time.Second) {
		t.Fatalf("the coordinator did not crash before delivering a notification:\n%s", f.Coord.Log())
	}
	if !strings.Contains(f.Coord.Log(), "fault injection: killing coordinator") || !strings.Contains(f.Coord.Log(), "seam=notify-before-deliver") {
		t.Fatalf("the coordinator exited without reaching the seam:\n%s", f.Coord.Log())
	}
	if attempts, _, _ := r.state(); attempts != 0 {
		t.Fatalf("the receiver saw %d deliveries before the kill; the kill must land before any", attempts)
	}

	f.restart()
	if done := f.waitDone(st1.JobID, 2*time.Minute); done.State != "completed" {
		t.Fatalf("job after the restart: %+v", done)
	}
	if strings.Contains(f.Coord.Log(), "kept-secret") {
		t.Fatal("the coordinator logged a receiver URL's query")
	}
	// Loopback is allowed on this farm, the cloud metadata address is not: submit says so
	// (HTTP 400, exit 1) and how to allow it, without the URL's credentials.
	if _, res := f.submit(append([]string{scene, "--frames", "1", "--notify", "http://ops:hunter2@169.254.169.254/latest/meta-data"}, small...)...); res.code != 1 ||
		!strings.Contains(res.stderr, "169.254.169.254/32 (cloud metadata)") || !strings.Contains(res.stderr, "--notify-allow") || strings.Contains(res.stderr, "hunter2") {
		t.Fatalf("submit with a receiver on the metadata address: %s", res)
	}

	// The second kill: the receiver holds the first delivery of the next job's completion
	// until the coordinator is dead, then refuses it.
	r.mu.Lock()
	r.hold = func(path string, ev notify.Event) bool {
		return path == "/farm" && ev.Type == notify.JobCompleted && ev.JobID != st1.JobID
	}
	r.mu.Unlock()
	st2, res := f.submit(append([]string{scene, "--frames", "3"}, small...)...)
	if res.code != 42 && res.code != 3 && res.code != 0 {
		t.Fatalf("submit: %s", res)
	}
	select {
	case <-r.held:
	case <-time.After(60 * time.Second):
		t.Fatal("the second job's completion was never delivered")
	}
	f.Coord.Kill()
	close(r.release)
	_, acc, _ := r.state()
	for _, ev := range acc["/farm"] {
		if ev.JobID == st2.JobID {
			t.Fatalf("the receiver accepted %s before the kill", ev.Type)
		}
	}
	f.restart()

	want := map[string][]string{
		"/farm": {"frame.completed " + st1.JobID[:12] + " 1", "frame.completed " + st1.JobID[:12] + " 2", "job.completed " + st1.JobID[:12], "job.completed " + st2.JobID[:12]},
		"/job":  {"frame.completed " + st1.JobID[:12] + " 1", "frame.completed " + st1.JobID[:12] + " 2", "job.completed " + st1.JobID[:12]},
	}
	slices.Sort(want["/farm"])
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, acc, _ := r.state()
		if len(acc["/farm"]) >= len(want["/farm"]) && len(acc["/job"]) >= len(want["/job"]) &&
			metricValue(t, f.HTTP, "tilefarm_notifications_pending") == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("deliveries after the restarts: %v", acc)
		}
		time.Sleep(100 * time.Millisecond)
	}
	_, acc, bad := r.state()
	if len(bad) > 0 {
		t.Fatalf("deliveries without a valid signature: %v", bad)
	}
	ids := map[string]bool{}
	for path, evs := range acc {
		if got := described(evs); !slices.Equal(got, want[path]) {
			t.Errorf("%s accepted %v, want each event once: %v", path, got, want[path])
		}
		for _, ev := range evs {
			ids[ev.ID] = true
		}
	}
	if len(ids) != len(want["/farm"]) {
		t.Errorf("the receivers saw %d distinct event ids, want %d: one per event, the same at every URL", len(ids), len(want["/farm"]))
	}

	// A consumer inside the farm reads the same events once each from the NOTIFY stream.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := f.js().OrderedConsumer(ctx, queue.StreamNotify, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.FetchNoWait(100)
	if err != nil {
		t.Fatal(err)
	}
	var published []notify.Event
	for m := range batch.Messages() {
		var ev notify.Event
		if err := json.Unmarshal(m.Data(), &ev); err != nil || m.Subject() != notify.Subject(ev) || !ids[ev.ID] {
			t.Fatalf("NOTIFY holds %s: %s", m.Subject(), m.Data())
		}
		published = append(published, ev)
	}
	if got := described(published); !slices.Equal(got, want["/farm"]) {
		t.Fatalf("NOTIFY holds %v, want each event once: %v", got, want["/farm"])
	}
}
