package fleet

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tilefarm/tilefarm/bench/internal/procstat"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/client"
	"github.com/tilefarm/tilefarm/internal/coordinator"
	"github.com/tilefarm/tilefarm/internal/natstest"
	"github.com/tilefarm/tilefarm/internal/proctest"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/worker"
)

// Spec is one fleet measured: its size, its tiles and how it is watched.
type Spec struct {
	Bin string // the fleetnode binary (Build)
	Dir string // the processes' files and logs; the caller removes it
	// StoreDir holds the file store every process shares. Empty is a directory on tmpfs
	// (/dev/shm) when there is one, else under Dir: the fleet measures the coordinator and
	// JetStream, and N simulated workers fsyncing their promotions on one disk, where real ones
	// write to an object store of their own capacity, would measure this machine's disk.
	StoreDir    string
	Workers     int
	PerProcess  int     // workers per fleetnode workers process; 0 is 250
	TileSeconds float64 // each tile's render time
	// WorkSeconds is each worker's share of the job in seconds of tiles; 0 is 30. The job is
	// Workers x WorkSeconds/TileSeconds tiles, rounded up to whole frames.
	WorkSeconds float64
	FrameTiles  int // a frame is FrameTiles x FrameTiles tiles; 0 is 16
	TilePixels  int // a tile's edge in pixels; 0 is 8
	Passes      int // passes per tile (worker.Config.PassesPerTile); 0 is the worker's default, 32
	Cluster     bool
	SharedConn  bool
	SampleEvery time.Duration // how often the figures are read; 0 is 250 ms
	// MaxSeconds ends a measurement whose job has not finished after it; 0 is ten times
	// WorkSeconds, at least two minutes. A fleet this machine cannot carry may never finish.
	MaxSeconds time.Duration
	// Nice is the niceness of the worker host processes; 0 is 10. Real workers have machines
	// of their own; on one machine the simulated ones would take CPU from the coordinator and
	// JetStream that a real farm never takes, so they get what those two leave. -1 runs them
	// at the coordinator's priority.
	Nice int
	// ProfileDir, when set, receives CPU profiles taken during the window, ProfileSeconds long
	// (0: 5 s): the coordinator's (fleet-N-coordinator.pprof) and each nats-server node's
	// (fleet-N-nats-n1.pprof, ...).
	ProfileDir     string
	ProfileSeconds time.Duration
	Log            io.Writer // progress; nil is none
}

func (s Spec) withDefaults() Spec {
	if s.PerProcess <= 0 {
		s.PerProcess = 250
	}
	if s.WorkSeconds <= 0 {
		s.WorkSeconds = 30
	}
	if s.FrameTiles <= 0 {
		s.FrameTiles = 16
	}
	if s.TilePixels <= 0 {
		s.TilePixels = 8
	}
	if s.SampleEvery <= 0 {
		s.SampleEvery = 250 * time.Millisecond
	}
	if s.MaxSeconds <= 0 {
		s.MaxSeconds = max(2*time.Minute, time.Duration(10*s.WorkSeconds*float64(time.Second)))
	}
	if s.Nice == 0 {
		s.Nice = 10
	}
	if _, err := exec.LookPath("nice"); err != nil {
		s.Nice = -1 // no nice(1) here: the hosts run at the coordinator's priority, and the row says so
	}
	if s.ProfileSeconds <= 0 {
		s.ProfileSeconds = 5 * time.Second
	}
	if s.Log == nil {
		s.Log = io.Discard
	}
	return s
}

