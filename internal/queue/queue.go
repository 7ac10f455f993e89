package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Names of the farm's streams, subjects, consumer and bucket. They are part of the wire contract between the
// coordinator and tileworkers of the same farm, so changing one is a migration.
const (
	StreamTiles     = "TILES"
	SubjectRender   = "tiles.render"
	SubjectAssemble = "tiles.assemble"
	StreamEvents    = "EVENTS"
	StreamDLQ       = "DLQ"
	// StreamNotify holds the coordinator's notifications for consumers inside the farm, on
	// NotifyPrefix + <type> + "." + <job_id> (docs/operations.md, "Notifications").
	StreamNotify = "NOTIFY"
	NotifyPrefix = "notify."
	// StreamJournal is the farm's journal of the coordinators' projection: every change of
	// the leading coordinator's database, on JournalSubject, which the others apply
	// (coorddb.Journal; docs/design.md, "Replication").
	StreamJournal   = "JOURNAL"
	JournalSubject  = "journal.coordinator"
	ConsumerWorkers = "workers"
	// ConsumerAssemblers is the consumer of assemble jobs, taken before tiles.
	ConsumerAssemblers = "assemblers"
	BucketLeases       = "leases"
	// BucketFailures counts the classified failures of each message (see Failures).
	BucketFailures = "failures"
	// MetaMaxFailures is the consumer metadata key that carries Config.MaxFailures to workers.
	MetaMaxFailures = "tilefarm.max_failures"
	// MetaMaxDeliver carries Config.MaxDeliver, the lost deliveries a worker tolerates: the
	// server's own MaxDeliver is unlimited, since it would count hand-backs and failures too.
	MetaMaxDeliver = "tilefarm.max_deliver"
	// oldStreamAdvisories is the stream of MAX_DELIVERIES advisories a farm set up by an older
	// coordinator has; Setup removes it.
	oldStreamAdvisories = "TILES_ADVISORIES"

	tilesSubjects  = "tiles.>"
	eventsSubjects = "events.>"
	dlqSubjects    = "dlq.>"
	notifySubjects = NotifyPrefix + ">"
	dlqPrefix      = "dlq."
)

// maxAckPending lets every worker slot of a large farm hold a tile; the server default of 1000 would
// silently stall dispatch on a big farm.
const maxAckPending = 1 << 16

// maxWaiting lets every worker of a large farm keep a pull waiting on a consumer: each worker's
// idle slots and its assembly loop wait on one, and the server default of 512 refuses the
// 513th ("Exceeded MaxWaiting"), which a fleet of a thousand workers hit tens of thousands of
// times a run (docs/benchmarks.md, "Fleet").
const maxWaiting = 1 << 16

// Queue is the set of JetStream objects one coordinator or worker uses. Create it with Setup
// (the coordinator) or Open (a worker).
type Queue struct {
	JS     jetstream.JetStream
	Tiles  jetstream.Stream
	Events jetstream.Stream
	DLQ    jetstream.Stream
	// Journal is the coordinators' journal (StreamJournal); nil in a worker's Queue (Open).
	Journal jetstream.Stream
	Bands   [NumBands]jetstream.Consumer // tile render jobs, one consumer per priority band
	// Assemblers is the consumer of assemble jobs.
	Assemblers jetstream.Consumer
	Leases     *Leases
	Failures   *Failures
	Dropped    *Dropped // frames whose every job was cancelled
	Workers    *Workers // live workers' heartbeats
	Cfg        Config
	// Log receives the queue's own diagnostics; Setup sets slog.Default().
	Log *slog.Logger

	pools sync.Map // pools whose consumers this Queue ensured, by id (EnsurePool)
	// poolsMade counts the pools EnsurePool made: the Sources of workers sharing this Queue
	// (in-process workers, as coordinator render's) list the pools again at once when it moves,
	// instead of within sourcesRefresh.
	poolsMade atomic.Uint64
}

