package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/notify"
	"github.com/tilefarm/tilefarm/internal/wire"
)

var testNotifySecret = []byte("the farm's notification secret")

// notifyHarness is a harness whose coordinator signs notifications.
func notifyHarness(t *testing.T) *harness {
	t.Helper()
	return newHarness(t, Config{Notify: notify.Config{Secret: testNotifySecret}})
}

// notices returns the events recorded and not yet delivered, in the order they were recorded.
func (h *harness) notices(t *testing.T) []notify.Event {
	t.Helper()
	recs, err := h.st.Notifications(h.ctx, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]notify.Event, len(recs))
	for i, r := range recs {
		if err := json.Unmarshal(r.Body, &out[i]); err != nil {
			t.Fatal(err)
		}
		if r.ID != out[i].ID || r.Subject != notify.Subject(out[i]) {
			t.Fatalf("notification %s on %s holds event %+v", r.ID, r.Subject, out[i])
		}
	}
	return out
}

// types lists the events' types, each followed by its frame for a frame event.
func types(evs []notify.Event) string {
	var s []string
	for _, ev := range evs {
		t := ev.Type
		if ev.Frame != nil {
			t += "#" + string(rune('0'+*ev.Frame))
		}
		s = append(s, t)
	}
	return strings.Join(s, " ")
}

// finishFrame completes frame n of job as workers would (completeFrame).
func (h *harness) finishFrame(t *testing.T, job string, n int) {
	t.Helper()
	h.completeFrame(t, h.job(t, job).FrameKey(n))
}

// The event of a job's completion is recorded by the transaction that completes it: it exists
// as soon as that commits, and a transaction that rolls back after recording it leaves neither
// the completion nor the event. Applying the same events again records nothing more.
func TestJobCompletionIsRecordedInItsTransaction(t *testing.T) {
	h := notifyHarness(t)
	req := h.request(1, 1, 32, 32, 32)
	req.Notify = []string{"https://hooks.example.com/render"}
	res := h.submit(t, req)
	job := res.Status.JobID
	fk := h.job(t, job).FrameKey(1)
	h.completeTiles(t, fk)
	h.promoteFormat(t, fk, "png")
	assembled := wire.Event{ID: "assembled", Type: wire.EventFrameAssembled, FrameKey: fk, Formats: []string{"png"}, Time: time.Now().UTC()}

	boom := errors.New("boom")
	var recorded int
	err := h.st.Update(h.ctx, func(tx *coorddb.Tx) error {
		p := h.c.newProjection(h.ctx, tx)
		if err := h.c.applyEvent(p, assembled); err != nil {
			return err
		}
		if _, err := p.flush(); err != nil {
			return err
		}
		recorded = p.notices
		return boom
	})
	if !errors.Is(err, boom) || recorded != 1 {
		t.Fatalf("rolled-back transaction: %v, %d events recorded in it; want boom after 1", err, recorded)
	}
	if evs := h.notices(t); len(evs) != 0 {
		t.Fatalf("a rolled-back completion left events %s", types(evs))
	}
	if st := h.status(t, job); st.State == api.JobCompleted {
		t.Fatal("a rolled-back completion completed the job")
	}

	h.apply(t, assembled)
	evs := h.notices(t)
	if len(evs) != 1 {
		t.Fatalf("events after the completion: %s", types(evs))
	}
	ev := evs[0]
	if ev.Type != notify.JobCompleted || ev.JobID != job || ev.State != "completed" || ev.Frames == nil ||
		*ev.Frames != (notify.Frames{Total: 1, Completed: 1}) || ev.Reason != "" || ev.Frame != nil || !strings.HasPrefix(ev.ID, "ev_") || ev.Scene == "" {
		t.Fatalf("completion event %+v", ev)
	}
	recs, _ := h.st.Notifications(h.ctx, 0, 10)
	if len(recs[0].URLs) != 1 || recs[0].URLs[0] != req.Notify[0] {
		t.Fatalf("the event is owed to %v, want the job's receiver", recs[0].URLs)
	}
	h.apply(t, assembled)
	h.completeTiles(t, fk)
	if evs := h.notices(t); len(evs) != 1 {
		t.Fatalf("the same events applied again recorded more: %s", types(evs))
	}
}