// Row is what one fleet measured. Rates and CPU are over the window: from the moment 20% of
// the job's tiles were completed to the moment 80% were, when every worker has work and none
// is draining.
type Row struct {
	Workers     int     `json:"workers"`
	Processes   int     `json:"worker_processes"`
	SharedConn  bool    `json:"shared_conn"` // one NATS connection per process, not per worker
	JetStream   string  `json:"jetstream"`
	Store       string  `json:"store"`
	WorkersNice int     `json:"workers_nice"` // the hosts' niceness (Spec.Nice)
	TileSeconds float64 `json:"tile_seconds"`
	Passes      int     `json:"passes_per_tile"`
	Tiles       int     `json:"tiles"`
	// TilesCompleted is the tiles the workers promoted; AttemptsPerTile the attempts the
	// coordinator recorded per tile (above 1: tiles rendered again after a lost lease).
	TilesCompleted  int     `json:"tiles_completed"`
	AttemptsPerTile float64 `json:"attempts_per_tile"`
	// JobState is the job's state when the measurement ended: completed, or failed (tiles
	// dead-lettered), or running at Spec.MaxSeconds.
	JobState          string  `json:"job_state"`
	TilesDeadLettered int     `json:"tiles_dead_lettered"`
	DurationS         float64 `json:"duration_s"` // submit to the job's end (or the time limit)
	Window            string  `json:"window"`
	WindowS           float64 `json:"window_s"`
	TilesPerS         float64 `json:"tiles_per_s"`
	IdealTilesPerS    float64 `json:"ideal_tiles_per_s"` // workers / tile_seconds
	// EventsPerS is events the coordinator applied per second: the advance of its EVENTS
	// consumer's ack floor (it acks a batch once the batch's transaction committed).
	EventsPerS          float64 `json:"events_per_s"`
	EventsPublishedPerS float64 `json:"events_published_per_s"`
	EventsBacklog       uint64  `json:"events_backlog"` // events not yet delivered to the coordinator at the window's end
	DispatchP50ms       float64 `json:"dispatch_p50_ms"`
	DispatchP99ms       float64 `json:"dispatch_p99_ms"`
	DispatchMaxms       float64 `json:"dispatch_max_ms"`
	DispatchSamples     int     `json:"dispatch_samples"`
	QueueWaitP50ms      float64 `json:"queue_wait_p50_ms"` // publication to lease, backlog included
	CoordinatorCPU      float64 `json:"coordinator_cpu_cores"`
	JetStreamCPU        float64 `json:"jetstream_cpu_cores"`
	WorkersCPU          float64 `json:"workers_cpu_cores"`
	CoordinatorCPUms    float64 `json:"coordinator_cpu_ms_per_tile"`
	JetStreamCPUms      float64 `json:"jetstream_cpu_ms_per_tile"`
	// From the servers' /varz: messages in and out, and JetStream API requests, summed over
	// the nodes; from the buckets' streams: lease writes (take, renew, release) and worker
	// directory heartbeats.
	MsgsInPerS        float64 `json:"nats_msgs_in_per_s"`
	MsgsOutPerS       float64 `json:"nats_msgs_out_per_s"`
	APIPerS           float64 `json:"jetstream_api_per_s"`
	LeaseWritesPerS   float64 `json:"lease_writes_per_s"`
	HeartbeatMsgsPerS float64 `json:"heartbeat_msgs_per_s"`
	Connections       int     `json:"nats_connections"`
	// Over the whole run: leases the workers found lost when renewing (their
	// tilefarm_lease_renewal_failures_total), of them those whose TTL passed on the worker's
	// clock without a renewal getting through (a warning in their log: the server answered
	// no renewal within the TTL, so the lease lapsed there too), renewals that timed out (a
	// warning in their log),
	// and pulls the server refused with "Exceeded MaxWaiting" (more waiting pulls on a consumer
	// than its MaxWaiting, JetStream's default 512).
	LeasesLost       int      `json:"leases_lost"`
	LeasesExpired    int      `json:"leases_expired_on_worker_clock"`
	RenewalTimeouts  int      `json:"lease_renewal_timeouts"`
	MaxWaitingPulls  int      `json:"pulls_refused_max_waiting"`
	CoordinatorRSSMB float64  `json:"coordinator_rss_mb"`
	Profiles         []string `json:"profiles,omitempty"`
}

// Saturation is the first fleet size whose throughput is below frac of its ideal
// (workers / tile_seconds), 0 if none is.
func Saturation(rows []Row, frac float64) int {
	for _, r := range rows {
		if r.TilesPerS < frac*r.IdealTilesPerS {
			return r.Workers
		}
	}
	return 0
}

