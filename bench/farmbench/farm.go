package farmbench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/client"
	"github.com/tilefarm/tilefarm/internal/farmtest"
	"github.com/tilefarm/tilefarm/internal/miniotest"
	"github.com/tilefarm/tilefarm/internal/proctest"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/wire"
)

// FarmSpec is one farm of separate processes: a coordinator and its workers.
type FarmSpec struct {
	Workers     int      // tileworker processes
	Slots       int      // --concurrency of each
	MinIO       bool     // objects in a MinIO process instead of the coordinator's file store
	ServeArgs   []string // extra flags of coordinator serve
	WorkerArgs  []string // extra flags of every tileworker
	DebugListen bool     // serve /debug/pprof on every process
}

// Farm is a running farm (farmtest.Farm) and what the measurements read it with.
type Farm struct {
	*farmtest.Farm
	spec  FarmSpec
	minio *miniotest.Server
	debug map[string]string // process name to its pprof address
	API   *client.Client
}

// StartFarm starts a coordinator and spec.Workers workers under dir, with checkpoints on, and
// uploads the scene b every measurement renders.
func StartFarm(ctx context.Context, bins farmtest.Binaries, dir string, spec FarmSpec, b *bundle.Bundle) (*Farm, error) {
	f := &Farm{Farm: &farmtest.Farm{Bins: bins, Dir: dir, LogLevel: "warn", ServeArgs: []string{"--workers", "0"}}, spec: spec,
		debug: map[string]string{}}
	if spec.MinIO {
		m, err := miniotest.Launch(filepath.Join(dir, "minio"))
		if err != nil {
			if m != nil {
				m.Kill()
			}
			return nil, fmt.Errorf("starting minio: %w", err)
		}
		f.minio = m
		f.UseMinIO(m)
	}
	if spec.DebugListen {
		addr, err := proctest.FreeAddr()
		if err != nil {
			f.Close()
			return nil, err
		}
		f.debug["coordinator"] = addr
		f.ServeArgs = append(f.ServeArgs, "--debug-listen", addr)
	}
	f.ServeArgs = append(f.ServeArgs, spec.ServeArgs...)
	if err := f.StartCoordinator(ctx); err != nil {
		f.Close()
		return nil, err
	}
	f.API = client.New(f.HTTP, "")
	for i := range spec.Workers {
		if _, err := f.StartWorker(fmt.Sprintf("w%d", i+1)); err != nil {
			f.Close()
			return nil, err
		}
	}
	if err := f.Upload(ctx, b); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// StartWorker starts a tileworker named name (its checkpoints in a directory of that name, so a
// restarted worker finds its local checkpoints) and adds it to the farm's workers.
func (f *Farm) StartWorker(name string) (*farmtest.Worker, error) {
	var args []string
	if f.spec.DebugListen {
		addr, err := proctest.FreeAddr()
		if err != nil {
			return nil, err
		}
		f.debug[name] = addr
		args = append(args, "--debug-listen", addr)
	}
	return f.Farm.StartWorker(farmtest.WorkerSpec{Name: name, Concurrency: f.spec.Slots, Metrics: true, Args: append(args, f.spec.WorkerArgs...)})
}

// LiveWorkers are the farm's workers still running.
func (f *Farm) LiveWorkers() []*farmtest.Worker {
	var ws []*farmtest.Worker
	for _, w := range f.Workers {
		if !w.Exited() {
			ws = append(ws, w)
		}
	}
	return ws
}

// StartCoordinator starts `coordinator serve --workers 0` with its data under dir/data and
// extra flags, and waits until it is healthy: a farm of the coordinator alone, whose own cost a
// measurement takes. Close kills it.
func StartCoordinator(ctx context.Context, bins farmtest.Binaries, dir string, extra ...string) (*farmtest.Farm, error) {
	f := &farmtest.Farm{Bins: bins, Dir: dir, Data: filepath.Join(dir, "data"), LogLevel: "warn",
		ServeArgs: append([]string{"--workers", "0"}, extra...)}
	if err := f.StartCoordinator(ctx); err != nil {
		return nil, err
	}
	return f, nil
}

// CPUTimes is the CPU time of a farm's processes by role.
type CPUTimes struct{ Coordinator, Workers, MinIO time.Duration }

// Total is the CPU time of every process.
func (c CPUTimes) Total() time.Duration { return c.Coordinator + c.Workers + c.MinIO }

// Sub is the CPU time used between b and c.
func (c CPUTimes) Sub(b CPUTimes) CPUTimes {
	return CPUTimes{c.Coordinator - b.Coordinator, c.Workers - b.Workers, c.MinIO - b.MinIO}
}

// CPU is the CPU time used so far by the live processes of the farm, MinIO included.
func (f *Farm) CPU() (CPUTimes, error) {
	var c CPUTimes
	add := func(to *time.Duration, pid int) error {
		t, err := CPUTime(pid)
		*to += t
		return err
	}
	if err := add(&c.Coordinator, f.Coord.Pid()); err != nil {
		return c, err
	}
	for _, w := range f.LiveWorkers() {
		if err := add(&c.Workers, w.Pid()); err != nil {
			return c, err
		}
	}
	if f.minio != nil {
		if err := add(&c.MinIO, f.minio.Pid()); err != nil {
			return c, err
		}
	}
	return c, nil
}

// metricsStart bounds how long a worker just started may take to serve /metrics.
const metricsStart = time.Minute

// Metric reads one counter from a worker's /metrics, summed over its label sets. A worker
// started a moment ago (a killed one restarted) may not serve them yet on a loaded machine:
// while it runs, it is asked again for up to metricsStart.
func (f *Farm) Metric(ctx context.Context, w *farmtest.Worker, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+w.Metrics+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	deadline := time.Now().Add(metricsStart)
	resp, err := http.DefaultClient.Do(req)
	for err != nil && !w.Exited() && time.Now().Before(deadline) {
		if serr := sleep(ctx, 50*time.Millisecond); serr != nil {
			return 0, serr
		}
		resp, err = http.DefaultClient.Do(req)
	}
	if err != nil {
		return 0, fmt.Errorf("reading %s metrics: %w", w.Name, err)
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || (len(line) > len(name) && line[len(name)] != ' ' && line[len(name)] != '{') {
			continue
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("parsing %s: %w", name, err)
		}
		sum += v
	}
	return sum, sc.Err()
}

// Upload puts a scene bundle on the farm.
func (f *Farm) Upload(ctx context.Context, b *bundle.Bundle) error {
	if _, err := client.UploadScene(ctx, f.API, b, 0, nil); err != nil {
		return fmt.Errorf("uploading scene: %w", err)
	}
	return nil
}

// Wait waits until job is completed and fails if it failed. It learns of each frame's
// assembly from the frame.assembled events on NATS and asks for the status only once every
// frame is assembled (then every 5 ms until the coordinator has checked the last one) or
// once a second meanwhile (a failure, a missed event): polling the status all along would
// cost the coordinator CPU growing with the job's frames, on the cores the farm renders on.
func (f *Farm) Wait(ctx context.Context, job string, d time.Duration) (api.Status, error) {
	nc, err := nats.Connect(f.NATSURL())
	if err != nil {
		return api.Status{}, fmt.Errorf("connecting to the farm's NATS: %w", err)
	}
	defer nc.Close()
	assembled := make(chan string, 1024)
	sub, err := nc.Subscribe(queue.EventFrameAssembledSubject, func(m *nats.Msg) {
		var ev wire.Event
		if json.Unmarshal(m.Data, &ev) == nil {
			select {
			case assembled <- ev.FrameKey:
			default: // the status a second later covers it
			}
		}
	})
	if err != nil {
		return api.Status{}, err
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		return api.Status{}, err
	}
	deadline := time.Now().Add(d)
	seen := map[string]bool{}
	var st api.Status
	for {
		st, err = f.API.Status(ctx, job)
		if err == nil && st.State == api.JobCompleted {
			return st, nil
		}
		if err == nil && st.State == api.JobFailed {
			return st, fmt.Errorf("job %s failed: %v", job, st.Failures)
		}
		if time.Now().After(deadline) {
			return st, fmt.Errorf("job %s not completed after %v (%d/%d tiles, err %v)", job, d, st.TilesCompleted, st.TilesTotal, err)
		}
		wait := time.Second
		if err == nil && allAssembled(st, seen) {
			wait = 5 * time.Millisecond
		}
		timer := time.NewTimer(wait)
	waiting:
		for {
			select {
			case <-ctx.Done():
				timer.Stop()
				return st, ctx.Err()
			case <-timer.C:
				break waiting
			case key := <-assembled:
				seen[key] = true
				if err == nil && allAssembled(st, seen) {
					timer.Stop()
					break waiting
				}
			}
		}
	}
}

// allAssembled reports whether every frame of st is completed or seen assembled.
func allAssembled(st api.Status, seen map[string]bool) bool {
	for _, fr := range st.Frames {
		if fr.State != api.FrameCompleted && !seen[fr.FrameKey] {
			return false
		}
	}
	return len(st.Frames) > 0
}

// Profile takes a CPU profile of d seconds from the named process into path, in the
// background; the returned channel yields its error.
func (f *Farm) Profile(name, path string, d time.Duration) <-chan error {
	ch := make(chan error, 1)
	addr, ok := f.debug[name]
	if !ok {
		ch <- fmt.Errorf("no debug listener on %s", name)
		return ch
	}
	go func() {
		out, err := exec.Command("curl", "-sf", "--retry", "20", "--retry-connrefused", "--retry-delay", "1", "-o", path, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, int(d.Seconds()))).CombinedOutput()
		if err != nil {
			err = fmt.Errorf("profiling %s: %w: %s", name, err, out)
		}
		ch <- err
	}()
	return ch
}
