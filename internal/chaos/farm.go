//go:build unix

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/client"
	"github.com/tilefarm/tilefarm/internal/farmtest"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/miniotest"
	"github.com/tilefarm/tilefarm/internal/natstest"
	"github.com/tilefarm/tilefarm/internal/proctest"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/scene/jsonscene"
	"github.com/tilefarm/tilefarm/internal/wire"
	"github.com/tilefarm/tilefarm/objstore"
)

// config is one run of the harness.
type config struct {
	dir    string
	seed   uint64
	soak   time.Duration
	only   string
	outage time.Duration
	log    io.Writer
}

// Farm timings: short, so a kill's tile is back within seconds and scenarios stay quick.
const (
	ackWait  = "3s"
	leaseTTL = "3s"
)

// jobSettings render a frame in 6 tiles of about a second each on the slowed workers.
var jobSettings = []string{"--width", "96", "--height", "54", "--spp", "8", "--tile", "32"}

// workerSlow makes every pass take a while and checkpoints (locally and remotely) after each,
// so a fault always finds tiles in progress with samples to recover.
var workerSlow = []string{"--fault-pass-delay", "120ms", "--passes", "8", "--checkpoint-every", "0", "--remote-checkpoint-every", "0"}

// theFarm is one farm under test (farmtest.Farm): its NATS and MinIO servers, coordinator and
// workers, the clients the checks read it with, and the local references its frames are
// compared with.
type theFarm struct {
	*farmtest.Farm
	cfg     config
	name    string
	nats    *natstest.Cluster
	minio   *miniotest.Deployment
	objects objstore.Store
	nc      *nats.Conn
	js      jetstream.JetStream
	workers []*farmtest.Worker // the workers started without extra flags, which random faults freeze
	api     *client.Client
	bundle  *bundle.Bundle
	scene   string
	mu      sync.Mutex
	refs    map[int]string // reference PNG by frame
	frame   int            // the last frame number handed out
}

func (f *theFarm) logf(format string, args ...any) {
	fmt.Fprintf(f.cfg.log, "chaos [%s] %s\n", f.name, fmt.Sprintf(format, args...))
}

// newFarm starts NATS (natsNodes), MinIO (minioNodes), a coordinator and workers workers.
func newFarm(ctx context.Context, cfg config, bins farmtest.Binaries, name string, natsNodes, minioNodes, workers int) (*theFarm, error) {
	f := &theFarm{cfg: cfg, name: name, refs: map[int]string{},
		Farm: &farmtest.Farm{Bins: bins, Dir: filepath.Join(cfg.dir, name), LogLevel: "info", HealthTimeout: 90 * time.Second}}
	if err := os.MkdirAll(f.Dir, 0o755); err != nil {
		return nil, err
	}
	var err error
	if f.nats, err = natstest.Launch(filepath.Join(f.Dir, "nats"), natsNodes, natstest.Options{}); err != nil {
		return nil, fmt.Errorf("starting NATS: %w", err)
	}
	f.UseNATS(f.nats)
	if f.minio, err = miniotest.LaunchDeployment(filepath.Join(f.Dir, "minio"), minioNodes); err != nil {
		f.close()
		return nil, fmt.Errorf("starting MinIO: %w", err)
	}
	f.UseMinIO(f.minio)
	f.ServeArgs = []string{"--replicas", strconv.Itoa(min(3, len(f.nats.Servers))), "--ack-wait", ackWait, "--lease-ttl", leaseTTL,
		"--reconcile-every", "5s"}
	for _, kv := range f.minio.Env() {
		k, v, _ := strings.Cut(kv, "=")
		os.Setenv(k, v) // the harness opens the store like the farm does
	}
	if f.objects, err = objstore.OpenStore(ctx, f.minio.URL()); err != nil {
		f.close()
		return nil, err
	}
	if f.nc, err = nats.Connect(f.nats.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond)); err != nil {
		f.close()
		return nil, err
	}
	if f.js, err = jetstream.New(f.nc); err != nil {
		f.close()
		return nil, err
	}
	root, err := proctest.ModuleRoot()
	if err != nil {
		f.close()
		return nil, err
	}
	f.scene = filepath.Join(root, "examples", "shot", "scene.json")
	if f.bundle, err = jsonscene.ReadFile(ctx, f.scene); err != nil {
		f.close()
		return nil, err
	}
	if err := f.StartCoordinator(ctx); err != nil {
		f.close()
		return nil, err
	}
	f.api = client.New(f.HTTP, "")
	for i := range workers {
		if _, err := f.startWorker(fmt.Sprintf("w%d", i+1)); err != nil {
			f.close()
			return nil, err
		}
	}
	return f, nil
}