// A cancel is announced once with when it happened; a job that fails is announced failed with
// its first failure, and once retried and failed again, announced failed again.
func TestCancelAndFailuresAreAnnounced(t *testing.T) {
	h := notifyHarness(t)
	cancelled := h.submit(t, h.request(1, 1, 32, 32, 32)).Status.JobID
	if _, err := h.c.Cancel(h.ctx, cancelled); err != nil {
		t.Fatal(err)
	}
	if _, err := h.c.Cancel(h.ctx, cancelled); err != nil {
		t.Fatal(err)
	}
	evs := h.notices(t)
	if types(evs) != notify.JobCancelled || evs[0].State != "cancelled" || !strings.HasPrefix(evs[0].Reason, "cancelled at ") {
		t.Fatalf("events of a job cancelled twice: %+v", evs)
	}

	res, fk := h.submitFrame(t, 40, 40, 40)
	failed := res.Status.JobID
	f := h.frame(t, fk)
	dead := tileEvent(t, f, 0, wire.EventTileFailed, 7, 1)
	dead.Terminal, dead.Code, dead.Error = true, "render", "the renderer exploded"
	h.apply(t, dead)
	evs = h.notices(t)[1:]
	if types(evs) != notify.JobFailed || evs[0].JobID != failed || evs[0].State != "failed" ||
		!strings.Contains(evs[0].Reason, "the renderer exploded") || *evs[0].Frames != (notify.Frames{Total: 1, Failed: 1}) {
		t.Fatalf("events of a failed job: %+v", evs)
	}
	if n, err := h.c.Retry(h.ctx, failed); err != nil || n != 1 {
		t.Fatalf("Retry = %d, %v", n, err)
	}
	if evs := h.notices(t); len(evs) != 2 {
		t.Fatalf("a retry was announced: %s", types(evs))
	}
	if recs := h.outbox(t); len(recs) != 1 || recs[0].Retry != 1 {
		t.Fatalf("the retry dispatched %+v", recs)
	}
	again := tileEvent(t, f, 0, wire.EventTileFailed, 9, 1) // the retried message's
	again.Terminal, again.Error = true, "exploded again"
	h.apply(t, again)
	evs = h.notices(t)
	if types(evs) != "job.cancelled job.failed job.failed" || !strings.Contains(evs[2].Reason, "exploded again") || evs[1].ID == evs[2].ID {
		t.Fatalf("events after failing again: %+v", evs)
	}
}

// Frame events are recorded only for a job that asked for them, each frame's once, before the
// job's own event; a job without them is told of its completion alone.
func TestFrameEventsOnlyForJobsThatAskForThem(t *testing.T) {
	h := notifyHarness(t)
	req := h.request(1, 2, 32, 32, 32)
	req.NotifyFrames = true
	frames := h.submit(t, req).Status.JobID
	plain := h.submit(t, h.request(3, 3, 32, 32, 32)).Status.JobID
	if st := h.status(t, frames); !st.NotifyFrames {
		t.Fatal("status does not say the job asked for frame events")
	}
	h.finishFrame(t, frames, 1)
	h.finishFrame(t, frames, 1)
	if got := types(h.notices(t)); got != "frame.completed#1" {
		t.Fatalf("after frame 1: %q", got)
	}
	h.finishFrame(t, frames, 2)
	h.finishFrame(t, plain, 3)
	evs := h.notices(t)
	if got := types(evs); got != "frame.completed#1 frame.completed#2 job.completed job.completed" {
		t.Fatalf("events: %q", got)
	}
	if evs[1].JobID != frames || evs[1].State != "completed" || evs[1].Frames != nil || evs[2].JobID != frames || evs[3].JobID != plain {
		t.Fatalf("events: %+v", evs)
	}
}

// A job whose frames another job completed already completes at its submission, and is
// announced so; the job that rendered them is not announced again.
func TestAJobCompletedAtSubmissionIsAnnounced(t *testing.T) {
	h := notifyHarness(t)
	first := h.submit(t, h.request(1, 1, 32, 32, 32)).Status.JobID
	h.finishFrame(t, first, 1)
	req := h.request(1, 1, 32, 32, 32)
	req.IdempotencyKey = "the same frames again"
	res := h.submit(t, req)
	if res.Status.State != api.JobCompleted {
		t.Fatalf("second job = %s, want completed at submission", res.Status.State)
	}
	evs := h.notices(t)
	if types(evs) != "job.completed job.completed" || evs[0].JobID != first || evs[1].JobID != res.Status.JobID {
		t.Fatalf("events: %+v", evs)
	}
}