// Build builds bench/cmd/fleetnode into dir and returns its path.
func Build(dir string) (string, error) {
	root, err := proctest.ModuleRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "fleetnode")
	cmd := exec.Command("go", "build", "-o", bin, "./bench/cmd/fleetnode")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building fleetnode: %w\n%s", err, out)
	}
	return bin, nil
}

var (
	coordinatorServing = regexp.MustCompile(`coordinator serving on (\S+)`)
	workersRunning     = regexp.MustCompile(`workers running, http (\S+)`)
	monitorLine        = regexp.MustCompile(`Starting http monitor on (\S+)`)
	profileLine        = regexp.MustCompile(`profiling port: (\d+)`)
)

// fleet is a running fleet: its servers, coordinator and worker hosts.
type fleet struct {
	nats     *natstest.Cluster
	monitors []string // each node's monitoring address
	profiles []string // each node's pprof address
	coord    *proctest.Proc
	debug    string // the coordinator's pprof address
	api      *client.Client
	hosts    []*proctest.Proc
	hostHTTP []string
}

func (f *fleet) close() {
	for _, h := range f.hosts {
		h.Kill()
	}
	if f.coord != nil {
		f.coord.Kill()
	}
	if f.nats != nil {
		f.nats.Kill()
	}
}

// Measure starts a fleet of s.Workers workers against one coordinator and one JetStream (a
// cluster of three with s.Cluster), submits a job of enough tiles to keep every worker busy for
// s.WorkSeconds, and measures it until the job has finished (completed, or failed with tiles
// dead-lettered) or s.MaxSeconds have passed: a fleet this machine cannot carry is measured as
// far as it got, and Row.JobState says so.
func Measure(ctx context.Context, s Spec) (Row, error) {
	s = s.withDefaults()
	row := Row{Workers: s.Workers, TileSeconds: s.TileSeconds, SharedConn: s.SharedConn, Passes: cmp.Or(s.Passes, worker.DefaultPasses),
		WorkersNice: max(s.Nice, 0)}
	if s.Workers < 1 || s.TileSeconds <= 0 {
		return row, fmt.Errorf("fleet of %d workers with %gs tiles: want at least one worker and a positive tile time", s.Workers, s.TileSeconds)
	}
	logf := func(format string, args ...any) {
		fmt.Fprintf(s.Log, "fleet %d: "+format+"\n", append([]any{s.Workers}, args...)...)
	}
	dir, cleanup, desc, err := storeDir(s)
	if err != nil {
		return row, err
	}
	defer cleanup()
	row.Store = desc

	f, err := start(ctx, s, "file://"+dir, logf)
	if f != nil {
		defer f.close()
	}
	if err != nil {
		return row, err
	}
	row.Processes = len(f.hosts)
	row.JetStream = "1 nats-server (replicas 1)"
	if s.Cluster {
		row.JetStream = "3-node nats-server cluster (replicas 3)"
	}

	doc := Document{Width: s.FrameTiles * s.TilePixels, Height: s.FrameTiles * s.TilePixels, TileSize: s.TilePixels,
		TileSeconds: s.TileSeconds, First: 1, Last: 1}
	perFrame := doc.TilesPerFrame()
	want := s.Workers * int(math.Ceil(s.WorkSeconds/s.TileSeconds))
	frames := (want + perFrame - 1) / perFrame
	b := doc.Bundle()
	if _, err := client.UploadScene(ctx, f.api, b, 0, nil); err != nil {
		return row, fmt.Errorf("uploading the fleet scene: %w", err)
	}
	logf("submitting %d frames of %d tiles", frames, perFrame)
	submitted := time.Now()
	res, err := f.api.Submit(ctx, b, api.SubmitRequest{SceneVersion: b.Version(), First: 1, Last: frames, TileSize: doc.TileSize, Formats: []string{"png"},
		NoMovie: true}) // the fleet measures tiles, not the preview movie after them
	if err != nil {
		return row, fmt.Errorf("submitting: %w", err)
	}
	row.Tiles = res.Status.TilesTotal

	points, st, profs, err := f.follow(ctx, s, res.Status.JobID, row.Tiles, logf)
	if err != nil {
		return row, err
	}
	row.DurationS = time.Since(submitted).Seconds()
	row.JobState, row.TilesDeadLettered = string(st.State), st.TilesFailed
	row.AttemptsPerTile = float64(st.TileAttempts) / float64(max(st.TilesTotal, 1))
	if len(points) == 0 {
		return row, errors.New("no reading of the fleet's counters succeeded")
	}
	row.TilesCompleted = int(points[len(points)-1].completed)
	a, z, err := window(points, float64(row.Tiles))
	if err != nil {
		return row, err
	}
	row.Window = fmt.Sprintf("%.0f%%-%.0f%% of the tiles completed", 100*a.completed/float64(row.Tiles), 100*z.completed/float64(row.Tiles))
	row.fill(a, z)
	var all []Sample
	for _, addr := range f.hostHTTP {
		ss, err := dispatchSamples(ctx, addr)
		if err != nil {
			return row, err
		}
		all = append(all, ss...)
	}
	row.dispatch(all, a.at, z.at)
	if err := f.troubles(ctx, &row); err != nil {
		return row, err
	}
	if rss, err := procstat.PeakRSS(f.coord.Pid()); err == nil {
		row.CoordinatorRSSMB = float64(rss) / (1 << 20)
	}
	for _, p := range profs {
		if err := <-p.done; err != nil {
			return row, err
		}
		row.Profiles = append(row.Profiles, p.path)
	}
	logf("%.0f tiles/s (ideal %.0f), dispatch p99 %.1f ms, coordinator %.2f cores, jetstream %.2f cores",
		row.TilesPerS, row.IdealTilesPerS, row.DispatchP99ms, row.CoordinatorCPU, row.JetStreamCPU)
	return row, nil
}

