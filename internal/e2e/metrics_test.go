//go:build linux

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/internal/proctest"
	"go.yaml.in/yaml/v3"
)

// families is one scrape of a /metrics, parsed.
type families map[string]*dto.MetricFamily

// scrape reads and parses addr's /metrics in the text exposition format.
func scrape(t *testing.T, addr string) families {
	t.Helper()
	fams, err := tryScrape(addr)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

func tryScrape(addr string) (families, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scraping %s: %s", addr, resp.Status)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parsing the metrics of %s: %w", addr, err)
	}
	return fams, nil
}

// tilefarm lists the tilefarm_ families of a scrape, sorted.
func (f families) tilefarm() []string {
	var out []string
	for name := range f {
		if strings.HasPrefix(name, "tilefarm_") {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// value sums the samples of family name whose labels include labels ("k=v" pairs); a
// histogram's samples count as its observation counts. It fails the test on a family the
// scrape does not have.
func (f families) value(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	mf, ok := f[name]
	if !ok {
		t.Fatalf("no family %s in %v", name, f.tilefarm())
	}
	sum := 0.0
	for _, m := range mf.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		match := true
		for _, kv := range labels {
			k, v, _ := strings.Cut(kv, "=")
			match = match && have[k] == v
		}
		if !match {
			continue
		}
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		case m.Untyped != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum
}

// waitMetrics waits until addr serves /metrics.
func waitMetrics(t *testing.T, addr string, p *proctest.Proc) families {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		fams, err := tryScrape(addr)
		if err == nil {
			return fams
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s serves no metrics: %v\n%s", p.Name, err, p.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A farm of a coordinator and a separate worker, through a run with a forced retry, a
// duplicate submission and a dead letter: each counter that should move moves, on the process
// that sets it, and neither process exports a family it never sets. Then every metric the
// shipped dashboard and alerting rules use is checked against what the two processes export.
func TestMetricsOfARun(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	f := startServe(t, t.TempDir(), "--max-failures", "2")
	maddr := freePort(t)
	w := f.worker("w", t.TempDir(), "--metrics-listen", maddr, "--fault-panic-tile", "8:32,0,64,27",
		"--fault-pass-delay", "100ms")
	before := waitMetrics(t, maddr, w)
	if got := before.tilefarm(); !slices.Equal(got, metrics.WorkerFamilies) {
		t.Fatalf("worker families before any work:\n got %v\nwant %v", got, metrics.WorkerFamilies)
	}
	if v := before.value(t, "tilefarm_worker_store_available"); v != 1 {
		t.Fatalf("store available %v on a healthy worker, want 1", v)
	}

	args := append([]string{scene, "--frames", "8-9"}, small...)
	st, r := f.submit(args...)
	if r.code != 42 && r.code != 3 {
		t.Fatalf("submit: %s", r)
	}
	again, r := f.submit(args...) // the same submission twice: the same job
	if again.JobID != st.JobID {
		t.Fatalf("the same submission twice made jobs %s and %s: %s", st.JobID, again.JobID, r)
	}

	// During the run: the worker renders a tile at a time, the coordinator sees a backlog.
	maxInFlight, maxDepth, maxLive := 0.0, 0.0, 0.0
	var done bool
	for deadline := time.Now().Add(3 * time.Minute); !done; {
		wm, cm := scrape(t, maddr), scrape(t, f.HTTP)
		maxInFlight = max(maxInFlight, wm.value(t, "tilefarm_tiles_in_flight"))
		maxDepth = max(maxDepth, cm.value(t, "tilefarm_queue_depth"))
		maxLive = max(maxLive, cm.value(t, "tilefarm_workers_live"))
		_, r := f.status(st.JobID)
		done = r.code == 0 || r.code == 1
		if !done && time.Now().After(deadline) {
			t.Fatalf("job %s not finished after 3 minutes: %s", st.JobID, r)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if maxLive != 1 {
		t.Errorf("the coordinator counted at most %v live workers during the run, want the 1 running", maxLive)
	}
	if maxInFlight != 1 {
		t.Errorf("tiles in flight peaked at %v during the run, want 1 (one slot)", maxInFlight)
	}
	if maxDepth < 1 {
		t.Errorf("queue depth never above 0 during the run")
	}
	final, r := f.status(st.JobID)
	if r.code != 1 || final.TilesFailed != 1 || final.FramesCompleted != 1 {
		t.Fatalf("job with a poison tile: want exit 1, one tile failed, one frame completed: %s", r)
	}

	// After the run.
	cm, wm := scrape(t, f.HTTP), scrape(t, maddr)
	if got := cm.tilefarm(); !slices.Equal(got, metrics.CoordinatorFamilies) {
		t.Errorf("coordinator families:\n got %v\nwant %v", got, metrics.CoordinatorFamilies)
	}
	if got := wm.tilefarm(); !slices.Equal(got, metrics.WorkerFamilies) {
		t.Errorf("worker families:\n got %v\nwant %v", got, metrics.WorkerFamilies)
	}
	for _, c := range []struct {
		fams   families
		name   string
		labels []string
		want   float64
	}{
		{cm, "tilefarm_submissions_total", []string{"result=created"}, 1},
		{cm, "tilefarm_submissions_total", []string{"result=existing"}, 1},
		{cm, "tilefarm_dead_letters_total", []string{"kind=tile"}, 1},
		{cm, "tilefarm_dead_letters_total", []string{"kind=assembly"}, 0},
		{cm, "tilefarm_frames_completed_total", nil, 1},
		{wm, "tilefarm_retries_total", []string{"kind=attempt"}, 1}, // failure 1 of 2 is retried, failure 2 dead-letters
		{wm, "tilefarm_tiles_completed_total", nil, float64(final.TilesCompleted)},
		{wm, "tilefarm_frames_assembled_total", nil, 1},
		{wm, "tilefarm_tiles_in_flight", nil, 0},
		{wm, "tilefarm_tile_render_seconds", nil, float64(final.TilesCompleted)},
	} {
		if got := c.fams.value(t, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// 8 samples per pixel for every tile promoted; the poison tile panics before its first pass.
	if got, want := wm.value(t, "tilefarm_samples_rendered_total"), float64(8*final.TilesCompleted); got != want || got <= 0 {
		t.Errorf("samples rendered %v, want %v", got, want)
	}
	for name, fams := range map[string]families{"coordinator": cm, "worker": wm} {
		bi := fams["tilefarm_build_info"].GetMetric()
		if len(bi) != 1 || bi[0].GetGauge().GetValue() != 1 {
			t.Fatalf("%s build_info: %v", name, bi)
		}
		labels := map[string]string{}
		for _, l := range bi[0].GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["goversion"] != runtime.Version() || labels["version"] == "" {
			t.Errorf("%s build_info labels %v: want version and goversion %s", name, labels, runtime.Version())
		}
	}

	t.Run("deploy files use exported metrics", func(t *testing.T) {
		exprs := append(dashboardExprs(t, "../../deploy/grafana/tilefarm.json"), alertExprs(t, "../../deploy/prometheus/alerts.yml")...)
		used := metricNames(exprs)
		if len(used) < 10 {
			t.Fatalf("only %d tilefarm metrics found in the dashboard and alerts: %v", len(used), used)
		}
		for _, name := range used {
			if !exported(name, cm, wm) {
				t.Errorf("%s is used by the dashboard or the alerts but exported by neither the coordinator nor a worker", name)
			}
		}
	})
}

// A one-machine farm (serve with in-process workers) registers the coordinator's and the
// workers' families into one /metrics, each once.
func TestMetricsOfOneProcess(t *testing.T) {
	t.Parallel()
	f := startServe(t, t.TempDir(), "--workers", "2")
	st, r := f.submit(append([]string{example("shot"), "--frames", "3-3"}, small...)...)
	if r.code != 42 && r.code != 3 && r.code != 0 {
		t.Fatalf("submit: %s", r)
	}
	done := f.waitDone(st.JobID, 2*time.Minute)
	if done.State != "completed" {
		t.Fatalf("job: %+v", done)
	}
	fams := scrape(t, f.HTTP)
	want := slices.Concat(metrics.CoordinatorFamilies, metrics.WorkerFamilies)
	slices.Sort(want)
	want = slices.Compact(want)
	if got := fams.tilefarm(); !slices.Equal(got, want) {
		t.Fatalf("families of a coordinator with workers:\n got %v\nwant %v", got, want)
	}
	if got := fams.value(t, "tilefarm_tiles_completed_total"); got != float64(done.TilesTotal) {
		t.Errorf("tiles completed %v, want %d", got, done.TilesTotal)
	}
	if got := fams.value(t, "tilefarm_frames_completed_total"); got != 1 {
		t.Errorf("frames completed %v, want 1", got)
	}
	if n := len(fams["tilefarm_build_info"].GetMetric()); n != 1 {
		t.Errorf("%d build_info series, want 1", n)
	}
	layers := 0
	for _, m := range fams["tilefarm_duplicates_suppressed_total"].GetMetric() {
		if len(m.GetLabel()) == 1 {
			layers++
		}
	}
	if layers != 4 {
		t.Errorf("duplicates suppressed has %d layers, want the coordinator's and the workers' 4", layers)
	}
}

// dashboardExprs returns every query expression of a Grafana dashboard.
func dashboardExprs(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var out []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && k == "expr" {
					out = append(out, s)
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(doc)
	if len(out) == 0 {
		t.Fatalf("%s has no query expressions", path)
	}
	return out
}

// alertExprs returns the expressions of a Prometheus rule file, checking that every rule is
// a complete alert.
func alertExprs(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&rules); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var out []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || r.Expr == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("%s: incomplete alert %+v", path, r)
			}
			if r.For != "" {
				if _, err := model.ParseDuration(r.For); err != nil {
					t.Errorf("%s: alert %s: for %q: %v", path, r.Alert, r.For, err)
				}
			}
			out = append(out, r.Expr)
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s has no alerts", path)
	}
	return out
}

var metricName = regexp.MustCompile(`\btilefarm_[a-zA-Z0-9_]+`)

// metricNames returns the tilefarm metrics the expressions name, sorted and once each.
func metricNames(exprs []string) []string {
	var out []string
	for _, e := range exprs {
		out = append(out, metricName.FindAllString(e, -1)...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// exported reports whether a series name belongs to a family one of the scrapes has: the
// family itself, or a histogram's _bucket, _sum or _count series.
func exported(name string, scrapes ...families) bool {
	for _, fams := range scrapes {
		if _, ok := fams[name]; ok {
			return true
		}
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			base, ok := strings.CutSuffix(name, suffix)
			if mf := fams[base]; ok && mf != nil && mf.GetType() == dto.MetricType_HISTOGRAM {
				return true
			}
		}
	}
	return false
}