// Setup creates or updates, idempotently, the TILES work queue, EVENTS and DLQ streams, the shared durable
// pull consumer "workers" and the "leases" bucket. Coordinators and workers may all call it at start-up.
func Setup(ctx context.Context, js jetstream.JetStream, cfg Config) (*Queue, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("setting up queue: %w", err)
	}
	tiles, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        StreamTiles,
		Description: "tilefarm tile and assemble jobs",
		Subjects:    []string{tilesSubjects},
		Retention:   jetstream.WorkQueuePolicy,
		Duplicates:  cfg.DedupWindow,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("setting up stream %s: %w", StreamTiles, err)
	}
	events, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        StreamEvents,
		Description: "tilefarm progress, completion and failure events",
		Subjects:    []string{eventsSubjects},
		Retention:   jetstream.LimitsPolicy,
		Duplicates:  cfg.DedupWindow,
		MaxAge:      EventsRetention,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("setting up stream %s: %w", StreamEvents, err)
	}
	dlq, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        StreamDLQ,
		Description: "tilefarm dead letters, kept until requeued",
		Subjects:    []string{dlqSubjects},
		Retention:   jetstream.LimitsPolicy,
		Duplicates:  cfg.DedupWindow,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("setting up stream %s: %w", StreamDLQ, err)
	}
	// Notifications are kept as long as events: a consumer inside the farm that was down for
	// less reads every one it missed. The coordinator publishes each with its event id as
	// msg id, so a redelivery within the dedup window stores nothing twice.
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        StreamNotify,
		Description: "tilefarm job notifications: completed, failed, cancelled, blocked; frames when asked",
		Subjects:    []string{notifySubjects},
		Retention:   jetstream.LimitsPolicy,
		Duplicates:  cfg.DedupWindow,
		MaxAge:      EventsRetention,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	}); err != nil {
		return nil, fmt.Errorf("setting up stream %s: %w", StreamNotify, err)
	}
	// The journal is kept whole: a coordinator joining the farm rebuilds its projection from
	// it, from the last snapshot a leader wrote.
	journal, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        StreamJournal,
		Description: "tilefarm coordinators' journal: every change of the leader's database",
		Subjects:    []string{JournalSubject},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("setting up stream %s: %w", StreamJournal, err)
	}
	// Consumers on disjoint subjects, so workers can take assembly before more tiles (frames
	// then complete as their tiles do instead of all at the end of a shot), and one per band.
	var pool Pool
	defs := cfg.poolConsumers(pool)
	consumers := make([]jetstream.Consumer, len(defs))
	for i, c := range defs {
		if consumers[i], err = ensureConsumer(ctx, js, c); err != nil {
			return nil, err
		}
	}
	// A farm set up before hand-backs were free captured MAX_DELIVERIES advisories for a
	// watcher; the server no longer raises them (consumers deliver without limit).
	if err := js.DeleteStream(ctx, oldStreamAdvisories); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("removing stream %s: %w", oldStreamAdvisories, err)
	}
	// Bucket TTL, not per-key TTL: kv.Update drops a per-key TTL (nats.go#1994), while with a bucket TTL each
	// revision ages from its own timestamp, so renewing really keeps a lease alive.
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      BucketLeases,
		Description: "tilefarm tile leases; revision is the fencing token",
		History:     1,
		TTL:         cfg.LeaseTTL,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("setting up bucket %s: %w", BucketLeases, err)
	}
	fkv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      BucketFailures,
		Description: "tilefarm classified failures per message; a tile is dead-lettered at max failures",
		History:     1,
		TTL:         EventsRetention,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("setting up bucket %s: %w", BucketFailures, err)
	}
	dropped, workers, err := setupDirectory(ctx, js, cfg)
	if err != nil {
		return nil, err
	}
	return &Queue{
		Dropped:    dropped,
		Workers:    workers,
		JS:         js,
		Tiles:      tiles,
		Events:     events,
		DLQ:        dlq,
		Journal:    journal,
		Bands:      [NumBands]jetstream.Consumer(consumers[1:]),
		Assemblers: consumers[0],
		Leases:     &Leases{kv: kv, ttl: cfg.LeaseTTL},
		Failures:   &Failures{kv: fkv},
		Cfg:        cfg,
		Log:        slog.Default(),
	}, nil
}

