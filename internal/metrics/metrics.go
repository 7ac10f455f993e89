// Package metrics defines the farm's Prometheus metrics (prefix tilefarm_) in two sets: the
// families a coordinator sets (Coordinator) and those a worker sets (Worker). Each process
// registers only the sets it runs, so its /metrics never shows a family nothing in it moves;
// a one-machine process that runs both registers both into one registry. Each process builds
// its own registry, so tests can run many farms in one process without sharing counters.
package metrics

import (
	"errors"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tilefarm/tilefarm/internal/buildinfo"
	"github.com/tilefarm/tilefarm/internal/wire"
	"github.com/tilefarm/tilefarm/render"
)

// Duplicate-suppression layers, the label values of tilefarm_duplicates_suppressed_total. The
// coordinator sets the first, workers the others.
const (
	LayerPublishDedup     = "publish_dedup"
	LayerManifestCheck    = "worker_manifest_check"
	LayerManifestExisting = "manifest_existing"
	LayerManifestConflict = "manifest_conflict"
)

// Dead-letter kinds, the label values of tilefarm_dead_letters_total.
const (
	DeadLetterTile     = "tile"
	DeadLetterAssembly = "assembly"
)

// Submission results, the label values of tilefarm_submissions_total.
const (
	SubmissionCreated  = "created"  // a new job
	SubmissionExisting = "existing" // the idempotency key named a job already: answered with it
	SubmissionConflict = "conflict" // the idempotency key names a job with another payload
	SubmissionBusy     = "busy"     // refused while the pending tiles would exceed --max-pending-tiles
)

// Notification delivery results, the label values of tilefarm_notification_deliveries_total.
const (
	DeliveryOK     = "ok"      // a receiver answered 2xx, or the NATS publish was acknowledged
	DeliveryFailed = "failed"  // an attempt failed; it is retried with backoff
	DeliveryGaveUp = "gave_up" // an attempt failed past the give-up time, or a job's receiver's address is refused: the delivery is dropped
)

// Retry kinds, the label values of tilefarm_retries_total.
const (
	// RetryAttempt is a failed attempt handed back with a delay for another attempt.
	RetryAttempt = "attempt"
	// RetryInPlace is an object-store or NATS operation retried in place during an outage.
	RetryInPlace = "in_place"
)

// NewRegistry returns a fresh registry holding the Go runtime and process collectors, for one
// process's /metrics.
func NewRegistry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}

// Handler serves reg for /metrics.
func Handler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
}

// Coordinator holds the families a coordinator sets.
type Coordinator struct {
	reg *prometheus.Registry

	QueueDepth           prometheus.Gauge
	OldestMessageAge     prometheus.Gauge
	Leader               prometheus.Gauge     // 1 while this coordinator holds the farm's leadership lease
	Terms                prometheus.Counter   // terms of leadership this coordinator began
	TakeOver             prometheus.Histogram // seconds from a term's start to acting as leader
	JournalRefusals      prometheus.Counter   // journal writes JetStream refused
	OutboxPending        prometheus.Gauge
	FramesCompleted      prometheus.Counter
	DeadLetters          *prometheus.CounterVec // by kind
	DuplicatesSuppressed *prometheus.CounterVec // layer publish_dedup
	Submissions          *prometheus.CounterVec // by result
	WorkersLive          prometheus.Gauge
	EventsApplied        *prometheus.CounterVec // by type
	// NotificationsPending and NotificationDeliveries are the notifier's (internal/notify).
	NotificationsPending   prometheus.Gauge
	NotificationDeliveries *prometheus.CounterVec // by result
}