// troubles counts, over the whole run, what went wrong in the workers without failing a tile.
func (f *fleet) troubles(ctx context.Context, r *Row) error {
	for _, addr := range f.hostHTTP {
		n, err := metricSum(ctx, "http://"+addr+"/metrics", "tilefarm_lease_renewal_failures_total")
		if err != nil {
			return err
		}
		r.LeasesLost += int(n)
	}
	for _, h := range f.hosts {
		for line := range strings.Lines(h.Log()) {
			switch {
			case strings.Contains(line, `msg="renewing lease"`) && strings.Contains(line, "deadline exceeded"):
				r.RenewalTimeouts++
			case strings.Contains(line, "lease expired on this worker's clock"):
				r.LeasesExpired++
			case strings.Contains(line, "Exceeded MaxWaiting"):
				r.MaxWaitingPulls++
			}
		}
	}
	return nil
}

// storeDir makes the shared file store's directory and says what it is.
func storeDir(s Spec) (dir string, cleanup func(), desc string, err error) {
	if s.StoreDir != "" {
		return s.StoreDir, func() {}, "file store at " + s.StoreDir, os.MkdirAll(s.StoreDir, 0o755)
	}
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		dir, err := os.MkdirTemp("/dev/shm", "tilefarm-fleet-")
		if err == nil {
			return dir, func() { os.RemoveAll(dir) }, "file store on tmpfs (/dev/shm)", nil
		}
	}
	dir = filepath.Join(s.Dir, "store")
	return dir, func() {}, "file store on disk", os.MkdirAll(dir, 0o755)
}