// Publish publishes data with Nats-Msg-Id = msgID and waits for the PubAck. duplicate reports that the
// stream's dedup window already held msgID: nothing new was stored (count it, it is not an error).
// An empty msgID publishes without dedup, for messages whose consumer is idempotent anyway (events):
// the stream then keeps no dedup entry for them.
func (f *Queue) Publish(ctx context.Context, subject, msgID string, data []byte, hdr nats.Header) (duplicate bool, err error) {
	m := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
	maps.Copy(m.Header, hdr) // never mutate the caller's header map
	var opts []jetstream.PublishOpt
	if msgID != "" {
		opts = append(opts, jetstream.WithMsgID(msgID))
	}
	ack, err := f.JS.PublishMsg(ctx, m, opts...)
	if err != nil {
		return false, fmt.Errorf("publishing %q to %q: %w", msgID, subject, err)
	}
	return ack.Duplicate, nil
}

// fetchOne pulls one message from cons, waiting at most wait; (nil, nil) on timeout.
//
// The wait is the pull request's own server-side expiry, never a client deadline: a client that
// stops listening before the server expires its pull loses whatever the server sends meanwhile,
// and each such message costs a full ack-wait and a delivery (at 50 ms round trip a 100 ms
// client deadline lost nearly half the first deliveries). For the same reason a cancelled ctx
// does not abandon the pull: what still arrives is handed back (HandBack).
func (f *Queue) fetchOne(ctx context.Context, cons jetstream.Consumer, wait time.Duration) (jetstream.Msg, error) {
	if wait <= 0 {
		return nil, fmt.Errorf("fetching from %s/%s: wait must be positive, got %v", StreamTiles, cons.CachedInfo().Name, wait)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(wait))
	if err != nil {
		return nil, fmt.Errorf("fetching from %s/%s: %w", StreamTiles, cons.CachedInfo().Name, err)
	}
	select {
	case msg, ok := <-batch.Messages():
		if ok && msg != nil {
			return msg, nil
		}
	case <-ctx.Done():
		for msg := range batch.Messages() {
			f.HandBack(ctx, msg, 0)
		}
		return nil, ctx.Err()
	}
	if err := batch.Error(); err != nil && !nothingNow(err) {
		return nil, fmt.Errorf("fetching from %s/%s: %w", StreamTiles, cons.CachedInfo().Name, err)
	}
	return nil, ctx.Err()
}

// Depth reports how many messages TILES holds and how old the oldest is, for the metrics.
func (f *Queue) Depth(ctx context.Context) (msgs uint64, oldest time.Duration, err error) {
	info, err := f.Tiles.Info(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("reading %s depth: %w", StreamTiles, err)
	}
	if info.State.Msgs == 0 || info.State.FirstTime.IsZero() {
		return info.State.Msgs, 0, nil
	}
	return info.State.Msgs, max(0, time.Since(info.State.FirstTime)), nil
}

// LastSeq is the sequence of the newest message TILES holds or held: every message published
// before the call has a sequence at most this, every one published after, a greater one.
func (f *Queue) LastSeq(ctx context.Context) (uint64, error) {
	info, err := f.Tiles.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", StreamTiles, err)
	}
	return info.State.LastSeq, nil
}

// logger returns f.Log, or the default logger for a Queue built by hand.
func (f *Queue) logger() *slog.Logger {
	if f.Log != nil {
		return f.Log
	}
	return slog.Default()
}