// startWorker starts a tileworker, slowed (workerSlow) and serving its metrics, with extra
// flags.
func (f *theFarm) startWorker(name string, extra ...string) (*farmtest.Worker, error) {
	w, err := f.StartWorker(farmtest.WorkerSpec{Name: name, Metrics: true, Args: append(slices.Clone(workerSlow), extra...)})
	if err == nil && len(extra) == 0 {
		f.workers = append(f.workers, w)
	}
	return w, err
}

func (f *theFarm) close() {
	if f.nc != nil {
		f.nc.Close()
	}
	f.Close()
}

// nextFrames hands out n frame numbers no earlier job of this farm used, so no job shares a
// frame with another and every job renders its own tiles.
func (f *theFarm) nextFrames(n int) (first, last int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	first = f.frame + 1
	f.frame += n
	return first, f.frame
}

// submit submits frames first-last with the scenario settings.
func (f *theFarm) submit(ctx context.Context, first, last int) (api.Status, error) {
	// No preview movie: its encoding would be delivered after the job completed, in the next
	// scenario's count of deliveries.
	req := api.SubmitRequest{SceneVersion: f.bundle.Version(), First: first, Last: last, Width: 96, Height: 54, SPP: 8,
		TileSize: 32, Formats: []string{"png"}, NoMovie: true}
	res, err := f.api.Submit(ctx, f.bundle, req)
	return res.Status, err
}

// waitDone waits until job is completed or failed.
func (f *theFarm) waitDone(ctx context.Context, job string, d time.Duration) (api.Status, error) {
	deadline := time.Now().Add(d)
	var st api.Status
	var err error
	for time.Now().Before(deadline) && ctx.Err() == nil {
		st, err = f.api.Status(ctx, job)
		if err == nil && (st.State == api.JobCompleted || st.State == api.JobFailed) {
			return st, nil
		}
		time.Sleep(250 * time.Millisecond)
	}
	if err == nil {
		err = fmt.Errorf("job %s still %s after %v (%d/%d tiles)", job, st.State, d, st.TilesCompleted, st.TilesTotal)
	}
	return st, err
}

// status reads a job's status, retrying while the coordinator is unreachable.
func (f *theFarm) status(ctx context.Context, job string) api.Status {
	for ctx.Err() == nil {
		if st, err := f.api.Status(ctx, job); err == nil {
			return st
		}
		time.Sleep(100 * time.Millisecond)
	}
	return api.Status{}
}

// reference renders frame locally with `tileworker render`, once.
func (f *theFarm) reference(ctx context.Context, frame int) (string, error) {
	f.mu.Lock()
	if p, ok := f.refs[frame]; ok {
		f.mu.Unlock()
		return p, nil
	}
	f.mu.Unlock()
	out := filepath.Join(f.cfg.dir, fmt.Sprintf("ref_%04d.png", frame))
	if _, err := f.Bins.RenderReference(ctx, farmtest.Reference{Scene: f.scene, Frame: frame, Out: out, Args: jobSettings}); err != nil {
		return "", err
	}
	f.mu.Lock()
	f.refs[frame] = out
	f.mu.Unlock()
	return out, nil
}

// differingPixels compares a farm output with the reference, by decoded pixels.
func differingPixels(got []byte, refPath string) (int, error) {
	want, err := os.ReadFile(refPath)
	if err != nil {
		return 0, err
	}
	a, err := png.Decode(bytes.NewReader(got))
	if err != nil {
		return 0, fmt.Errorf("decoding farm output: %w", err)
	}
	b, err := png.Decode(bytes.NewReader(want))
	if err != nil {
		return 0, err
	}
	if a.Bounds() != b.Bounds() {
		return a.Bounds().Dx() * a.Bounds().Dy(), nil
	}
	n := 0
	for y := a.Bounds().Min.Y; y < a.Bounds().Max.Y; y++ {
		for x := a.Bounds().Min.X; x < a.Bounds().Max.X; x++ {
			r1, g1, b1, _ := a.At(x, y).RGBA()
			r2, g2, b2, _ := b.At(x, y).RGBA()
			if r1 != r2 || g1 != g2 || b1 != b2 {
				n++
			}
		}
	}
	return n, nil
}

