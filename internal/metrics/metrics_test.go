package metrics

import (
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/tilefarm/tilefarm/internal/buildinfo"
)

// gather returns the tilefarm families of reg by name.
func gather(t *testing.T, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gathering: %v", err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "tilefarm_") {
			out[mf.GetName()] = mf
		}
	}
	return out
}

func names(fams map[string]*dto.MetricFamily) []string {
	var out []string
	for n := range fams {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// Each process registers exactly the families it sets: a worker shows no queue depth, a
// coordinator no tiles in flight.
func TestEachSetRegistersOnlyItsFamilies(t *testing.T) {
	creg := NewRegistry()
	NewCoordinator(creg)
	if got := names(gather(t, creg)); !slices.Equal(got, CoordinatorFamilies) {
		t.Fatalf("coordinator families:\n got %v\nwant %v", got, CoordinatorFamilies)
	}
	wreg := NewRegistry()
	NewWorker(wreg)
	if got := names(gather(t, wreg)); !slices.Equal(got, WorkerFamilies) {
		t.Fatalf("worker families:\n got %v\nwant %v", got, WorkerFamilies)
	}
}

// A one-machine process registers both sets into one registry, and its in-process workers
// share one worker set: no double registration panics, and a count made through one set is
// the count every other set of the registry reads.
func TestBothSetsShareOneRegistry(t *testing.T) {
	reg := NewRegistry()
	c := NewCoordinator(reg)
	w1 := NewWorker(reg)
	w2 := NewWorker(reg)
	w1.TilesCompleted.Inc()
	w2.TilesCompleted.Inc()
	if got := testutil.ToFloat64(w1.TilesCompleted); got != 2 {
		t.Fatalf("tiles completed through two worker sets of one registry = %v, want 2", got)
	}
	c.DuplicatesSuppressed.WithLabelValues(LayerPublishDedup).Inc()
	w1.DuplicatesSuppressed.WithLabelValues(LayerManifestCheck).Add(3)
	fams := gather(t, reg)
	want := slices.Concat(CoordinatorFamilies, WorkerFamilies)
	slices.Sort(want)
	want = slices.Compact(want)
	if got := names(fams); !slices.Equal(got, want) {
		t.Fatalf("families of a coordinator with workers:\n got %v\nwant %v", got, want)
	}
	layers := map[string]float64{}
	for _, m := range fams["tilefarm_duplicates_suppressed_total"].GetMetric() {
		layers[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
	}
	if len(layers) != 4 || layers[LayerPublishDedup] != 1 || layers[LayerManifestCheck] != 3 {
		t.Fatalf("duplicates by layer = %v, want all 4 layers, publish_dedup 1 and worker_manifest_check 3", layers)
	}
	if n := len(fams["tilefarm_build_info"].GetMetric()); n != 1 {
		t.Fatalf("%d build_info series in one process, want 1", n)
	}
}

// tilefarm_build_info is 1 and names this binary's version and Go version.
func TestBuildInfo(t *testing.T) {
	reg := NewRegistry()
	NewWorker(reg)
	mf := gather(t, reg)["tilefarm_build_info"]
	if mf == nil || len(mf.GetMetric()) != 1 {
		t.Fatalf("build_info: %v", mf)
	}
	m := mf.GetMetric()[0]
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	if m.GetGauge().GetValue() != 1 || labels["goversion"] != runtime.Version() || labels["version"] == "" || labels["version"] != buildinfo.Version() || labels["renderer"] == "" {
		t.Fatalf("build_info = %v with labels %v", m.GetGauge().GetValue(), labels)
	}
}

// Names follow Prometheus' conventions: counters end in _total, nothing else does, and a
// histogram names its unit.
func TestNamingConventions(t *testing.T) {
	reg := NewRegistry()
	NewCoordinator(reg)
	NewWorker(reg)
	for name, mf := range gather(t, reg) {
		total := strings.HasSuffix(name, "_total")
		switch mf.GetType() {
		case dto.MetricType_COUNTER:
			if !total {
				t.Errorf("counter %s does not end in _total", name)
			}
		case dto.MetricType_HISTOGRAM:
			if !strings.HasSuffix(name, "_seconds") && !strings.HasSuffix(name, "_bytes") {
				t.Errorf("histogram %s names no unit", name)
			}
		default:
			if total {
				t.Errorf("%s %s ends in _total", mf.GetType(), name)
			}
		}
		if mf.GetHelp() == "" {
			t.Errorf("%s has no help", name)
		}
	}
}
