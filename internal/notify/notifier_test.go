package notify

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/logtest"
	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/internal/natstest"
	"github.com/tilefarm/tilefarm/internal/queue"
)

var testSecret = []byte("a notification secret for tests")

// loopback is the --notify-allow of a notifier whose job receivers are the test's own
// servers, on loopback, which a job's receivers may not reach by default.
var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}

// receiver is a webhook receiver: it checks each delivery's signature and headers, answers 503
// to the first failFirst attempts and 200 after, and keeps what it accepted.
type receiver struct {
	*httptest.Server
	failFirst int

	mu       sync.Mutex
	attempts int
	bad      []string // what was wrong with deliveries
	accepted []Event
}

func newReceiver(t *testing.T, failFirst int) *receiver {
	r := &receiver{failFirst: failFirst}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		defer r.mu.Unlock()
		r.attempts++
		var ev Event
		switch {
		case req.Method != http.MethodPost || req.Header.Get("Content-Type") != "application/json":
			r.bad = append(r.bad, req.Method+" "+req.Header.Get("Content-Type"))
		case Verify(testSecret, body, req.Header.Get(TimestampHeader), req.Header.Get(SignatureHeader), time.Now(), 0) != nil:
			r.bad = append(r.bad, "signature "+req.Header.Get(TimestampHeader)+" "+req.Header.Get(SignatureHeader))
		case json.Unmarshal(body, &ev) != nil || ev.ID != req.Header.Get(IDHeader) || ev.Type != req.Header.Get(EventHeader):
			r.bad = append(r.bad, "body "+string(body))
		}
		if r.attempts <= r.failFirst {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		r.accepted = append(r.accepted, ev)
	}))
	t.Cleanup(r.Close)
	return r
}

// state returns how many attempts the receiver saw, what it accepted and what was wrong.
func (r *receiver) state() (int, []Event, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.attempts, append([]Event(nil), r.accepted...), append([]string(nil), r.bad...)
}

// env is a notifier's world: a real bbolt database, a real JetStream with the farm's streams,
// the coordinator's metrics and a log to read.
type env struct {
	t    *testing.T
	ctx  context.Context
	path string
	db   *coorddb.DB
	nc   *nats.Conn
	js   jetstream.JetStream
	m    *metrics.Coordinator
	logs logtest.Buffer
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	nc, js, _ := natstest.InProcess(t)
	if _, err := queue.Setup(ctx, js, queue.DefaultConfig()); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ctx: ctx, path: filepath.Join(t.TempDir(), "coordinator.db"), nc: nc, js: js, m: metrics.NewCoordinator(metrics.NewRegistry())}
	e.open()
	t.Cleanup(func() { _ = e.db.Close() })
	return e
}

func (e *env) open() {
	e.t.Helper()
	db, err := coorddb.Open(e.path)
	if err != nil {
		e.t.Fatal(err)
	}
	e.db = db
}

