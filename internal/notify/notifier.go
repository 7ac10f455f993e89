package notify

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/internal/buildinfo"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/faults"
	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/internal/queue"
)

// Defaults of a Config, and the retry schedule: a failed delivery is tried again after about
// 1 s, doubling up to 5 min, each delay with equal jitter (queue.Backoff).
const (
	DefaultGiveUpAfter = 24 * time.Hour
	DefaultTimeout     = 10 * time.Second
	retryBase          = time.Second
	retryMax           = 5 * time.Minute
)

// Bounds of the notifier's work: notifications delivered at once, and read per database page.
const (
	maxInFlight = 16
	scanPage    = 256
)

// Config is where and how notifications go.
type Config struct {
	// URLs are the farm-wide receivers (serve --notify): every job's events go to them, on top
	// of the job's own.
	URLs []string
	// Secret signs every webhook delivery (SignatureHeader, over TimestampHeader and the
	// body). Without one nothing is posted: a delivery to a URL fails until the deadline, and
	// serve and submit refuse URLs.
	Secret []byte
	// GiveUpAfter is how long after its event a delivery is retried before it is dropped with
	// a log line; default DefaultGiveUpAfter.
	GiveUpAfter time.Duration
	// Timeout bounds one attempt (a POST, a publish); default DefaultTimeout.
	Timeout time.Duration
}

func (c *Config) normalize() {
	if c.GiveUpAfter <= 0 {
		c.GiveUpAfter = DefaultGiveUpAfter
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
}

// Deps are what a Notifier works with.
type Deps struct {
	DB      *coorddb.DB
	NATS    *nats.Conn
	Metrics *metrics.Coordinator
	Faults  *faults.Injector // nil breaks nothing
	Log     *slog.Logger
}

// Notifier delivers the notifications recorded in the coordinator's database: each to the
// farm's NATS subject and to every receiver, retrying each destination with backoff until it
// succeeds or GiveUpAfter has passed since the event, and deletes a notification once no
// destination is owed. It is the only writer of a recorded notification.
type Notifier struct {
	cfg    Config
	db     *coorddb.DB
	nc     *nats.Conn
	m      *metrics.Coordinator
	faults *faults.Injector
	log    *slog.Logger
	client *http.Client
	kick   chan struct{}
	now    func() time.Time
	jitter func() float64
	base   time.Duration // the first retry's delay; retryBase but in tests
}

// New makes a notifier; Run runs it.
func New(cfg Config, d Deps) *Notifier {
	cfg.normalize()
	log := d.Log
	if log == nil {
		log = slog.Default()
	}
	return &Notifier{
		cfg: cfg, db: d.DB, nc: d.NATS, m: d.Metrics, faults: d.Faults, log: log,
		client: &http.Client{
			Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, MaxIdleConnsPerHost: 4, IdleConnTimeout: time.Minute},
			// A redirect is an answer that is not 2xx: following one would post the event
			// (and its signature) somewhere the operator did not name.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		kick:   make(chan struct{}, 1),
		now:    func() time.Time { return time.Now().UTC() },
		jitter: queue.CryptoJitter,
		base:   retryBase,
	}
}

// Kick tells the notifier new notifications were committed.
func (n *Notifier) Kick() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// retryDelay is how long a destination waits after its attempt-th failed attempt (1-based).
func (n *Notifier) retryDelay(attempt int) time.Duration {
	return queue.Backoff(attempt, n.base, retryMax, n.jitter)
}

// delivered is what one delivery round of a notification left: gone, or due again at due.
type delivered struct {
	seq  uint64
	gone bool
	due  time.Time
}

// Run delivers notifications until ctx is done. It keeps the due time of every pending
// notification in memory, read once at start and then only for records new since (after a
// Kick, or every minute), so waiting costs nothing per record; each notification due is
// delivered by a goroutine of its own, at most maxInFlight at once.
func (n *Notifier) Run(ctx context.Context) error {
	js, err := jetstream.New(n.nc)
	if err != nil {
		return fmt.Errorf("opening JetStream for the notifier: %w", err)
	}
	due := map[uint64]time.Time{}
	inFlight := map[uint64]bool{}
	results := make(chan delivered, maxInFlight)
	var wg sync.WaitGroup
	defer wg.Wait()
	var last uint64
	scan := true
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		if scan {
			for {
				recs, err := n.db.Notifications(ctx, last, scanPage)
				if err != nil {
					return fmt.Errorf("reading notifications: %w", err)
				}
				for _, r := range recs {
					due[r.Seq], last = r.Due(), r.Seq
				}
				if len(recs) < scanPage {
					break
				}
			}
			scan = false
		}
		now := n.now()
		var next time.Time
		for _, seq := range slices.Sorted(maps.Keys(due)) {
			if inFlight[seq] {
				continue
			}
			if t := due[seq]; t.After(now) || len(inFlight) >= maxInFlight {
				if next.IsZero() || t.Before(next) {
					next = t
				}
				continue
			}
			inFlight[seq] = true
			wg.Go(func() { results <- n.deliver(ctx, js, seq) })
		}
		n.m.NotificationsPending.Set(float64(len(due)))
		wait := time.Minute
		if !next.IsZero() && len(inFlight) < maxInFlight {
			wait = min(wait, max(next.Sub(now), 10*time.Millisecond))
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case <-n.kick:
			scan = true
		case <-timer.C:
			scan = true // cheap: only records after the last one read
		case r := <-results:
			delete(inFlight, r.seq)
			if r.gone {
				delete(due, r.seq)
			} else {
				due[r.seq] = r.due
			}
		}
	}
}