// deliveries sums the deliveries of every consumer of TILES: each pool's and band's tile
// consumers and the assemblers. It retries while a cluster elects leaders.
func (f *theFarm) deliveries(ctx context.Context) uint64 {
	for try := 0; ; try++ {
		n, err := f.tryDeliveries(ctx)
		if err == nil || try == 20 || ctx.Err() != nil {
			return n
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func (f *theFarm) tryDeliveries(ctx context.Context) (uint64, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	stream, err := f.js.Stream(cctx, queue.StreamTiles)
	if err != nil {
		return 0, err
	}
	var n uint64
	infos := stream.ListConsumers(cctx)
	for info := range infos.Info() {
		n += info.Delivered.Consumer
	}
	return n, infos.Err()
}

// tileStory is every worker's log lines about the tile of key, each after its worker's name:
// what a scenario that went wrong with one tile shows.
func (f *theFarm) tileStory(key string) string {
	var b strings.Builder
	for _, w := range f.Workers {
		for _, line := range strings.Split(w.Log(), "\n") {
			if key != "" && strings.Contains(line, key) {
				fmt.Fprintf(&b, "%s: %s\n", w.Name, line)
			}
		}
	}
	return b.String()
}

// duplicates sums tilefarm_duplicates_suppressed_total by layer over the coordinator and the
// live workers.
func (f *theFarm) duplicates() map[string]float64 {
	out := map[string]float64{}
	addrs := []string{f.HTTP}
	for _, w := range f.Workers {
		if !w.Exited() {
			addrs = append(addrs, w.Metrics)
		}
	}
	rx := regexp.MustCompile(`^tilefarm_duplicates_suppressed_total\{layer="([a-z_]+)"\} ([0-9.e+]+)$`)
	for _, a := range addrs {
		resp, err := http.Get("http://" + a + "/metrics")
		if err != nil {
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, line := range strings.Split(string(body), "\n") {
			if m := rx.FindStringSubmatch(line); m != nil {
				v, _ := strconv.ParseFloat(m[2], 64)
				out[m[1]] += v
			}
		}
	}
	return out
}

// waitTileAgain waits for the first event about tileKey after since from a worker other than
// gone (the tile rendering again, or found promoted by its next delivery) and returns how long
// after since it came.
func (f *theFarm) waitTileAgain(ctx context.Context, tileKey, gone string, since time.Time, d time.Duration) (time.Duration, error) {
	cctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	cons, err := f.js.OrderedConsumer(cctx, queue.StreamEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{queue.EventsTilePrefix + ">"}, DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &since})
	if err != nil {
		return 0, err
	}
	for {
		msg, err := cons.Next(jetstream.FetchMaxWait(time.Second))
		if err != nil {
			if cctx.Err() != nil {
				return 0, fmt.Errorf("tile %s not seen again within %v", short(tileKey), d)
			}
			continue
		}
		md, _ := msg.Metadata()
		var ev wire.Event
		if json.Unmarshal(msg.Data(), &ev) == nil && ev.TileKey == tileKey && ev.Worker != gone && md != nil && md.Timestamp.After(since) {
			return md.Timestamp.Sub(since), nil
		}
	}
}

// manifestsComplete checks that every tile and the PNG of each frame of a job has its
// manifest: a promotion lost would show here as a missing one.
func (f *theFarm) manifestsComplete(ctx context.Context, st api.Status) error {
	for _, fr := range st.Frames {
		objs, err := f.objects.List(ctx, finalize.ManifestPrefix+layout.TileManifestPrefix(fr.FrameKey))
		if err != nil {
			return err
		}
		if len(objs) != fr.TilesTotal {
			return fmt.Errorf("frame %d has %d tile manifests for %d tiles", fr.Frame, len(objs), fr.TilesTotal)
		}
		if ok, err := finalize.ManifestExists(ctx, f.objects, layout.FrameManifestKey(fr.FrameKey, "png")); err != nil || !ok {
			return fmt.Errorf("frame %d has no png manifest (%v)", fr.Frame, err)
		}
	}
	return nil
}

func short(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}

var errInvalid = errors.New("the fault did not land on work in progress")