// NewCoordinator registers the coordinator's families (and tilefarm_build_info) into reg.
func NewCoordinator(reg *prometheus.Registry) *Coordinator {
	registerBuildInfo(reg)
	m := &Coordinator{
		reg:              reg,
		QueueDepth:       gauge(reg, "queue_depth", "Tile and assembly messages in the TILES stream not yet acknowledged: waiting, or being worked on."),
		OldestMessageAge: gauge(reg, "queue_oldest_message_age_seconds", "Age of the oldest unacknowledged message in the TILES stream; 0 when it is empty."),
		Leader:           gauge(reg, "coordinator_leader", "1 while this coordinator holds the farm's leadership lease (renewed within the lease TTL), else 0."),
		Terms:            counter(reg, "coordinator_terms_total", "Terms of leadership this coordinator began: each time it took the farm's lead, caught up with the farm's journal and fenced it."),
		TakeOver: register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tilefarm_coordinator_takeover_seconds",
			Help:    "Seconds from taking the farm's leadership lease to acting as leader: catching up with the farm's journal and fencing it.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		})),
		JournalRefusals: counter(reg, "coordinator_journal_refusals_total", "Writes to the farm's journal JetStream refused or could not confirm: another coordinator wrote it since (this one was deposed, or behind), or JetStream was out of reach. Each ends a term of leadership."),
		OutboxPending:   gauge(reg, "outbox_pending", "Outbox records (frames to dispatch, assemblies to ask for) committed but not yet published."),
		FramesCompleted: counter(reg, "frames_completed_total", "Frames whose state became completed: every format asked for promoted."),
		WorkersLive:     gauge(reg, "workers_live", "Workers in the worker directory: each beats every 5 s and leaves it 15 s after its last beat."),
		DeadLetters: counterVec(reg, "dead_letters_total",
			"Dead letters the coordinator recorded, by kind: tiles and assemblies a worker dead-lettered.",
			"kind", DeadLetterTile, DeadLetterAssembly),
		DuplicatesSuppressed: duplicates(reg, LayerPublishDedup),
		Submissions: counterVec(reg, "submissions_total",
			"Job submissions answered, by result: a new job, an existing job for the same idempotency key and payload, a conflict, or refused as busy.",
			"result", SubmissionCreated, SubmissionExisting, SubmissionConflict, SubmissionBusy),
		EventsApplied: counterVec(reg, "events_applied_total",
			"Worker events the coordinator applied to its database, by type, counted once their transaction committed: the farm's event load, which grows with tiles and passes, not with workers.",
			"type", wire.EventTypes...),
		NotificationsPending: gauge(reg, "notifications_pending", "Notifications (job and frame events) recorded and not yet delivered to every destination."),
		NotificationDeliveries: counterVec(reg, "notification_deliveries_total",
			"Delivery attempts of notifications, one per destination (a webhook receiver, the NATS subject), by result: ok, failed (retried with backoff) or gave_up.",
			"result", DeliveryOK, DeliveryFailed, DeliveryGaveUp),
	}
	return m
}

// Handler serves the registry the set is registered in.
func (m *Coordinator) Handler() http.Handler { return Handler(m.reg) }

// Worker holds the families a worker sets. The workers of one process share one.
type Worker struct {
	reg *prometheus.Registry

	TilesInFlight        prometheus.Gauge
	TilesCompleted       prometheus.Counter
	Retries              *prometheus.CounterVec // by kind
	DuplicatesSuppressed *prometheus.CounterVec // worker layers
	LeaseRenewalFailures prometheus.Counter
	CheckpointResumes    prometheus.Counter
	SamplesRecovered     prometheus.Counter
	SamplesRendered      prometheus.Counter
	TileRenderSeconds    prometheus.Histogram
	TileDispatchSeconds  prometheus.Histogram
	FinalizeFailures     prometheus.Counter
	FramesAssembled      prometheus.Counter
	StoreAvailable       prometheus.Gauge
}

// NewWorker registers the worker's families (and tilefarm_build_info) into reg. Called again
// on the same registry it returns the same collectors, so the workers of one process share
// one set instead of panicking on a double registration.
func NewWorker(reg *prometheus.Registry) *Worker {
	registerBuildInfo(reg)
	m := &Worker{
		reg:            reg,
		TilesInFlight:  gauge(reg, "tiles_in_flight", "Tiles this process is rendering right now."),
		TilesCompleted: counter(reg, "tiles_completed_total", "Tiles this process promoted (a manifest it created, not one it found existing)."),
		Retries: counterVec(reg, "retries_total",
			"Retries, by kind: attempt (a failed attempt handed back with a delay) or in_place (an object-store or NATS operation retried during an outage).",
			"kind", RetryAttempt, RetryInPlace),
		DuplicatesSuppressed: duplicates(reg, LayerManifestCheck, LayerManifestExisting, LayerManifestConflict),
		LeaseRenewalFailures: counter(reg, "lease_renewal_failures_total", "Lease renewals that found the lease lost, so the tile was abandoned to its new holder."),
		CheckpointResumes:    counter(reg, "checkpoint_resumes_total", "Tile attempts resumed from a checkpoint."),
		SamplesRecovered:     counter(reg, "samples_recovered_total", "Samples per pixel recovered from checkpoints instead of rendered again, summed over tiles."),
		SamplesRendered:      counter(reg, "samples_rendered_total", "Samples per pixel this process rendered, summed over tiles: recovered samples excluded, samples of attempts that failed later included."),
		FinalizeFailures:     counter(reg, "finalization_failures_total", "Promotions of tiles and frames that failed with an error no in-place retry fixes."),
		FramesAssembled:      counter(reg, "frames_assembled_total", "Frames this process assembled and promoted at least one missing format of."),
		StoreAvailable:       gauge(reg, "worker_store_available", "1 while this worker's object store answers; 0 while it takes no new work because the store is down."),
		TileRenderSeconds: register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tilefarm_tile_render_seconds",
			Help:    "Wall time a tile attempt spent rendering its remaining samples, for attempts that rendered them all.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 16),
		})),
		TileDispatchSeconds: register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tilefarm_tile_dispatch_seconds",
			Help:    "Time from when a tile could first be taken (its message published, or this slot began the fetch that returned it, whichever is later) to its lease taken: the farm's own dispatch latency, without the wait for a free slot.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		})),
	}
	return m
}