// start starts the servers, the coordinator and the worker hosts, and waits until the
// coordinator lists every worker live. On an error the fleet returned holds what started.
func start(ctx context.Context, s Spec, store string, logf func(string, ...any)) (*fleet, error) {
	f := &fleet{}
	nodes := 1
	if s.Cluster {
		nodes = 3
	}
	logf("starting %d nats-server node(s)", nodes)
	// Every node monitors and profiles on ports of its own choosing, which its log names.
	cl, err := natstest.Launch(filepath.Join(s.Dir, "nats"), nodes, natstest.Options{Config: "http: \"127.0.0.1:-1\"\nprof_port: -1\n"})
	f.nats = cl
	if err != nil {
		return f, err
	}
	var logs strings.Builder
	cl.DumpLogs(&logs)
	for _, m := range monitorLine.FindAllStringSubmatch(logs.String(), -1) {
		f.monitors = append(f.monitors, m[1])
	}
	for _, m := range profileLine.FindAllStringSubmatch(logs.String(), -1) {
		f.profiles = append(f.profiles, "127.0.0.1:"+m[1])
	}
	if len(f.monitors) != nodes || len(f.profiles) != nodes {
		return f, fmt.Errorf("found %d monitoring and %d profiling ports in the nats-server logs, want %d", len(f.monitors), len(f.profiles), nodes)
	}

	listen, err := proctest.FreeAddr()
	if err != nil {
		return f, err
	}
	if f.debug, err = proctest.FreeAddr(); err != nil {
		return f, err
	}
	replicas := 1
	if s.Cluster {
		replicas = 3
	}
	f.coord, err = proctest.Start("coordinator", s.Bin, filepath.Join(s.Dir, "coordinator.log"), nil, "coordinator",
		"--nats", cl.URLs(), "--store", store, "--data", filepath.Join(s.Dir, "coordinator"), "--listen", listen,
		"--debug-listen", f.debug, "--replicas", fmt.Sprint(replicas))
	if err != nil {
		return f, err
	}
	m, err := f.coord.WaitLog(ctx, coordinatorServing, 0, time.Minute)
	if err != nil {
		return f, fmt.Errorf("starting the coordinator: %w\n%s", err, f.coord.Log())
	}
	f.api = client.New(m.Groups[1], "")

	for i, left := 0, s.Workers; left > 0; i++ {
		n := min(left, s.PerProcess)
		left -= n
		name := fmt.Sprintf("workers%d", i+1)
		args := []string{"workers", "--nats", cl.URLs(), "--store", store, "--dir", filepath.Join(s.Dir, name),
			"--count", fmt.Sprint(n), "--name-prefix", fmt.Sprintf("h%d-", i+1), "--passes", fmt.Sprint(s.Passes)}
		if s.SharedConn {
			args = append(args, "--shared-conn")
		}
		bin := s.Bin
		if s.Nice > 0 {
			// nice execs the host in its own process, so the pid is the host's.
			bin, args = "nice", append([]string{"-n", fmt.Sprint(s.Nice), s.Bin}, args...)
		}
		h, err := proctest.Start(name, bin, filepath.Join(s.Dir, name+".log"), nil, args...)
		if err != nil {
			return f, err
		}
		f.hosts = append(f.hosts, h)
	}
	logf("starting %d workers in %d processes", s.Workers, len(f.hosts))
	for _, h := range f.hosts {
		m, err := h.WaitLog(ctx, workersRunning, 0, 5*time.Minute)
		if err != nil {
			return f, fmt.Errorf("starting %s: %w\n%s", h.Name, err, h.Log())
		}
		f.hostHTTP = append(f.hostHTTP, m.Groups[1])
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		ws, err := f.api.Workers(ctx)
		if err == nil && len(ws) >= s.Workers {
			return f, nil
		}
		if time.Now().After(deadline) {
			return f, fmt.Errorf("the coordinator lists %d of %d workers live after 3m (err %v)", len(ws), s.Workers, err)
		}
		if !queue.Sleep(ctx, 500*time.Millisecond) {
			return f, ctx.Err()
		}
	}
}

// point is the fleet's counters at one moment.
type point struct {
	at                       time.Time
	completed                float64 // tiles promoted, every host
	coord, jetstream, hosts  time.Duration
	eventsApplied, eventsPub uint64 // the coordinator consumer's ack floor; EVENTS' last sequence
	eventsPending            uint64
	leases, beats            uint64 // the last sequences of the leases and workers buckets' streams
	in, out, api             int64  // /varz, summed over the nodes
	conns                    int
}