// targets are the destinations of a notification the first time the notifier takes it: the
// NATS subject, the job's receivers and the farm-wide ones, each once.
func (n *Notifier) targets(urls []string) []coorddb.Delivery {
	out := []coorddb.Delivery{{To: coorddb.NATSTarget}}
	seen := map[string]bool{}
	for _, u := range slices.Concat(urls, n.cfg.URLs) {
		if !seen[u] {
			seen[u] = true
			out = append(out, coorddb.Delivery{To: u})
		}
	}
	return out
}

// deliver attempts every destination of notification seq that is due, at once, and writes
// back what is still owed. A crash before the write repeats the attempts (at least once).
func (n *Notifier) deliver(ctx context.Context, js jetstream.JetStream, seq uint64) delivered {
	retry := delivered{seq: seq, due: n.now().Add(time.Second)}
	rec, ok, err := n.db.Notification(ctx, seq)
	if err != nil {
		n.log.Error("reading a notification", "seq", seq, "err", err)
		return retry
	}
	if !ok {
		return delivered{seq: seq, gone: true}
	}
	if !rec.Expanded {
		rec.Targets, rec.Expanded = n.targets(rec.URLs), true
	}
	n.faults.At(n.log.With("event", rec.ID), faults.NotifyBeforeDeliver)
	now := n.now()
	errs := make([]error, len(rec.Targets))
	var wg sync.WaitGroup
	for i, t := range rec.Targets {
		if t.Next.After(now) {
			continue
		}
		wg.Go(func() { errs[i] = n.attempt(ctx, js, rec, t.To) })
	}
	wg.Wait()
	if ctx.Err() != nil {
		return retry // stopping: what was attempted is attempted again at the next start
	}
	deadline := rec.Created.Add(n.cfg.GiveUpAfter)
	var keep []coorddb.Delivery
	for i, t := range rec.Targets {
		log := n.log.With("event", rec.ID, "subject", rec.Subject, "to", shown(t.To))
		switch {
		case t.Next.After(now):
			keep = append(keep, t)
			continue
		case errs[i] == nil:
			n.m.NotificationDeliveries.WithLabelValues(metrics.DeliveryOK).Inc()
			log.Debug("notification delivered", "attempts", t.Attempts+1)
			continue
		}
		t.Attempts++
		t.Error = errs[i].Error()
		if !n.now().Before(deadline) {
			n.m.NotificationDeliveries.WithLabelValues(metrics.DeliveryGaveUp).Inc()
			log.Error("giving up on a notification", "attempts", t.Attempts, "since", rec.Created, "err", errs[i])
			continue
		}
		n.m.NotificationDeliveries.WithLabelValues(metrics.DeliveryFailed).Inc()
		// The last attempt is made at the deadline, not a backoff step after it.
		t.Next = n.now().Add(n.retryDelay(t.Attempts))
		if t.Next.After(deadline) {
			t.Next = deadline
		}
		log.Warn("notification not delivered; retrying", "attempts", t.Attempts, "next", t.Next, "err", errs[i])
		keep = append(keep, t)
	}
	rec.Targets = keep
	if err := n.db.PutNotification(ctx, rec); err != nil {
		n.log.Error("recording a notification's deliveries", "event", rec.ID, "err", err)
		return retry
	}
	if len(keep) == 0 {
		return delivered{seq: seq, gone: true}
	}
	return delivered{seq: seq, due: rec.Due()}
}

// errNoSecret fails a webhook delivery while the coordinator has no secret to sign it with.
var errNoSecret = errors.New("no notification secret to sign with (serve --notify-secret-file or " + EnvSecret + ")")

// attempt makes one delivery of rec to to: a publish on the NATS subject (acknowledged by the
// NOTIFY stream, with the event id as msg id), or a signed POST answered 2xx.
func (n *Notifier) attempt(ctx context.Context, js jetstream.JetStream, rec coorddb.Notification, to string) error {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.Timeout)
	defer cancel()
	if to == coorddb.NATSTarget {
		_, err := js.PublishMsg(ctx, &nats.Msg{Subject: rec.Subject, Data: rec.Body}, jetstream.WithMsgID(rec.ID))
		return err
	}
	if len(n.cfg.Secret) == 0 {
		return errNoSecret
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, to, bytes.NewReader(rec.Body))
	if err != nil {
		return errors.New("not a URL a request can be made to")
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "tilefarm/"+buildinfo.Version())
	// Each attempt is signed at its own time: a retry hours after the event is as fresh as the
	// first attempt, and a delivery replayed later is stale (Verify).
	ts := Timestamp(n.now())
	req.Header.Set(TimestampHeader, ts)
	req.Header.Set(SignatureHeader, Sign(n.cfg.Secret, ts, rec.Body))
	req.Header.Set(EventHeader, eventType(rec.Subject))
	req.Header.Set(IDHeader, rec.ID)
	resp, err := n.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its message repeats the URL whole, credentials and all
		}
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // lets the connection be reused
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("the receiver answered %s", resp.Status)
	}
	return nil
}

// eventType is the type of the event published on subject (Subject).
func eventType(subject string) string {
	s := strings.TrimPrefix(subject, queue.NotifyPrefix)
	if i := strings.LastIndexByte(s, '.'); i >= 0 {
		return s[:i]
	}
	return s
}

// shown is a destination as logs show it.
func shown(to string) string {
	if to == coorddb.NATSTarget {
		return to
	}
	return Redact(to)
}
