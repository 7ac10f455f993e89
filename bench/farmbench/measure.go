package farmbench

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/client"
	"github.com/tilefarm/tilefarm/internal/farmtest"
)

// Shot is what a job renders: frames of examples/shot at a resolution, samples and tile size.
// Zero fields keep the scene's own settings.
type Shot struct {
	First, Last        int
	Width, Height, SPP int
	TileSize           int
}

func (s Shot) request(b *bundle.Bundle) api.SubmitRequest {
	return api.SubmitRequest{SceneVersion: b.Version(), First: s.First, Last: s.Last, Width: s.Width, Height: s.Height,
		SPP: s.SPP, TileSize: s.TileSize, Formats: []string{"png"}, NoMovie: true} // the render is measured, not the preview movie
}

func (s Shot) renderArgs() []string {
	var a []string
	for _, f := range []struct {
		flag string
		v    int
	}{{"--width", s.Width}, {"--height", s.Height}, {"--spp", s.SPP}, {"--tile", s.TileSize}} {
		if f.v > 0 {
			a = append(a, f.flag, strconv.Itoa(f.v))
		}
	}
	return a
}

// FarmRun is one shot rendered locally by `tileworker render` and by a fresh farm.
type FarmRun struct {
	Tiles            int
	Local, Farm      time.Duration // wall time: every local render summed; submit to completed
	LocalCPU         time.Duration // the local renders' rusage
	FarmCPU          CPUTimes      // every farm process during the job
	CoordRSS         int64         // peak resident set of the coordinator
	WorkerRSSPerSlot int64         // mean peak resident set of a worker / its slots
	Attempts         int
	Slots            int           // every worker's slots, and the local renders' -j
	Rendering        time.Duration // the workers' tilefarm_tile_render_seconds, summed
	// StoreRequestsPerTile is the S3 requests MinIO served during the job per tile, in all and
	// by API (0 and nil on the file store): the farm's own requests, counted by MinIO.
	StoreRequestsPerTile      float64
	StoreRequestsPerTileByAPI map[string]float64
}

// Efficiency is local time / farm time: 1.0 means the farm costs nothing over the reference.
func (r FarmRun) Efficiency() float64 { return r.Local.Seconds() / r.Farm.Seconds() }

// EfficiencyFactors splits Efficiency exactly, as slot_busy / render_slowdown / local_busy,
// so a gap can be traced to idle
// slots (dispatch, hand-off, finalization, the job's start and end), to tiles rendering
// slower in the farm than they need CPU (other processes on the cores, checkpoint
// snapshots), or to the reference being quick (its per-frame tails leave slots idle too):
//   - slot_busy: the farm's rendering time / (slots x farm time);
//   - render_slowdown: the farm's rendering time / the local renders' CPU;
//   - local_busy: the local renders' CPU / (slots x local time).
func (r FarmRun) EfficiencyFactors() map[string]float64 {
	slots := float64(r.Slots)
	return map[string]float64{
		"slot_busy":       r.Rendering.Seconds() / (slots * r.Farm.Seconds()),
		"render_slowdown": r.Rendering.Seconds() / r.LocalCPU.Seconds(),
		"local_busy":      r.LocalCPU.Seconds() / (slots * r.Local.Seconds()),
	}
}

// OverheadCPUms is the CPU milliseconds per tile the farm spent beyond rendering.
func (r FarmRun) OverheadCPUms() float64 { return r.perTile(r.FarmCPU.Total() - r.LocalCPU) }

// OverheadByProcess splits OverheadCPUms by role: the coordinator, the workers beyond the
// local renders' CPU, and MinIO (0 on a file store).
func (r FarmRun) OverheadByProcess() map[string]float64 {
	return map[string]float64{"coordinator": r.perTile(r.FarmCPU.Coordinator),
		"workers": r.perTile(r.FarmCPU.Workers - r.LocalCPU), "minio": r.perTile(r.FarmCPU.MinIO)}
}

func (r FarmRun) perTile(d time.Duration) float64 {
	return float64(d.Microseconds()) / 1000 / float64(r.Tiles)
}