// readAfter reads the counters, trying up to maxMisses times a quarter second apart: a server
// too busy to answer once is asked again, as follow does.
func (f *fleet) readAfter(ctx context.Context) (point, error) {
	var err error
	for range maxMisses {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		var p point
		p, err = f.read(rctx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return p, err
		}
		if !queue.Sleep(ctx, 250*time.Millisecond) {
			return p, ctx.Err()
		}
	}
	return point{}, err
}

// maxMisses is how many readings in a row may fail (a server too busy to answer its
// monitoring port in time) before the measurement gives up.
const maxMisses = 20

// follow reads the counters every s.SampleEvery until the job is completed or failed, or
// s.MaxSeconds after it was submitted, and starts the coordinator's profile once a fifth of
// the tiles are done. The profiles are still being taken when it returns.
func (f *fleet) follow(ctx context.Context, s Spec, job string, tiles int, logf func(string, ...any)) ([]point, api.Status, []pending, error) {
	var (
		points []point
		profs  []pending
		st     api.Status
		misses int
	)
	deadline := time.Now().Add(s.MaxSeconds)
	t := time.NewTicker(s.SampleEvery)
	defer t.Stop()
	lastStatus, lastLog := time.Time{}, time.Now()
	for {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		p, err := f.read(rctx)
		cancel()
		switch {
		case err == nil:
			points, misses = append(points, p), 0
		case ctx.Err() != nil:
			return nil, st, nil, ctx.Err()
		default:
			if misses++; misses >= maxMisses {
				return nil, st, nil, fmt.Errorf("reading the fleet's counters failed %d times in a row: %w", misses, err)
			}
			logf("reading the counters: %v", err)
		}
		done := 0.0
		if len(points) > 0 {
			done = points[len(points)-1].completed
		}
		if profs == nil && s.ProfileDir != "" && done >= 0.2*float64(tiles) {
			profs = f.profile(ctx, s)
		}
		if time.Since(lastLog) >= 5*time.Second {
			logf("%.0f of %d tiles", done, tiles)
			lastLog = time.Now()
		}
		if done >= float64(tiles) || time.Since(lastStatus) >= 2*time.Second {
			lastStatus = time.Now()
			if got, err := f.api.Status(ctx, job); err == nil {
				st = got
			} else {
				logf("job status: %v", err)
			}
			if st.State.Finished() {
				// The counters once more, read after the status: the last reading above may
				// predate the last tile's promotion, which the job's completion follows.
				p, err := f.readAfter(ctx)
				if err != nil {
					return nil, st, nil, fmt.Errorf("reading the fleet's counters after the job finished: %w", err)
				}
				return append(points, p), st, profs, nil
			}
		}
		if time.Now().After(deadline) {
			logf("stopping at the time limit of %v: %d of %d tiles completed", s.MaxSeconds, st.TilesCompleted, st.TilesTotal)
			return points, st, profs, nil
		}
		select {
		case <-ctx.Done():
			return nil, st, nil, ctx.Err()
		case <-t.C:
		}
	}
}

// read takes the counters now, through the servers' monitoring ports and the hosts' /metrics:
// nothing of it waits behind the JetStream API it measures.
func (f *fleet) read(ctx context.Context) (point, error) {
	p := point{at: time.Now()}
	var err error
	for _, addr := range f.hostHTTP {
		n, err := metricSum(ctx, "http://"+addr+"/metrics", "tilefarm_tiles_completed_total")
		if err != nil {
			return p, err
		}
		p.completed += n
	}
	if p.coord, err = procstat.CPUTime(f.coord.Pid()); err != nil {
		return p, err
	}
	for _, srv := range f.nats.Servers {
		t, err := procstat.CPUTime(srv.Pid())
		if err != nil {
			return p, err
		}
		p.jetstream += t
	}
	for _, h := range f.hosts {
		t, err := procstat.CPUTime(h.Pid())
		if err != nil {
			return p, err
		}
		p.hosts += t
	}
	for _, mon := range f.monitors {
		v, err := varz(ctx, mon)
		if err != nil {
			return p, err
		}
		p.in, p.out, p.api, p.conns = p.in+v.InMsgs, p.out+v.OutMsgs, p.api+int64(v.JetStream.Stats.API.Total), p.conns+v.Connections
		j, err := jsz(ctx, mon)
		if err != nil {
			return p, err
		}
		// In a cluster every node holds a replica of every stream; a follower may lag, so the
		// figures are the furthest any node has seen.
		p.eventsPub = max(p.eventsPub, j.lastSeq(queue.StreamEvents))
		p.leases = max(p.leases, j.lastSeq("KV_"+queue.BucketLeases))
		p.beats = max(p.beats, j.lastSeq("KV_"+queue.BucketWorkers))
		if c, ok := j.consumer(queue.StreamEvents, coordinator.ConsumerEvents); ok && c.AckFloor.Stream >= p.eventsApplied {
			p.eventsApplied, p.eventsPending = c.AckFloor.Stream, c.NumPending
		}
	}
	return p, nil
}

