package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/internal/faults"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/objstore"
	"github.com/tilefarm/tilefarm/render"
)

// A tile resumed half-way from a checkpoint counts only the samples it rendered itself in
// tilefarm_samples_rendered_total, not the tile's whole spp; the others are recovered.
func TestSamplesRenderedOfAResumedTile(t *testing.T) {
	h := newRunHarness(t)
	job := h.job()
	half := h.reference(t, job, job.Settings.SPP/2).Export()
	h.putCheckpoint(t, job, half, identity.BuildFor(job.Settings))
	w, m := h.worker(t, Config{PassesPerTile: 4})
	h.deliver(t, w, job)
	if ok, err := finalize.ManifestExists(h.ctx, h.objects, layout.TileManifestKey(job.FrameKey, job.TileKey)); err != nil || !ok {
		t.Fatalf("tile not promoted (%v):\n%s", err, h.logs.String())
	}
	spp := job.Settings.SPP
	if got := testutil.ToFloat64(m.SamplesRendered); got != float64(spp-half.Next) {
		t.Fatalf("samples rendered %v, want %d (spp %d minus %d recovered)", got, spp-half.Next, spp, half.Next)
	}
	if got := testutil.ToFloat64(m.SamplesRecovered); got != float64(half.Next) {
		t.Fatalf("samples recovered %v, want %d", got, half.Next)
	}
	if got := testutil.ToFloat64(m.CheckpointResumes); got != 1 {
		t.Fatalf("checkpoint resumes %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.TilesCompleted); got != 1 {
		t.Fatalf("tiles completed %v, want 1", got)
	}
	samePixels(t, h.promoted(t, job), h.reference(t, job, spp).Pixels())
}

// flakyCheckpointGets fails the first reads of remote checkpoints as a connection reset
// would, then reads them.
type flakyCheckpointGets struct {
	objstore.Store
	mu       sync.Mutex
	failures int // reads still to fail
	reads    int // reads of checkpoints, failed or not
}

func (f *flakyCheckpointGets) Get(ctx context.Context, key string) ([]byte, error) {
	if _, ok := layout.CheckpointTile(key); ok {
		f.mu.Lock()
		fail := f.failures > 0
		f.failures--
		f.reads++
		f.mu.Unlock()
		if fail {
			return nil, fmt.Errorf("reading %s: %w", key, syscall.ECONNRESET)
		}
	}
	return f.Store.Get(ctx, key)
}

// Property: a resume survives a store that fails for a moment. The remote checkpoint is read
// like every other store read of a tile, retried in place, so a transient error does not
// throw away the samples it holds and render the tile from sample 0.
func TestResumeRetriesAFailedCheckpointRead(t *testing.T) {
	h := newRunHarness(t)
	job := h.job()
	half := h.reference(t, job, job.Settings.SPP/2).Export()
	h.putCheckpoint(t, job, half, identity.BuildFor(job.Settings))
	flaky := &flakyCheckpointGets{Store: h.objects, failures: 2}
	w, m := h.workerOn(t, Config{PassesPerTile: 4, RetryBase: 10 * time.Millisecond}, flaky)
	h.deliver(t, w, job)
	if flaky.reads != 3 {
		t.Fatalf("the checkpoint was read %d times, want 3 (two failed, then read):\n%s", flaky.reads, h.logs.String())
	}
	if got := testutil.ToFloat64(m.SamplesRecovered); got != float64(half.Next) {
		t.Fatalf("samples recovered %v, want %d after the failed reads:\n%s", got, half.Next, h.logs.String())
	}
	if !strings.Contains(h.logs.String(), "retrying in place") {
		t.Fatalf("no retry in place logged:\n%s", h.logs.String())
	}
	samePixels(t, h.promoted(t, job), h.reference(t, job, job.Settings.SPP).Pixels())
}

// A tile whose first attempt is interrupted by a shutdown after some passes, then resumed by
// another worker from the checkpoint the first left: each sample is counted once, by the
// worker that rendered it, so the two counts add up to exactly the tile's spp.
func TestSamplesRenderedAcrossAnInterruptedAttempt(t *testing.T) {
	h := newRunHarness(t)
	job := h.job()
	spp := job.Settings.SPP
	w1, m1 := h.worker(t, Config{PassesPerTile: 4, CheckpointEvery: -1, Faults: faults.Plan{PassDelay: 300 * time.Millisecond}})
	msg := h.publishAndFetch(t, job)
	ctx1, stop := context.WithCancel(h.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		w1.handle(ctx1, msg)
	}()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(h.logs.String(), "checkpoint saved") {
		if time.Now().After(deadline) {
			t.Fatalf("no checkpoint after a pass:\n%s", h.logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop() // the worker shuts down mid-tile: it checkpoints and hands the tile back
	<-done

	first := int(testutil.ToFloat64(m1.SamplesRendered))
	if first <= 0 || first >= spp {
		t.Fatalf("the interrupted attempt counted %d samples rendered, want some but not all %d", first, spp)
	}
	c, ok, err := h.ckpts.Load(h.ctx, job.TileKey)
	if err != nil || !ok || c.Next != first {
		t.Fatalf("checkpoint after the shutdown: next %d (found %v, %v), want the %d samples counted", c.Next, ok, err, first)
	}
	if got := histogramCount(t, m1); got != 0 {
		t.Fatalf("an attempt that did not finish rendering observed %d render times, want 0", got)
	}

	// The Nak put the tile straight back; a second worker resumes it from the local checkpoint.
	w2, m2 := h.worker(t, Config{PassesPerTile: 4})
	msg, err = h.queue.Sources(queue.Capabilities{}).FetchTile(h.ctx, 5*time.Second)
	if err != nil || msg == nil {
		t.Fatalf("FetchTile after the shutdown = %v, %v", msg, err)
	}
	w2.handle(h.ctx, msg)
	second := int(testutil.ToFloat64(m2.SamplesRendered))
	if recovered := int(testutil.ToFloat64(m2.SamplesRecovered)); recovered != first {
		t.Fatalf("the resumed attempt recovered %d samples, want %d", recovered, first)
	}
	if first+second != spp {
		t.Fatalf("samples rendered %d + %d across the two attempts, want exactly spp %d", first, second, spp)
	}
	if got := histogramCount(t, m2); got != 1 {
		t.Fatalf("the resumed attempt observed %d render times, want 1", got)
	}
	samePixels(t, h.promoted(t, job), h.reference(t, job, spp).Pixels())
	// The checkpoints the resume found and the shutdown uploaded are gone once it is promoted.
	if _, ok, err := h.ckpts.Load(h.ctx, job.TileKey); ok || err != nil {
		t.Errorf("local checkpoint after promotion: found %v, %v; want deleted", ok, err)
	}
	if _, err := h.objects.Stat(h.ctx, layout.CheckpointKey(job.TileKey)); !errors.Is(err, objstore.ErrNotFound) {
		t.Errorf("remote checkpoint after promotion: %v, want deleted", err)
	}
}

// histogramCount is how many tile render times m observed.
func histogramCount(t *testing.T, m *metrics.Worker) uint64 {
	t.Helper()
	n, _ := histogram(t, m.TileRenderSeconds)
	return n
}

// histogram is the sample count and sum of h.
func histogram(t *testing.T, h prometheus.Histogram) (uint64, float64) {
	t.Helper()
	var pb dto.Metric
	if err := h.Write(&pb); err != nil {
		t.Fatal(err)
	}
	return pb.GetHistogram().GetSampleCount(), pb.GetHistogram().GetSampleSum()
}

// A first delivery leased at once observes its dispatch latency, from when the slot could take
// it to its lease, no longer than the test saw pass; a redelivery, whose wait includes an
// earlier attempt's, observes none.
func TestDispatchLatencyOfFirstDeliveries(t *testing.T) {
	h := newRunHarness(t)
	w, m := h.worker(t, Config{})
	began := time.Now()
	msg := h.publishAndFetch(t, h.job())
	w.serve(h.ctx, msg, began, nil)
	n, sum := histogram(t, m.TileDispatchSeconds)
	if n != 1 || sum <= 0 || sum > time.Since(began).Seconds() {
		t.Fatalf("dispatch latency: %d observations summing %.4fs, want one within the %.4fs the test took", n, sum, time.Since(began).Seconds())
	}

	job := h.job() // another tile of the frame, not promoted yet
	job.Rect = render.Rect{X1: 16, Y1: 16}
	job.TileKey, job.InputHash = identity.TileKey(job.FrameKey, job.Rect), identity.InputHash(job.SceneVersion, job.Settings, 1, job.Rect)
	msg = h.publishAndFetch(t, job)
	if err := msg.Nak(); err != nil {
		t.Fatal(err)
	}
	began = time.Now()
	again, err := h.queue.Sources(queue.Capabilities{}).FetchTile(h.ctx, 5*time.Second)
	if err != nil || again == nil {
		t.Fatalf("FetchTile of the redelivery = %v, %v", again, err)
	}
	w.serve(h.ctx, again, began, nil)
	if got := testutil.ToFloat64(m.TilesCompleted); got != 2 {
		t.Fatalf("tiles completed = %v, want the redelivered tile rendered too", got)
	}
	if n, _ := histogram(t, m.TileDispatchSeconds); n != 1 {
		t.Fatalf("dispatch latency observations after a redelivery = %d, want still 1", n)
	}
}

// An attempt that panics mid-render is retried and leaves no tile in flight.
func TestPanickingTileLeavesNothingInFlight(t *testing.T) {
	h := newRunHarness(t)
	job := h.job()
	w, m := h.worker(t, Config{Faults: faults.Plan{PanicTile: &faults.TileAt{Frame: job.Frame, Rect: job.Rect}}})
	h.deliver(t, w, job)
	if got := testutil.ToFloat64(m.TilesInFlight); got != 0 {
		t.Fatalf("tiles in flight after a panicking attempt = %v, want 0", got)
	}
	if got := testutil.ToFloat64(m.Retries.WithLabelValues(metrics.RetryAttempt)); got != 1 {
		t.Fatalf("attempt retries = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.SamplesRendered); got != 0 {
		t.Fatalf("samples rendered by an attempt that panicked before its first pass = %v, want 0", got)
	}
}

// With a sample delay the samples of one pass render and count one at a time (the model of a
// slow render a kill can land in), and the pixels are those of a render in one call.
func TestSampleDelayCountsSamplesInsideAPass(t *testing.T) {
	h := newRunHarness(t)
	job := h.job()
	spp := job.Settings.SPP
	if spp < 3 {
		t.Fatalf("the harness job has %d spp, want at least 3 to see a pass part-way", spp)
	}
	w, m := h.worker(t, Config{PassesPerTile: 1, CheckpointEvery: time.Hour, Faults: faults.Plan{SampleDelay: 40 * time.Millisecond}})
	msg := h.publishAndFetch(t, job)
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.handle(h.ctx, msg)
	}()
	partway := false
	for running := true; running; {
		select {
		case <-done:
			running = false
		case <-time.After(5 * time.Millisecond):
			if n := int(testutil.ToFloat64(m.SamplesRendered)); n > 0 && n < spp {
				partway = true
			}
		}
	}
	if !partway {
		t.Errorf("samples rendered never stood between 0 and %d inside the tile's one pass", spp)
	}
	if got := int(testutil.ToFloat64(m.SamplesRendered)); got != spp {
		t.Fatalf("samples rendered %d, want %d", got, spp)
	}
	samePixels(t, h.promoted(t, job), h.reference(t, job, spp).Pixels())
}