// A submission's receivers are checked: a URL that is not http or https with a host is bad
// input, a farm without a secret takes none, and status shows them without credentials.
func TestSubmitChecksReceivers(t *testing.T) {
	h := notifyHarness(t)
	for _, bad := range [][]string{{"ftp://example.com/x"}, {"example.com"}, make([]string, notify.MaxURLs+1)} {
		req := h.request(1, 1, 32, 32, 32)
		req.Notify = bad
		if _, err := h.c.Submit(h.ctx, req); !errors.Is(err, api.ErrBadInput) {
			t.Errorf("receivers %q: %v, want bad input", bad, err)
		}
	}
	req := h.request(1, 1, 32, 32, 32)
	req.Notify = []string{"https://ops:hunter2@hooks.example.com/x?token=t0p", "https://ops:hunter2@hooks.example.com/x?token=t0p"}
	st := h.submit(t, req).Status
	if len(st.Notify) != 1 || st.Notify[0] != "https://REDACTED@hooks.example.com/x?REDACTED" {
		t.Fatalf("status shows receivers %q", st.Notify)
	}
	if j := h.job(t, st.JobID); len(j.Notify) != 1 || j.Notify[0] != req.Notify[0] {
		t.Fatalf("the job keeps receivers %q", j.Notify)
	}

	unsigned := newHarness(t, Config{})
	req = unsigned.request(1, 1, 32, 32, 32)
	req.Notify = []string{"https://hooks.example.com/x"}
	_, err := unsigned.c.Submit(unsigned.ctx, req)
	if !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "notification secret") {
		t.Fatalf("receivers on a farm without a secret: %v", err)
	}
}

// A job's receivers may not reach loopback, link-local, cloud metadata or unspecified
// addresses, named literally or by a name resolving there ("localhost"): bad input (HTTP 400),
// saying the range and that serve --notify-allow allows it, without the URL's credentials.
// Other addresses, private ones too, are taken; with --notify-allow 127.0.0.0/8 loopback is,
// and the metadata address still is not.
func TestSubmitRefusesReceiversOnAddressesTheFarmDoesNotAllow(t *testing.T) {
	h := notifyHarness(t)
	for url, says := range map[string]string{
		"http://127.0.0.1:9000/hook":                                 "127.0.0.0/8 (loopback)",
		"http://ops:hunter2@169.254.169.254/latest/meta-data?t=p4ss": "169.254.169.254/32 (cloud metadata)",
		"http://[fd00:ec2::254]/latest":                              "fd00:ec2::254/128 (cloud metadata)",
		"http://[::1]:8080/x":                                        "::1/128 (loopback)",
		"http://[::ffff:127.0.0.1]/x":                                "127.0.0.0/8 (loopback)",
		"http://localhost:8080/x":                                    "localhost resolves to 127.0.0.1",
		"http://0.0.0.0:8080/x":                                      "0.0.0.0/32 (unspecified)",
		"http://[fe80::1%25eth0]/x":                                  "fe80::/10 (link-local)",
		"http://169.254.10.1/x":                                      "169.254.0.0/16 (link-local)",
	} {
		req := h.request(1, 1, 32, 32, 32)
		req.Notify = []string{"https://hooks.example.com/fine", url}
		_, err := h.c.Submit(h.ctx, req)
		if !errors.Is(err, api.ErrBadInput) || !strings.Contains(err.Error(), says) || !strings.Contains(err.Error(), "serve --notify-allow") ||
			strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "p4ss") {
			t.Errorf("receiver %s: %v; want bad input saying %q and --notify-allow, without credentials", url, err, says)
		}
	}
	req := h.request(1, 1, 32, 32, 32)
	req.Notify = []string{"http://10.0.0.5/hook", "http://192.168.1.20:8080/hook", "http://[2001:db8::1]/hook"}
	if _, err := h.c.Submit(h.ctx, req); err != nil {
		t.Fatalf("private and public addresses: %v", err)
	}

	allowed := newHarness(t, Config{Notify: notify.Config{Secret: testNotifySecret, Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}})
	req = allowed.request(1, 1, 32, 32, 32)
	req.Notify = []string{"http://127.0.0.1:9000/hook", "http://localhost:9000/hook"}
	if _, err := allowed.c.Submit(allowed.ctx, req); err != nil {
		t.Fatalf("loopback with --notify-allow 127.0.0.0/8: %v", err)
	}
	req = allowed.request(2, 2, 32, 32, 32)
	req.Notify = []string{"http://169.254.169.254/latest"}
	if _, err := allowed.c.Submit(allowed.ctx, req); !errors.Is(err, api.ErrBadInput) {
		t.Fatalf("the metadata address with only loopback allowed: %v", err)
	}
}