// window picks the points where a fifth and four fifths of the tiles were completed: every
// worker has work by then, and none is idle at the job's end yet. A job that stopped short of
// four fifths (failed, or at the time limit) is measured to its last point.
func window(points []point, tiles float64) (a, z point, err error) {
	ia := slices.IndexFunc(points, func(p point) bool { return p.completed >= 0.2*tiles })
	iz := slices.IndexFunc(points, func(p point) bool { return p.completed >= 0.8*tiles })
	if iz < 0 {
		iz = len(points) - 1
	}
	if ia < 0 || iz <= ia || points[iz].completed <= points[ia].completed {
		return a, z, fmt.Errorf("no window from 20%% of %.0f tiles on in %d readings: read more often, or give the job more time", tiles, len(points))
	}
	return points[ia], points[iz], nil
}

// fill sets the row's rates and CPU from the window a-z.
func (r *Row) fill(a, z point) {
	secs := z.at.Sub(a.at).Seconds()
	tiles := z.completed - a.completed
	per := func(d float64) float64 { return d / secs }
	cores := func(d time.Duration) float64 { return d.Seconds() / secs }
	msPerTile := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / tiles }
	r.WindowS, r.TilesPerS, r.IdealTilesPerS = secs, per(tiles), float64(r.Workers)/r.TileSeconds
	r.EventsPerS = per(float64(z.eventsApplied - a.eventsApplied))
	r.EventsPublishedPerS = per(float64(z.eventsPub - a.eventsPub))
	r.EventsBacklog = z.eventsPending
	r.CoordinatorCPU, r.JetStreamCPU, r.WorkersCPU = cores(z.coord-a.coord), cores(z.jetstream-a.jetstream), cores(z.hosts-a.hosts)
	r.CoordinatorCPUms, r.JetStreamCPUms = msPerTile(z.coord-a.coord), msPerTile(z.jetstream-a.jetstream)
	r.MsgsInPerS, r.MsgsOutPerS, r.APIPerS = per(float64(z.in-a.in)), per(float64(z.out-a.out)), per(float64(z.api-a.api))
	r.LeaseWritesPerS, r.HeartbeatMsgsPerS = per(float64(z.leases-a.leases)), per(float64(z.beats-a.beats))
	r.Connections = z.conns
}

// dispatch sets the dispatch figures from the samples of tiles leased in [from, to].
func (r *Row) dispatch(all []Sample, from, to time.Time) {
	var d, wait []time.Duration
	for _, s := range all {
		if !s.Leased.Before(from) && !s.Leased.After(to) {
			d, wait = append(d, s.Dispatch), append(wait, s.Waited)
		}
	}
	r.DispatchSamples = len(d)
	if len(d) == 0 {
		return
	}
	ms := func(x time.Duration) float64 { return float64(x.Microseconds()) / 1000 }
	r.DispatchP50ms, r.DispatchP99ms, r.DispatchMaxms = ms(percentile(d, 50)), ms(percentile(d, 99)), ms(percentile(d, 100))
	r.QueueWaitP50ms = ms(percentile(wait, 50))
}