// renderLocal renders every frame of s with `tileworker render -j slots` and returns the
// summed wall time and CPU time.
func renderLocal(ctx context.Context, bins farmtest.Binaries, scene, dir string, s Shot, slots int) (wall, cpu time.Duration, err error) {
	for fr := s.First; fr <= s.Last; fr++ {
		start := time.Now()
		ps, err := bins.RenderReference(ctx, farmtest.Reference{Scene: scene, Frame: fr, Out: filepath.Join(dir, fmt.Sprintf("ref_%04d.png", fr)),
			Args: append([]string{"-j", strconv.Itoa(slots)}, s.renderArgs()...)})
		if err != nil {
			return 0, 0, err
		}
		wall += time.Since(start)
		cpu += ps.UserTime() + ps.SystemTime()
	}
	return wall, cpu, nil
}

// MeasureFarm renders s locally with as many tiles at once as the farm has slots, then on a
// fresh farm, timing the job from submit to completed and taking the CPU of every farm process
// over that time (start-up excluded: a farm runs for days).
func MeasureFarm(ctx context.Context, bins farmtest.Binaries, scene string, b *bundle.Bundle, dir string, s Shot, spec FarmSpec, prof *Profiles) (FarmRun, error) {
	r := FarmRun{Slots: spec.Workers * spec.Slots}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return r, err
	}
	var err error
	if r.Local, r.LocalCPU, err = renderLocal(ctx, bins, scene, dir, s, r.Slots); err != nil {
		return r, err
	}
	spec.DebugListen = prof != nil
	f, err := StartFarm(ctx, bins, filepath.Join(dir, "farm"), spec, b)
	if err != nil {
		return r, err
	}
	defer f.Close()
	// MinIO's counters before the job, read first: the reading waits out their cache, which
	// neither the job's time nor its CPU may include.
	reqs0, err := f.StoreRequests(ctx)
	if err != nil {
		return r, err
	}
	cpu0, err := f.CPU()
	if err != nil {
		return r, err
	}
	start := time.Now()
	var profErrs []<-chan error
	if prof != nil {
		for _, name := range []string{"coordinator", "w1"} {
			profErrs = append(profErrs, f.Profile(name, filepath.Join(prof.Dir, name+".pprof"), prof.Seconds))
		}
	}
	res, err := f.API.Submit(ctx, b, s.request(b))
	if err != nil {
		return r, fmt.Errorf("submitting: %w", err)
	}
	st, err := f.Wait(ctx, res.Status.JobID, 30*time.Minute)
	if err != nil {
		return r, err
	}
	r.Farm = time.Since(start)
	cpu1, err := f.CPU()
	if err != nil {
		return r, err
	}
	reqs1, err := f.StoreRequests(ctx) // after the CPU reading: it waits out MinIO's cache
	if err != nil {
		return r, err
	}
	r.StoreRequestsPerTile, r.StoreRequestsPerTileByAPI = requestsPerTile(reqs0, reqs1, st.TilesTotal)
	r.FarmCPU, r.Tiles, r.Attempts = cpu1.Sub(cpu0), st.TilesTotal, st.TileAttempts
	for _, ch := range profErrs {
		if err := <-ch; err != nil {
			return r, err
		}
	}
	if r.CoordRSS, err = PeakRSS(f.Coord.Pid()); err != nil {
		return r, err
	}
	var sum int64
	for _, w := range f.Workers {
		v, err := PeakRSS(w.Pid())
		if err != nil {
			return r, err
		}
		sum += v
		rendering, err := f.Metric(ctx, w, "tilefarm_tile_render_seconds_sum")
		if err != nil {
			return r, err
		}
		r.Rendering += time.Duration(rendering * float64(time.Second))
	}
	r.WorkerRSSPerSlot = sum / int64(len(f.Workers)*spec.Slots)
	return r, nil
}

// Profiles asks MeasureFarm for CPU profiles of the coordinator and the first worker.
type Profiles struct {
	Dir     string
	Seconds time.Duration
}

// slowWorker makes every pass take a while and checkpoints locally and remotely after each
// pass, so a kill always finds a tile in progress with samples to recover.
func slowWorker(delay time.Duration, passes int) []string {
	return []string{"--fault-pass-delay", delay.String(), "--passes", strconv.Itoa(passes), "--checkpoint-every", "0", "--remote-checkpoint-every", "0"}
}

var (
	checkpointUploaded = regexp.MustCompile(`remote checkpoint uploaded`)
	resuming           = regexp.MustCompile(`resuming from checkpoint`)
)