// The coordinator's notifier delivers what it announces: the receiver gets the completion once,
// signed, and a subscriber on the NATS subject sees it.
func TestCoordinatorDeliversItsAnnouncements(t *testing.T) {
	h := newHarness(t, Config{Notify: notify.Config{Secret: testNotifySecret, Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}})
	var mu sync.Mutex
	var got []notify.Event
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var ev notify.Event
		if notify.Verify(testNotifySecret, body, r.Header.Get(notify.TimestampHeader), r.Header.Get(notify.SignatureHeader), time.Now(), 0) != nil || json.Unmarshal(body, &ev) != nil {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		mu.Lock()
		got = append(got, ev)
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	sub, err := h.c.nc.SubscribeSync("notify.>")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(h.ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = h.c.notifier.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	req := h.request(1, 1, 32, 32, 32)
	req.Notify = []string{srv.URL}
	job := h.submit(t, req).Status.JobID
	h.finishFrame(t, job, 1)
	msg, err := sub.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("no event on NATS: %v", err)
	}
	if msg.Subject != "notify.job.completed."+job || msg.Header.Get(nats.MsgIdHdr) == "" {
		t.Fatalf("NATS carried %s (msg id %q)", msg.Subject, msg.Header.Get(nats.MsgIdHdr))
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(h.notices(t)) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || got[0].Type != notify.JobCompleted || got[0].JobID != job || string(msg.Data) == "" {
		t.Fatalf("the receiver got %+v", got)
	}
	var published notify.Event
	if err := json.Unmarshal(msg.Data, &published); err != nil || published.ID != got[0].ID {
		t.Fatalf("NATS and the receiver got different events: %s vs %+v", msg.Data, got[0])
	}
}

// A job waiting for one that fails is announced blocked, with the reason, though none of its
// own records changed; a retry of the upstream takes the block back silently (waiting is not
// announced), and the job completing is announced. A chain blocks as a whole.
func TestBlockedJobsAreAnnounced(t *testing.T) {
	h := notifyHarness(t)
	up := h.submit(t, h.request(1, 1, 32, 16, 16)).Status.JobID
	h.relay(t)
	down := h.submit(t, h.after(1, 1, "", up)).Status.JobID
	chain := h.submit(t, h.after(2, 2, "", down)).Status.JobID
	before := len(h.notices(t))
	h.deadLetterTile(t)
	evs := h.notices(t)[before:]
	if types(evs) != "job.failed job.blocked job.blocked" || evs[0].JobID != up || evs[1].JobID != down || evs[2].JobID != chain {
		t.Fatalf("events after the upstream failed: %+v", evs)
	}
	if evs[1].State != "blocked" || evs[1].Reason != "job "+up+" failed" {
		t.Fatalf("blocked event: state %q, reason %q", evs[1].State, evs[1].Reason)
	}
	if n, err := h.c.Retry(h.ctx, up); err != nil || n != 1 {
		t.Fatalf("Retry = %d, %v", n, err)
	}
	if evs := h.notices(t)[before:]; len(evs) != 3 {
		t.Fatalf("a retry of the upstream was announced: %s", types(evs))
	}
	for i, id := range []string{up, down, chain} {
		h.relay(t)
		h.completeFrame(t, h.job(t, id).FrameKey(1+i/2))
	}
	evs = h.notices(t)[before+3:]
	if types(evs) != "job.completed job.completed job.completed" || evs[1].JobID != down || evs[2].JobID != chain {
		t.Fatalf("events once the chain completed: %+v", evs)
	}
}
