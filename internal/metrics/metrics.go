// Package metrics defines the farm's Prometheus metrics (prefix tilefarm_). Each process builds
// its own registry, so tests can run many workers in one process without sharing counters.
package metrics

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Duplicate-suppression layers, the label values of DuplicatesSuppressed.
const (
	LayerPublishDedup     = "publish_dedup"
	LayerManifestCheck    = "worker_manifest_check"
	LayerManifestExisting = "manifest_existing"
	LayerManifestConflict = "manifest_conflict"
)

// Metrics holds every farm metric; a coordinator and a worker use the parts that concern them.
type Metrics struct {
	Registry *prometheus.Registry

	QueueDepth           prometheus.Gauge
	OldestMessageAge     prometheus.Gauge
	TilesInFlight        prometheus.Gauge
	TilesCompleted       prometheus.Counter
	Retries              prometheus.Counter
	DuplicatesSuppressed *prometheus.CounterVec
	LeaseRenewalFailures prometheus.Counter
	CheckpointResumes    prometheus.Counter
	SamplesRecovered     prometheus.Counter
	TileRenderSeconds    prometheus.Histogram
	DeadLetters          prometheus.Counter
	FinalizeFailures     prometheus.Counter
	FramesCompleted      prometheus.Counter
	SamplesRendered      prometheus.Counter
	OutboxPending        prometheus.Gauge
	StoreAvailable       prometheus.Gauge
}

// New creates the metrics in a fresh registry.
func New() *Metrics {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	f := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: "tilefarm_" + name, Help: help})
		r.MustRegister(c)
		return c
	}
	g := func(name, help string) prometheus.Gauge {
		c := prometheus.NewGauge(prometheus.GaugeOpts{Name: "tilefarm_" + name, Help: help})
		r.MustRegister(c)
		return c
	}
	m := &Metrics{
		Registry:             r,
		QueueDepth:           g("queue_depth", "Tile and assemble messages waiting in the TILES stream."),
		OldestMessageAge:     g("queue_oldest_message_age_seconds", "Age of the oldest message in the TILES stream."),
		TilesInFlight:        g("tiles_in_flight", "Tiles this process is rendering right now."),
		TilesCompleted:       f("tiles_completed_total", "Tiles promoted by this process."),
		Retries:              f("retries_total", "Messages negatively acknowledged for a retry."),
		LeaseRenewalFailures: f("lease_renewal_failures_total", "Lease renewals that failed, so the tile was abandoned."),
		CheckpointResumes:    f("checkpoint_resumes_total", "Tiles resumed from a checkpoint."),
		SamplesRecovered:     f("samples_recovered_total", "Samples per pixel recovered from checkpoints instead of rendered again."),
		DeadLetters:          f("dead_letters_total", "Messages moved to the DLQ stream."),
		FinalizeFailures:     f("finalization_failures_total", "Promotions that failed."),
		FramesCompleted:      f("frames_completed_total", "Frames assembled and promoted."),
		SamplesRendered:      f("samples_rendered_total", "Samples per pixel rendered, summed over tiles."),
		OutboxPending:        g("outbox_pending", "Outbox records not yet published."),
		StoreAvailable:       g("worker_store_available", "1 while this worker's object store answers; 0 while it takes no new work because the store is down."),
	}
	m.DuplicatesSuppressed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tilefarm_duplicates_suppressed_total",
		Help: "Work suppressed because it was already done, by layer.",
	}, []string{"layer"})
	m.TileRenderSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "tilefarm_tile_render_seconds",
		Help:    "Wall time to render one tile attempt.",
		Buckets: prometheus.ExponentialBuckets(0.01, 2, 16),
	})
	r.MustRegister(m.DuplicatesSuppressed, m.TileRenderSeconds)
	for _, l := range []string{LayerPublishDedup, LayerManifestCheck, LayerManifestExisting, LayerManifestConflict} {
		m.DuplicatesSuppressed.WithLabelValues(l)
	}
	return m
}

// Handler serves the registry for /metrics.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}
