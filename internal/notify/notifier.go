package notify

import (
	"bytes"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/netip"
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

// Bounds of the notifier's work (docs/design.md, "Notifications"): attempts open at once to
// one destination (its lane) and in all, which bound its goroutines and connections however
// many deliveries are owed, and notifications read per database page.
const (
	laneInFlight = 4
	maxInFlight  = 256
	scanPage     = 256
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
	// Allow are ranges a job's own receivers may reach though they are refused by default
	// (serve --notify-allow; CheckAddr): at submission (CheckReach) and at every dial.
	Allow []netip.Prefix
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
// destination is owed. Each destination has a lane of its own (Run), so one receiver that
// hangs or is down delays no other. It is the only writer of a recorded notification.
type Notifier struct {
	cfg    Config
	db     *coorddb.DB
	nc     *nats.Conn
	m      *metrics.Coordinator
	faults *faults.Injector
	log    *slog.Logger
	farm   *http.Client // to the farm-wide receivers: the operator's own, reaching anything
	jobs   *http.Client // to a job's own receivers: every address dialled checked (CheckAddr)
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
		farm:   receiverClient(false, nil, http.ProxyFromEnvironment),
		jobs:   receiverClient(true, cfg.Allow, http.ProxyFromEnvironment),
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

// Run delivers notifications until ctx is done. Every delivery owed, one per notification and
// destination, waits in its destination's lane (lanes) until it is due; each lane has at most
// laneInFlight attempts open, so a receiver that hangs until its timeout holds its own lane
// and no other destination's deliveries. The owed deliveries are read once at start and then
// only from records new since (after a Kick, or every minute), so waiting costs nothing per
// record. Run is the one writer of the records: attempts report to it and it writes their
// outcomes (settle), so the deliveries of one notification, made at once, never race to
// write it.
func (n *Notifier) Run(ctx context.Context) error {
	js, err := jetstream.New(n.nc)
	if err != nil {
		return fmt.Errorf("opening JetStream for the notifier: %w", err)
	}
	ls := newLanes()
	results := make(chan attempted, maxInFlight)
	var wg sync.WaitGroup
	defer wg.Wait()
	var last uint64
	scan := true
	timer := time.NewTimer(0)
	defer timer.Stop()
	for ctx.Err() == nil {
		if scan {
			if last, err = n.scan(ctx, ls, last); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			scan = false
		}
		now := n.now()
		next := ls.start(now, func(seq uint64, to string) {
			// In the loop, before the attempt's goroutine exists: a crash here lands before
			// anything of the notification is delivered.
			n.faults.At(n.log.With("seq", seq), faults.NotifyBeforeDeliver)
			wg.Go(func() {
				a := n.try(ctx, js, seq, to)
				select {
				case results <- a:
				case <-ctx.Done():
				}
			})
		})
		n.m.NotificationsPending.Set(float64(len(ls.owed)))
		wait := time.Minute
		if !next.IsZero() {
			wait = min(wait, max(next.Sub(now), 10*time.Millisecond))
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
		case <-n.kick:
			scan = true
		case <-timer.C:
			scan = true // cheap: only records after the last one read
		case a := <-results:
			batch := []attempted{a}
		drain:
			for len(batch) < maxInFlight {
				select {
				case a := <-results:
					batch = append(batch, a)
				default:
					break drain
				}
			}
			n.settle(ctx, ls, batch)
		}
	}
	return nil
}

// scan puts the deliveries owed of every notification after sequence after into their lanes
// and returns the last sequence read.
func (n *Notifier) scan(ctx context.Context, ls *lanes, after uint64) (uint64, error) {
	for {
		recs, err := n.db.Notifications(ctx, after, scanPage)
		if err != nil {
			return after, fmt.Errorf("reading notifications: %w", err)
		}
		for _, r := range recs {
			targets := r.Targets
			if !r.Expanded {
				targets = n.targets(r.URLs)
			}
			for _, t := range targets {
				ls.add(r.Seq, t.To, t.Next)
			}
			after = r.Seq
		}
		if len(recs) < scanPage {
			return after, nil
		}
	}
}

// targets are the destinations of a notification the first time the notifier takes it: the
// NATS subject, the job's receivers and the farm-wide ones, each once. The same record always
// expands to the same targets in one process: scan and settle each expand it.
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

// attempted is what one attempt of a delivery came to, as its goroutine tells Run.
type attempted struct {
	seq uint64
	to  string
	err error // the attempt's: nil when delivered
	// gone is a notification no longer recorded; local, an attempt not made for a reason of
	// the coordinator's own (its database unreadable): retried without counting an attempt.
	gone  bool
	local error
}

// try makes one attempt of notification seq's delivery to to, reading the record for its body.
func (n *Notifier) try(ctx context.Context, js jetstream.JetStream, seq uint64, to string) attempted {
	a := attempted{seq: seq, to: to}
	rec, ok, err := n.db.Notification(ctx, seq)
	switch {
	case err != nil:
		a.local = fmt.Errorf("reading the notification: %w", err)
	case !ok:
		a.gone = true
	default:
		a.err = n.attempt(ctx, js, rec, to)
	}
	return a
}

// settled is the outcome of an attempt once written: what to log and count, and whether the
// delivery is still owed (again, at next).
type settled struct {
	attempted
	id       string
	subject  string
	created  time.Time
	attempts int
	result   string // a metrics.Delivery* label; "" for an attempt not counted
	refused  bool   // dropped because the receiver's address is refused (CheckAddr)
	owed     bool
	next     time.Time
}

// settle writes the outcomes of a batch of attempts, in one transaction however many
// notifications they are of: a delivery that succeeded, or whose receiver is refused, or that
// failed past the give-up time, is removed from its record (the record deleted with its last
// one); one that failed is kept with its attempts and next try after queue.Backoff. Each
// attempt is logged and counted as it is written, before the commit, so a reader that sees
// a record gone sees its deliveries counted; after the commit the deliveries are taken out
// of (or put back in) their lanes. A write that fails leaves the records as they were and
// the deliveries due again in a second: attempted again, at least once, and counted again,
// as attempts are. While stopping nothing is written: what was attempted is attempted again
// at the next start.
func (n *Notifier) settle(ctx context.Context, ls *lanes, batch []attempted) {
	if ctx.Err() != nil {
		return
	}
	var out []settled
	err := n.db.Update(ctx, func(tx *coorddb.Tx) error {
		out = out[:0]
		now := n.now()
		recs := map[uint64]*coorddb.Notification{}
		for _, a := range batch {
			rec, read := recs[a.seq]
			if !read && !a.gone {
				r, ok, err := tx.Notification(a.seq)
				if err != nil {
					return err
				}
				if ok {
					if !r.Expanded {
						r.Targets, r.Expanded = n.targets(r.URLs), true
					}
					rec = &r
				}
				recs[a.seq] = rec
			}
			out = append(out, n.outcome(rec, a, now))
		}
		for _, seq := range slices.Sorted(maps.Keys(recs)) {
			if rec := recs[seq]; rec != nil {
				if err := tx.PutNotification(*rec); err != nil {
					return err
				}
			}
		}
		for _, s := range out {
			n.report(s)
		}
		return nil
	})
	if err != nil {
		n.log.Error("recording notifications' deliveries", "deliveries", len(batch), "err", err)
		for _, a := range batch {
			ls.finish(a.seq, a.to, true, n.now().Add(time.Second))
		}
		return
	}
	for _, s := range out {
		ls.finish(s.seq, s.to, s.owed, s.next)
	}
}

// report logs and counts the outcome of one attempt.
func (n *Notifier) report(s settled) {
	log := n.log.With("event", s.id, "subject", s.subject, "to", shown(s.to))
	switch s.result {
	case metrics.DeliveryOK:
		log.Debug("notification delivered", "attempts", s.attempts)
	case metrics.DeliveryFailed:
		log.Warn("notification not delivered; retrying", "attempts", s.attempts, "next", s.next, "err", s.err)
	case metrics.DeliveryGaveUp:
		if s.refused {
			log.Error("giving up on a notification: its receiver's address is refused", "attempts", s.attempts, "err", s.err)
			break
		}
		log.Error("giving up on a notification", "attempts", s.attempts, "since", s.created, "err", s.err)
	default:
		if s.local != nil {
			log.Error("notification not attempted; retrying", "err", s.local)
		}
	}
	if s.result != "" {
		n.m.NotificationDeliveries.WithLabelValues(s.result).Inc()
	}
}

// outcome applies attempt a to its record rec (nil: gone) at now: the delivery removed, or
// kept with its attempts counted and its next try.
func (n *Notifier) outcome(rec *coorddb.Notification, a attempted, now time.Time) settled {
	s := settled{attempted: a}
	if rec == nil || a.gone {
		return s // gone: nothing owed
	}
	s.id, s.subject, s.created = rec.ID, rec.Subject, rec.Created
	i := slices.IndexFunc(rec.Targets, func(d coorddb.Delivery) bool { return d.To == a.to })
	if i < 0 {
		return s // delivered or dropped already: nothing owed
	}
	t := &rec.Targets[i]
	if a.local != nil {
		s.owed, s.next = true, now.Add(time.Second)
		return s
	}
	drop := func(result string) settled {
		s.result = result
		rec.Targets = slices.Delete(rec.Targets, i, i+1)
		return s
	}
	s.attempts = t.Attempts + 1
	if a.err == nil {
		return drop(metrics.DeliveryOK)
	}
	// A receiver whose address is refused is refused at every retry: the policy is the
	// process's, so the delivery is dropped at once (counted as given up, which alerts).
	if errors.As(a.err, new(*RefusedError)) {
		s.refused = true
		return drop(metrics.DeliveryGaveUp)
	}
	deadline := rec.Created.Add(n.cfg.GiveUpAfter)
	if !now.Before(deadline) {
		return drop(metrics.DeliveryGaveUp)
	}
	t.Attempts, t.Error = s.attempts, a.err.Error()
	// The last attempt is made at the deadline, not a backoff step after it.
	if t.Next = now.Add(n.retryDelay(t.Attempts)); t.Next.After(deadline) {
		t.Next = deadline
	}
	s.result, s.owed, s.next = metrics.DeliveryFailed, true, t.Next
	return s
}

// lanes are the notifier's schedule in memory: each delivery owed, in its destination's lane,
// and how many deliveries each notification still owes (the pending gauge counts the
// notifications). A lane is kept while it has a delivery waiting or an attempt open.
type lanes struct {
	byTo     map[string]*lane
	owed     map[uint64]int
	inFlight int
}

// lane is one destination's queue (the NATS subject, or one receiver's URL): its deliveries
// waiting, by due time, and its attempts open.
type lane struct {
	to       string
	waiting  dueHeap
	inFlight int
}

func newLanes() *lanes { return &lanes{byTo: map[string]*lane{}, owed: map[uint64]int{}} }

// add puts notification seq's delivery to to in its lane, due at due.
func (ls *lanes) add(seq uint64, to string, due time.Time) {
	l := ls.byTo[to]
	if l == nil {
		l = &lane{to: to}
		ls.byTo[to] = l
	}
	heap.Push(&l.waiting, owed{seq: seq, due: due})
	ls.owed[seq]++
}

// start begins every delivery due at now that its lane and the notifier have room for, and
// returns when the next waiting delivery a lane has room for is due (zero: none, or no room
// until an attempt ends).
func (ls *lanes) start(now time.Time, begin func(seq uint64, to string)) (next time.Time) {
	for _, l := range ls.byTo {
		for l.inFlight < laneInFlight && ls.inFlight < maxInFlight && l.waiting.Len() > 0 && !l.waiting[0].due.After(now) {
			o := heap.Pop(&l.waiting).(owed)
			l.inFlight++
			ls.inFlight++
			begin(o.seq, l.to)
		}
		if l.inFlight < laneInFlight && l.waiting.Len() > 0 && (next.IsZero() || l.waiting[0].due.Before(next)) {
			next = l.waiting[0].due
		}
	}
	if ls.inFlight >= maxInFlight {
		return time.Time{}
	}
	return next
}

// finish ends an attempt of notification seq's delivery to to: owed again at next, or not owed.
func (ls *lanes) finish(seq uint64, to string, again bool, next time.Time) {
	l := ls.byTo[to]
	if l == nil {
		return
	}
	l.inFlight--
	ls.inFlight--
	if again {
		heap.Push(&l.waiting, owed{seq: seq, due: next})
	} else if ls.owed[seq]--; ls.owed[seq] <= 0 {
		delete(ls.owed, seq)
	}
	if l.inFlight == 0 && l.waiting.Len() == 0 {
		delete(ls.byTo, to)
	}
}

// owed is a delivery waiting in a lane: its notification and when it is due.
type owed struct {
	seq uint64
	due time.Time
}

// dueHeap orders a lane's waiting deliveries by due time, then by sequence (the older event
// first).
type dueHeap []owed

func (h dueHeap) Len() int { return len(h) }
func (h dueHeap) Less(i, j int) bool {
	if !h[i].due.Equal(h[j].due) {
		return h[i].due.Before(h[j].due)
	}
	return h[i].seq < h[j].seq
}
func (h dueHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(x any)   { *h = append(*h, x.(owed)) }
func (h *dueHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
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
	client := n.jobs
	if slices.Contains(n.cfg.URLs, to) {
		client = n.farm // a job naming a farm-wide receiver gets nothing the farm does not
	}
	resp, err := client.Do(req)
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