// Handler serves the registry the set is registered in.
func (m *Worker) Handler() http.Handler { return Handler(m.reg) }

// register registers c, or returns the equal collector reg already holds: a set registered
// twice into one registry shares its collectors. Any other registration error is a
// programming error, as with MustRegister.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	err := reg.Register(c)
	if err == nil {
		return c
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	panic(err)
}

func counter(reg prometheus.Registerer, name, help string) prometheus.Counter {
	return register(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: "tilefarm_" + name, Help: help}))
}

func gauge(reg prometheus.Registerer, name, help string) prometheus.Gauge {
	return register(reg, prometheus.NewGauge(prometheus.GaugeOpts{Name: "tilefarm_" + name, Help: help}))
}

// counterVec registers a counter with one label and creates the series of each value, so every
// series is scraped (at 0) before it first moves and rate() sees its first increase.
func counterVec(reg prometheus.Registerer, name, help, label string, values ...string) *prometheus.CounterVec {
	v := register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tilefarm_" + name, Help: help}, []string{label}))
	for _, l := range values {
		v.WithLabelValues(l)
	}
	return v
}

// duplicates registers tilefarm_duplicates_suppressed_total, which the coordinator and the
// workers both set, each for its own layers: one help text, so both sets can share it in one
// registry.
func duplicates(reg prometheus.Registerer, layers ...string) *prometheus.CounterVec {
	return counterVec(reg, "duplicates_suppressed_total",
		"Work suppressed because it was already done, by layer: publish_dedup (coordinator), worker_manifest_check, manifest_existing, manifest_conflict (workers).",
		"layer", layers...)
}

// registerBuildInfo registers tilefarm_build_info once per registry.
func registerBuildInfo(reg prometheus.Registerer) {
	g := register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "tilefarm_build_info",
		Help: "Always 1; its labels name the build: tilefarm's version, the Go version and the path tracer's render version.",
	}, []string{"version", "goversion", "renderer"}))
	g.WithLabelValues(buildinfo.Version(), buildinfo.GoVersion(), render.Version).Set(1)
}

// CoordinatorFamilies and WorkerFamilies are the tilefarm families each process exports,
// sorted: exactly those it sets (docs/operations.md, "Metrics"). The tests hold a registry
// and the /metrics of real processes against them.
var (
	CoordinatorFamilies = []string{
		"tilefarm_build_info",
		"tilefarm_coordinator_journal_refusals_total",
		"tilefarm_coordinator_leader",
		"tilefarm_coordinator_takeover_seconds",
		"tilefarm_coordinator_terms_total",
		"tilefarm_dead_letters_total",
		"tilefarm_duplicates_suppressed_total",
		"tilefarm_events_applied_total",
		"tilefarm_frames_completed_total",
		"tilefarm_notification_deliveries_total",
		"tilefarm_notifications_pending",
		"tilefarm_outbox_pending",
		"tilefarm_queue_depth",
		"tilefarm_queue_oldest_message_age_seconds",
		"tilefarm_submissions_total",
		"tilefarm_workers_live",
	}
	WorkerFamilies = []string{
		"tilefarm_build_info",
		"tilefarm_checkpoint_resumes_total",
		"tilefarm_duplicates_suppressed_total",
		"tilefarm_finalization_failures_total",
		"tilefarm_frames_assembled_total",
		"tilefarm_lease_renewal_failures_total",
		"tilefarm_retries_total",
		"tilefarm_samples_recovered_total",
		"tilefarm_samples_rendered_total",
		"tilefarm_tile_dispatch_seconds",
		"tilefarm_tile_render_seconds",
		"tilefarm_tiles_completed_total",
		"tilefarm_tiles_in_flight",
		"tilefarm_worker_store_available",
	}
)