// record records events as the coordinator does, in one transaction.
func (e *env) record(urls []string, evs ...Event) {
	e.t.Helper()
	err := e.db.Update(e.ctx, func(tx *coorddb.Tx) error {
		for _, ev := range evs {
			if err := Record(tx, ev, urls); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
}

// run runs a notifier of cfg, its first retry after base, until the returned stop is called;
// setup, if any, changes the notifier before it runs (its clock).
func (e *env) run(cfg Config, base time.Duration, setup ...func(*Notifier)) (n *Notifier, stop func()) {
	n = New(cfg, Deps{DB: e.db, NATS: e.nc, Metrics: e.m, Log: slog.New(slog.NewTextHandler(&e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	n.base = base
	for _, f := range setup {
		f(n)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := n.Run(ctx); err != nil {
			e.t.Errorf("Run: %v", err)
		}
	}()
	return n, func() { cancel(); <-done }
}

func (e *env) pending() []coorddb.Notification {
	e.t.Helper()
	recs, err := e.db.Notifications(e.ctx, 0, 1000)
	if err != nil {
		e.t.Fatal(err)
	}
	return recs
}

// waitFor polls cond until it holds, failing the test after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// published reads every message of the NOTIFY stream: subject, msg id and event.
func (e *env) published() []*nats.Msg {
	e.t.Helper()
	cons, err := e.js.OrderedConsumer(e.ctx, queue.StreamNotify, jetstream.OrderedConsumerConfig{})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []*nats.Msg
	for {
		batch, err := cons.FetchNoWait(100)
		if err != nil {
			e.t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			out = append(out, &nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
			n++
		}
		if n == 0 {
			return out
		}
	}
}

func events(ids ...string) []Event {
	var out []Event
	for i, id := range ids {
		out = append(out, Event{ID: id, Type: JobCompleted, Time: time.Now().UTC(), JobID: strings.Repeat("a", 63) + string(rune('0'+i)), State: "completed"})
	}
	return out
}

// Every recorded event reaches the job's receiver and the farm-wide one once each, signed, with
// its id and type in headers, and the NOTIFY stream once under its subject with its id as msg
// id; then nothing is pending and the metrics counted each delivery.
func TestNotifierDeliversEachEventOnceSignedAndPublishes(t *testing.T) {
	e := newEnv(t)
	job, farm := newReceiver(t, 0), newReceiver(t, 0)
	evs := events("ev_a", "ev_b", "ev_c")
	e.record([]string{job.URL}, evs...)
	_, stop := e.run(Config{URLs: []string{farm.URL}, Secret: testSecret, Allow: loopback}, 10*time.Millisecond)
	defer stop()
	waitFor(t, 10*time.Second, "every notification delivered", func() bool { return len(e.pending()) == 0 })
	for name, r := range map[string]*receiver{"job's": job, "farm-wide": farm} {
		attempts, got, bad := r.state()
		if len(bad) > 0 || attempts != len(evs) || len(got) != len(evs) {
			t.Fatalf("%s receiver: %d attempts, accepted %v, wrong: %v", name, attempts, got, bad)
		}
		seen := map[string]bool{}
		for _, ev := range got {
			seen[ev.ID] = true
		}
		for _, ev := range evs {
			if !seen[ev.ID] {
				t.Fatalf("%s receiver never got %s: %v", name, ev.ID, got)
			}
		}
	}
	msgs := e.published()
	if len(msgs) != len(evs) {
		t.Fatalf("NOTIFY holds %d messages, want %d", len(msgs), len(evs))
	}
	for _, m := range msgs {
		var ev Event
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Fatal(err)
		}
		if m.Subject != "notify.job.completed."+ev.JobID || m.Header.Get(jetstream.MsgIDHeader) != ev.ID {
			t.Fatalf("published %s with msg id %q: %s", m.Subject, m.Header.Get(jetstream.MsgIDHeader), m.Data)
		}
	}
	if ok := testutil.ToFloat64(e.m.NotificationDeliveries.WithLabelValues(metrics.DeliveryOK)); ok != 9 {
		t.Fatalf("deliveries ok = %v, want 9 (3 events to NATS and two receivers)", ok)
	}
}

// A receiver that answers 503 gets the event again, after a backoff, until it takes it: once,
// with the same id and signature; the failed attempts are counted and recorded with the
// notification meanwhile.
func TestNotifierRetriesAFailedDeliveryWithBackoff(t *testing.T) {
	e := newEnv(t)
	r := newReceiver(t, 2)
	e.record([]string{r.URL}, events("ev_retried")...)
	_, stop := e.run(Config{Secret: testSecret, Allow: loopback}, 50*time.Millisecond)
	defer stop()
	var sawFailure bool
	waitFor(t, 10*time.Second, "the notification delivered", func() bool {
		p := e.pending()
		for _, n := range p {
			for _, d := range n.Targets {
				sawFailure = sawFailure || (d.Attempts > 0 && strings.Contains(d.Error, "503") && d.Next.After(n.Created))
			}
		}
		return len(p) == 0
	})
	attempts, got, bad := r.state()
	if attempts != 3 || len(got) != 1 || got[0].ID != "ev_retried" || len(bad) > 0 {
		t.Fatalf("%d attempts, accepted %v, wrong %v; want 3 attempts and the event accepted once", attempts, got, bad)
	}
	if !sawFailure {
		t.Fatal("the failed attempts were never recorded with a later next try")
	}
	if failed := testutil.ToFloat64(e.m.NotificationDeliveries.WithLabelValues(metrics.DeliveryFailed)); failed != 2 {
		t.Fatalf("failed deliveries = %v, want 2", failed)
	}
}

// A receiver that never takes an event is given up on once the give-up time has passed since
// the event: its notification is dropped with a log line that shows neither the URL's
// credentials nor its query, and the NATS publish of the same event is unaffected.
func TestNotifierGivesUpAfterTheDeadline(t *testing.T) {
	e := newEnv(t)
	r := newReceiver(t, 1<<30)
	url := strings.Replace(r.URL, "http://", "http://alice:hunter2@", 1) + "/hook?token=topsecret"
	e.record([]string{url}, events("ev_doomed")...)
	start := time.Now()
	_, stop := e.run(Config{Secret: testSecret, Allow: loopback, GiveUpAfter: 400 * time.Millisecond}, 50*time.Millisecond)
	waitFor(t, 10*time.Second, "the notification given up", func() bool { return len(e.pending()) == 0 })
	stop()
	if took := time.Since(start); took < 350*time.Millisecond {
		t.Fatalf("given up after %v, before its deadline", took)
	}
	attempts, got, _ := r.state()
	if attempts < 2 || len(got) != 0 {
		t.Fatalf("%d attempts, accepted %v; want retries and nothing accepted", attempts, got)
	}
	if g := testutil.ToFloat64(e.m.NotificationDeliveries.WithLabelValues(metrics.DeliveryGaveUp)); g != 1 {
		t.Fatalf("gave up = %v, want 1", g)
	}
	if len(e.published()) != 1 {
		t.Fatal("the event was not published on NATS")
	}
	logs := e.logs.String()
	if !strings.Contains(logs, "giving up on a notification") || !strings.Contains(logs, "REDACTED@") {
		t.Fatalf("no give-up line naming the receiver redacted:\n%s", logs)
	}
	if strings.Contains(logs, "hunter2") || strings.Contains(logs, "topsecret") || strings.Contains(logs, string(testSecret)) {
		t.Fatalf("the logs show a credential:\n%s", logs)
	}
}

// A notification not delivered when its coordinator stops is delivered by the next one: what
// is owed lives in the database, attempts and all, not in memory.
func TestNotifierKeepsWhatIsOwedAcrossARestart(t *testing.T) {
	e := newEnv(t)
	r := newReceiver(t, 1)
	e.record([]string{r.URL}, events("ev_kept")...)
	_, stop := e.run(Config{Secret: testSecret, Allow: loopback}, time.Hour) // the retry would come in an hour
	waitFor(t, 10*time.Second, "a first attempt", func() bool { a, _, _ := r.state(); return a == 1 })
	waitFor(t, 10*time.Second, "the failed attempt recorded", func() bool {
		p := e.pending()
		return len(p) == 1 && len(p[0].Targets) == 1 && p[0].Targets[0].Attempts == 1
	})
	stop()
	if err := e.db.Close(); err != nil {
		t.Fatal(err)
	}
	e.open()
	p := e.pending()
	if len(p) != 1 || p[0].ID != "ev_kept" || !p[0].Expanded || len(p[0].Targets) != 1 || p[0].Targets[0].To != r.URL {
		t.Fatalf("after reopening, pending %+v; want the event owed to the receiver alone (NATS done)", p)
	}
	// The restarted notifier takes the recorded next try as it is: make it due now.
	p[0].Targets[0].Next = time.Time{}
	if err := e.db.PutNotification(e.ctx, p[0]); err != nil {
		t.Fatal(err)
	}
	_, stop = e.run(Config{Secret: testSecret, Allow: loopback}, time.Hour)
	defer stop()
	waitFor(t, 10*time.Second, "the notification delivered after the restart", func() bool { return len(e.pending()) == 0 })
	attempts, got, bad := r.state()
	if attempts != 2 || len(got) != 1 || got[0].ID != "ev_kept" || len(bad) > 0 {
		t.Fatalf("%d attempts, accepted %v, wrong %v", attempts, got, bad)
	}
	if len(e.published()) != 1 {
		t.Fatal("the event was published on NATS more than once, or never")
	}
}

// Without a secret nothing is posted (a delivery fails, saying why), while the NATS subject
// still carries the event.
func TestNotifierPostsNothingWithoutASecret(t *testing.T) {
	e := newEnv(t)
	r := newReceiver(t, 0)
	e.record([]string{r.URL}, events("ev_unsigned")...)
	_, stop := e.run(Config{}, time.Hour)
	defer stop()
	waitFor(t, 10*time.Second, "the failure recorded", func() bool {
		p := e.pending()
		return len(p) == 1 && len(p[0].Targets) == 1 && strings.Contains(p[0].Targets[0].Error, "no notification secret")
	})
	if attempts, _, _ := r.state(); attempts != 0 {
		t.Fatalf("the receiver got %d unsigned posts", attempts)
	}
	if len(e.published()) != 1 {
		t.Fatal("the event was not published on NATS")
	}
}

// Each attempt is signed at its own time: the retry of a delivery three hours after its first
// attempt carries that later timestamp, signed with the body, so a receiver that refuses
// stale timestamps (Verify) takes it, and would refuse the first attempt replayed then.
func TestNotifierSignsEachAttemptAtItsOwnTime(t *testing.T) {
	e := newEnv(t)
	start := time.Date(2030, 5, 4, 12, 0, 0, 0, time.UTC)
	var clockMu sync.Mutex
	clock := start
	now := func() time.Time { clockMu.Lock(); defer clockMu.Unlock(); return clock }
	var mu sync.Mutex
	var stamps []string
	var verdicts []error
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		ts := req.Header.Get(TimestampHeader)
		err := Verify(testSecret, body, ts, req.Header.Get(SignatureHeader), now(), 0)
		mu.Lock()
		defer mu.Unlock()
		stamps, verdicts = append(stamps, ts), append(verdicts, err)
		if len(stamps) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(srv.Close)
	evs := events("ev_stamped")
	evs[0].Time = start
	e.record([]string{srv.URL}, evs...)
	n, stop := e.run(Config{Secret: testSecret, Allow: loopback}, 10*time.Millisecond, func(n *Notifier) { n.now = now })
	defer stop()
	waitFor(t, 10*time.Second, "the failed first attempt recorded", func() bool {
		p := e.pending()
		return len(p) == 1 && len(p[0].Targets) == 1 && p[0].Targets[0].Attempts == 1
	})
	clockMu.Lock()
	clock = start.Add(3 * time.Hour)
	clockMu.Unlock()
	n.Kick()
	waitFor(t, 10*time.Second, "the retry delivered", func() bool { return len(e.pending()) == 0 })
	mu.Lock()
	defer mu.Unlock()
	want := []string{Timestamp(start), Timestamp(start.Add(3 * time.Hour))}
	if !slices.Equal(stamps, want) || verdicts[0] != nil || verdicts[1] != nil {
		t.Fatalf("attempts stamped %q, verified %v; want %q, each valid when it arrived", stamps, verdicts, want)
	}
}

// hangingReceiver holds every request until the test ends, counting those open and those
// that returned.
type hangingReceiver struct {
	*httptest.Server
	mu             sync.Mutex
	open, returned int
}

func newHangingReceiver(t *testing.T) *hangingReceiver {
	h := &hangingReceiver{}
	release := make(chan struct{})
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		h.mu.Lock()
		h.open++
		h.mu.Unlock()
		select {
		case <-release:
		case <-req.Context().Done():
		}
		h.mu.Lock()
		h.open--
		h.returned++
		h.mu.Unlock()
	}))
	t.Cleanup(h.Close)
	t.Cleanup(func() { close(release) }) // before Close, which waits for the requests
	return h
}

func (h *hangingReceiver) state() (open, returned int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.open, h.returned
}

// One receiver that hangs delays no other (docs/operations.md, "Notifications": each receiver
// is retried on its own): while the farm-wide receiver holds every request it gets, with a
// timeout of a minute so that nothing is freed by one, the job's receiver and the NOTIFY
// stream get all 48 events. The hanging receiver's lane holds at most its bound of requests,
// and none of them has returned when the last event reached the fast receiver.
func TestNotifierAHangingReceiverDelaysNoOther(t *testing.T) {
	e := newEnv(t)
	hung, fast := newHangingReceiver(t), newReceiver(t, 0)
	var ids []string
	for i := range 48 {
		ids = append(ids, fmt.Sprintf("ev_%02d", i))
	}
	e.record([]string{fast.URL}, events(ids...)...)
	_, stop := e.run(Config{URLs: []string{hung.URL}, Secret: testSecret, Allow: loopback, Timeout: time.Minute}, 10*time.Millisecond)
	defer stop()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		_, got, _ := fast.state()
		if len(got) == len(ids) {
			break
		}
		if time.Now().After(deadline) {
			open, returned := hung.state()
			t.Fatalf("the fast receiver got %d of %d events while the hanging one held %d requests (%d returned)", len(got), len(ids), open, returned)
		}
	}
	open, returned := hung.state()
	if returned != 0 || open == 0 {
		t.Fatalf("the hanging receiver has %d requests open and %d returned; want some open and none returned", open, returned)
	}
	if open > laneInFlight {
		t.Fatalf("the hanging receiver holds %d requests, more than a lane's bound of %d", open, laneInFlight)
	}
	_, got, bad := fast.state()
	seen := map[string]bool{}
	for _, ev := range got {
		seen[ev.ID] = true
	}
	if len(seen) != len(ids) || len(bad) > 0 {
		t.Fatalf("the fast receiver got %d distinct events of %d (wrong: %v)", len(seen), len(ids), bad)
	}
	waitFor(t, 20*time.Second, "every event published", func() bool { return len(e.published()) == len(ids) })
	// What was delivered is written soon after it was: then each record owes the hanging
	// receiver alone.
	waitFor(t, 20*time.Second, "the deliveries recorded", func() bool {
		p := e.pending()
		for _, r := range p {
			if !r.Expanded || len(r.Targets) != 1 || r.Targets[0].To != hung.URL || r.Targets[0].Attempts != 0 {
				return false
			}
		}
		return len(p) == len(ids)
	})
	if open, returned := hung.state(); returned != 0 {
		t.Fatalf("%d requests of the hanging receiver returned (%d open): a timeout or a retry intervened", returned, open)
	}
	waitFor(t, 10*time.Second, "tilefarm_notifications_pending at 48", func() bool {
		return testutil.ToFloat64(e.m.NotificationsPending) == float64(len(ids))
	})
}