// percentile is the p-th percentile (0-100) of ds by the nearest-rank method.
func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// pending is a profile being taken: done yields its error once it is written to path.
type pending struct {
	path string
	done <-chan error
}

// profile starts CPU profiles of the coordinator and of every nats-server node.
func (f *fleet) profile(ctx context.Context, s Spec) []pending {
	var out []pending
	add := func(name, addr string) {
		path := filepath.Join(s.ProfileDir, fmt.Sprintf("fleet-%d-%s.pprof", s.Workers, name))
		out = append(out, pending{path: path, done: profile(ctx, name, addr, path, s.ProfileSeconds)})
	}
	add("coordinator", f.debug)
	for i, srv := range f.nats.Servers {
		add("nats-"+srv.Name, f.profiles[i])
	}
	return out
}

// profile takes a CPU profile of d from the pprof server at addr into path, in the background.
func profile(ctx context.Context, name, addr, path string, d time.Duration) <-chan error {
	ch := make(chan error, 1)
	go func() {
		ch <- func() error {
			url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, int(d.Seconds()))
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				return err
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return fmt.Errorf("profiling %s: %w", name, err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("profiling %s: %s", name, resp.Status)
			}
			out, err := os.Create(path)
			if err != nil {
				return err
			}
			if _, err := io.Copy(out, resp.Body); err != nil {
				out.Close()
				return fmt.Errorf("writing the profile of %s: %w", name, err)
			}
			return out.Close()
		}()
	}()
	return ch
}

// varzReply is what the fleet reads of a server's /varz.
type varzReply struct {
	InMsgs      int64 `json:"in_msgs"`
	OutMsgs     int64 `json:"out_msgs"`
	Connections int   `json:"connections"`
	JetStream   struct {
		Stats struct {
			API struct {
				Total uint64 `json:"total"`
			} `json:"api"`
		} `json:"stats"`
	} `json:"jetstream"`
}

func varz(ctx context.Context, addr string) (varzReply, error) {
	var v varzReply
	err := getJSON(ctx, "http://"+addr+"/varz", &v)
	return v, err
}

// jszReply is what the fleet reads of a server's /jsz: its streams' last sequences and their
// consumers' ack floors.
type jszReply struct {
	Accounts []struct {
		Streams []struct {
			Name  string `json:"name"`
			State struct {
				LastSeq uint64 `json:"last_seq"`
			} `json:"state"`
			Consumers []jszConsumer `json:"consumer_detail"`
		} `json:"stream_detail"`
	} `json:"account_details"`
}

type jszConsumer struct {
	Name     string `json:"name"`
	AckFloor struct {
		Stream uint64 `json:"stream_seq"`
	} `json:"ack_floor"`
	NumPending uint64 `json:"num_pending"`
}

func (j jszReply) lastSeq(stream string) uint64 {
	for _, a := range j.Accounts {
		for _, s := range a.Streams {
			if s.Name == stream {
				return s.State.LastSeq
			}
		}
	}
	return 0
}

func (j jszReply) consumer(stream, name string) (jszConsumer, bool) {
	for _, a := range j.Accounts {
		for _, s := range a.Streams {
			for _, c := range s.Consumers {
				if s.Name == stream && c.Name == name {
					return c, true
				}
			}
		}
	}
	return jszConsumer{}, false
}

func jsz(ctx context.Context, addr string) (jszReply, error) {
	var j jszReply
	err := getJSON(ctx, "http://"+addr+"/jsz?accounts=true&streams=true&consumers=true", &j)
	return j, err
}

func dispatchSamples(ctx context.Context, addr string) ([]Sample, error) {
	var ss []Sample
	err := getJSON(ctx, "http://"+addr+"/dispatch", &ss)
	return ss, err
}

func getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("reading %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("reading %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("reading %s: %w", url, err)
	}
	return nil
}

// metricSum reads one family from a Prometheus text page, summed over its label sets.
func metricSum(ctx context.Context, url, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", url, err)
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		fields := strings.Fields(rest)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("parsing %s from %s: %w", name, url, err)
		}
		sum += v
	}
	return sum, sc.Err()
}