// MeasureRecovery kills a worker with SIGKILL in the middle of a long tile reps times and
// measures, each time, how long until the other worker resumes the tile from its checkpoint.
func MeasureRecovery(ctx context.Context, bins farmtest.Binaries, b *bundle.Bundle, dir string, reps int, serveArgs []string, minio bool) ([]time.Duration, error) {
	spec := FarmSpec{Workers: 2, Slots: 1, MinIO: minio, ServeArgs: serveArgs, WorkerArgs: slowWorker(250*time.Millisecond, 16)}
	f, err := StartFarm(ctx, bins, dir, spec, b)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []time.Duration
	for rep := range reps {
		// One tile a frame; a new frame (or size) each time, so no tile is already done.
		s := Shot{First: rep%24 + 1, Last: rep%24 + 1, Width: 64 + 8*(rep/24), Height: 36, SPP: 32, TileSize: 128}
		offsets := map[*farmtest.Worker]int{}
		live := f.LiveWorkers()
		for _, w := range live {
			offsets[w] = len(w.Log())
		}
		res, err := f.API.Submit(ctx, b, s.request(b))
		if err != nil {
			return nil, fmt.Errorf("submitting: %w", err)
		}
		// The victim is killed once its checkpoint is in the store, where another worker can
		// resume from it (a kill between the local save and the upload leaves nothing to resume).
		var victim *farmtest.Worker
		for victim == nil {
			for _, w := range live {
				if checkpointUploaded.MatchString(w.Log()[offsets[w]:]) {
					victim = w
					break
				}
			}
			if victim == nil {
				if err := sleep(ctx, 10*time.Millisecond); err != nil {
					return nil, err
				}
			}
		}
		from := map[*farmtest.Worker]int{}
		for _, w := range live {
			from[w] = len(w.Log())
		}
		victim.Kill()
		killed := time.Now()
		// Any other worker may take the tile over: wait for the first to resume it.
		for resumed := false; !resumed; {
			for _, w := range live {
				if w != victim && resuming.MatchString(w.Log()[from[w]:]) {
					resumed = true
				}
			}
			if time.Since(killed) > 2*time.Minute {
				return out, fmt.Errorf("no worker resumed the tile within 2m after the kill")
			}
			if err := sleep(ctx, 10*time.Millisecond); err != nil {
				return nil, err
			}
		}
		out = append(out, time.Since(killed))
		if _, err := f.StartWorker(victim.Name); err != nil {
			return nil, err
		}
		if _, err := f.Wait(ctx, res.Status.JobID, 5*time.Minute); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// ResumeSpec sizes MeasureResume.
type ResumeSpec struct {
	Workers int    // worker processes, one slot each
	Kills   int    // kills of the schedule
	Seed    uint64 // seed of the schedule: when, and which worker
	Frames  int    // frames of 96x54 in 32 px tiles, 6 tiles each
	MinIO   bool   // objects in a MinIO process
	// TileSeconds is how long a tile renders: each of its resumeSPP samples waits
	// TileSeconds/resumeSPP (--fault-sample-delay). Kills come TileSeconds/2 to TileSeconds
	// apart on a random worker, each at a random moment of some tile's render; with two
	// workers each is killed once in about one and a half tile lengths.
	TileSeconds float64
}

// resumeSPP is the samples per pixel of the resume job's tiles.
const resumeSPP = 64

// ResumeRun is what a seeded schedule of kills cost a job.
type ResumeRun struct {
	Kills     int
	Needed    int64   // tiles x spp: the samples the job needs
	Rendered  float64 // samples rendered by every worker process, the killed ones included
	Recovered int64   // samples resumed from checkpoints (the coordinator's count)
	// LoggedRecovered is the samples_recovered of every `resuming from checkpoint` line the
	// workers logged, the killed processes' included; Resumes counts those lines.
	LoggedRecovered int64
	Resumes         int
	// SecondsPerSample is what a sample of a tile took to render, measured: the render_seconds
	// of every `tile promoted` line over the samples those renders rendered (spp - recovered).
	SecondsPerSample float64
	SPP              int
}

// Rate is the fraction of samples rendered before a kill that were not rendered again:
// recovered / (recovered + rendered - needed). Every sample a killed attempt had rendered is
// either recovered by a later attempt or rendered again, and rendered - needed counts the
// samples rendered again.
func (r ResumeRun) Rate() float64 {
	again := r.Again()
	if r.Recovered == 0 && again == 0 {
		return 1
	}
	return float64(r.Recovered) / (float64(r.Recovered) + again)
}

// Again is the samples rendered again: rendered - needed.
func (r ResumeRun) Again() float64 { return max(r.Rendered-float64(r.Needed), 0) }

// SecondsLostPerKill is the render time a kill cost: the samples rendered again, times what a
// sample took, over the kills (0 without a kill).
func (r ResumeRun) SecondsLostPerKill() float64 {
	if r.Kills == 0 {
		return 0
	}
	return r.Again() * r.SecondsPerSample / float64(r.Kills)
}

// TileSeconds is how long a tile took to render in the run: spp x SecondsPerSample.
func (r ResumeRun) TileSeconds() float64 { return float64(r.SPP) * r.SecondsPerSample }

// MeasureResume renders a job on workers while killing one with SIGKILL at seeded moments
// (and restarting it on its own checkpoint directory), reading each worker's
// tilefarm_samples_rendered_total just before it is killed and at the end. It checks that the
// samples the workers logged as resumed are the samples the job's status counts as recovered,
// and fails when they differ: the rate would then not be the farm's.
func MeasureResume(ctx context.Context, bins farmtest.Binaries, b *bundle.Bundle, dir string, rs ResumeSpec) (ResumeRun, error) {
	r := ResumeRun{SPP: resumeSPP}
	if rs.TileSeconds <= 0 {
		return r, fmt.Errorf("resume tiles of %g s: want a positive length", rs.TileSeconds)
	}
	tile := time.Duration(rs.TileSeconds * float64(time.Second))
	// The workers keep their default checkpoint cadence. Each sample waits its share of the
	// tile's length and is counted as it lands: a kill loses the samples since the last
	// checkpoint it is resumed from, a part of a pass included, and the counters show them.
	delay := tile / resumeSPP
	spec := FarmSpec{Workers: rs.Workers, Slots: 1, MinIO: rs.MinIO, WorkerArgs: []string{"--fault-sample-delay", delay.String()}}
	f, err := StartFarm(ctx, bins, dir, spec, b)
	if err != nil {
		return r, err
	}
	defer f.Close()
	s := Shot{First: 1, Last: rs.Frames, Width: 96, Height: 54, SPP: resumeSPP, TileSize: 32}
	res, err := f.API.Submit(ctx, b, s.request(b))
	if err != nil {
		return r, fmt.Errorf("submitting: %w", err)
	}
	rng := rand.New(rand.NewPCG(rs.Seed, rs.Seed^0x9e3779b97f4a7c15))
	for range rs.Kills {
		if err := sleep(ctx, tile/2+time.Duration(rng.Int64N(int64(tile/2)+1))); err != nil {
			return r, err
		}
		st, err := f.API.Status(ctx, res.Status.JobID)
		if err != nil {
			return r, err
		}
		if st.State == api.JobCompleted {
			break
		}
		live := f.LiveWorkers()
		victim := live[rng.IntN(len(live))]
		n, err := f.Metric(ctx, victim, "tilefarm_samples_rendered_total")
		if err != nil {
			return r, err
		}
		victim.Kill()
		r.Rendered += n
		r.Kills++
		if _, err := f.StartWorker(victim.Name); err != nil {
			return r, err
		}
	}
	st, err := f.Wait(ctx, res.Status.JobID, 10*time.Minute)
	if err != nil {
		return r, err
	}
	for _, w := range f.LiveWorkers() {
		n, err := f.Metric(ctx, w, "tilefarm_samples_rendered_total")
		if err != nil {
			return r, err
		}
		r.Rendered += n
	}
	r.Needed, r.Recovered = int64(st.TilesTotal)*int64(s.SPP), int64(st.SamplesRecovered)
	var logs []string
	for _, w := range f.Workers { // every process started, the killed ones included
		logs = append(logs, w.Log())
	}
	lg := readResumeLogs(logs, s.SPP)
	r.LoggedRecovered, r.Resumes = lg.recovered, lg.resumes
	if lg.renderedSamples > 0 {
		r.SecondsPerSample = lg.renderSeconds / float64(lg.renderedSamples)
	}
	if r.LoggedRecovered != r.Recovered && !lg.explains(r.Recovered) {
		return r, fmt.Errorf("the workers logged %d resumes of %d samples in all, but the job's status counts %d samples recovered (%d of the logged samples in resumes whose start event went out)",
			lg.resumes, lg.recovered, r.Recovered, lg.started)
	}
	return r, nil
}

var (
	logResuming  = regexp.MustCompile(`msg="resuming from checkpoint"`)
	logRendering = regexp.MustCompile(`msg="rendering tile"`)
	logPromoted  = regexp.MustCompile(`msg="tile promoted"`)
	logAttr      = regexp.MustCompile(`(?:^| )(attempt_id|samples_recovered|render_seconds)=(\S+)`)
)

// resumeLogs is what the workers' logs say of the resumes and renders of a job.
type resumeLogs struct {
	resumes   int
	recovered int64 // samples_recovered of every `resuming from checkpoint`
	// started is the part of recovered whose attempt logged `rendering tile` after it, which
	// it does once its tile.started event, the coordinator's count, went out; unstarted is the
	// rest, resumes of a process killed between the two.
	started, unstarted int64
	renderSeconds      float64 // render_seconds of every `tile promoted`
	renderedSamples    int64   // the samples those renders rendered
}

// explains reports whether recovered, the coordinator's count, differs from the logged one
// only by resumes whose worker was killed before their start event went out (or before it
// logged that the event had): the coordinator never heard of those.
func (l resumeLogs) explains(recovered int64) bool {
	return l.unstarted > 0 && recovered >= l.started && recovered <= l.recovered
}

// readResumeLogs reads the logs of worker processes, one string each, of tiles of spp samples.
func readResumeLogs(logs []string, spp int) resumeLogs {
	var l resumeLogs
	for _, log := range logs {
		pending := map[string]int64{} // attempt_id of a resume to its samples
		for _, line := range strings.Split(log, "\n") {
			resuming, rendering, promoted := logResuming.MatchString(line), logRendering.MatchString(line), logPromoted.MatchString(line)
			if !resuming && !rendering && !promoted {
				continue
			}
			attrs := map[string]string{}
			for _, m := range logAttr.FindAllStringSubmatch(line, -1) {
				attrs[m[1]] = m[2]
			}
			key := attrs["attempt_id"]
			n, _ := strconv.ParseInt(attrs["samples_recovered"], 10, 64)
			switch {
			case resuming:
				l.resumes++
				l.recovered += n
				pending[key] = n
			case rendering:
				if v, ok := pending[key]; ok {
					l.started += v
					delete(pending, key)
				}
			case promoted:
				secs, err := strconv.ParseFloat(attrs["render_seconds"], 64)
				if err == nil && n < int64(spp) {
					l.renderSeconds += secs
					l.renderedSamples += int64(spp) - n
				}
			}
		}
		for _, v := range pending {
			l.unstarted += v
		}
	}
	return l
}

// MeasureCoordinatorRSS submits a job of at least tiles tiles (1920x1080 in 16 px tiles, 8160
// a frame) to `coordinator serve --workers 0`, waits until they are all durable and returns
// the job's tiles and the coordinator's peak resident set.
func MeasureCoordinatorRSS(ctx context.Context, bins farmtest.Binaries, b *bundle.Bundle, dir string, tiles int) (int, int64, error) {
	srv, err := StartCoordinator(ctx, bins, dir)
	if err != nil {
		return 0, 0, err
	}
	defer srv.Close()
	f := &Farm{Farm: srv, API: client.New(srv.HTTP, "")}
	if err := f.Upload(ctx, b); err != nil {
		return 0, 0, err
	}
	frames := (tiles + 8159) / 8160
	res, err := f.API.Submit(ctx, b, Shot{First: 1, Last: frames, Width: 1920, Height: 1080, TileSize: 16}.request(b))
	if err != nil {
		return 0, 0, fmt.Errorf("submitting %d frames: %w", frames, err)
	}
	nc, err := nats.Connect(srv.NATSURL())
	if err != nil {
		return 0, 0, fmt.Errorf("connecting to the coordinator's jetstream: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, 0, err
	}
	if err := waitDurable(ctx, js, uint64(res.Status.TilesTotal)); err != nil {
		return 0, 0, err
	}
	rss, err := PeakRSS(srv.Coord.Pid())
	return res.Status.TilesTotal, rss, err
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// percentile is the p-th percentile (0-100) of ds by the nearest-rank method.
func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}
