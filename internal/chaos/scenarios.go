//go:build unix

package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/farmtest"
	"github.com/tilefarm/tilefarm/internal/faults"
	"github.com/tilefarm/tilefarm/internal/queue"
)

// row is one scenario's outcome, a line of the table.
type row struct {
	Farm             string             `json:"farm"`
	Scenario         string             `json:"scenario"`
	Faults           int                `json:"faults"`
	Landed           bool               `json:"landed"`       // every fault hit work in progress
	Redeliveries     int                `json:"redeliveries"` // deliveries beyond one per message of the job
	Duplicates       map[string]float64 `json:"duplicates_suppressed"`
	SamplesRecovered int                `json:"samples_recovered"`
	RecoverySeconds  float64            `json:"recovery_seconds"` // kill to the tile taken up again; 0 when not measured
	LostTiles        int                `json:"lost_tiles"`
	DifferingPixels  int                `json:"differing_pixels"`
	OK               bool               `json:"ok"`
	Problem          string             `json:"problem,omitempty"`
}

// attempt is a scenario being run: its job and what its faults did.
type attempt struct {
	f               *theFarm
	job             api.Status
	frames          []int
	faults          int
	landed          bool
	recovery        time.Duration
	expectRecovered bool   // a worker died mid-tile after a checkpoint: samples must be recovered
	tile            string // the tile a fault struck, when it names one
}

// scenario is a fault schedule run on one farm.
type scenario struct {
	name string
	farm string // "cluster" (3 NATS nodes, 4 MinIO nodes) or "single"
	run  func(ctx context.Context, a *attempt) error
}

// submit submits a fresh job of n frames.
func (a *attempt) submit(ctx context.Context, n int) error {
	first, last := a.f.nextFrames(n)
	st, err := a.f.submit(ctx, first, last)
	if err != nil {
		return err
	}
	a.job = st
	for fr := first; fr <= last; fr++ {
		a.frames = append(a.frames, fr)
	}
	return nil
}

// inProgress reports whether the job has tiles left: a fault injected now hits work.
func (a *attempt) inProgress(ctx context.Context) bool {
	st := a.f.status(ctx, a.job.JobID)
	return st.State != api.JobCompleted && st.TilesCompleted < st.TilesTotal
}

// waitTiles waits until at least n of the job's tiles are completed, still in progress.
func (a *attempt) waitTiles(ctx context.Context, n int) error {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		st := a.f.status(ctx, a.job.JobID)
		if st.TilesCompleted >= n {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("job %s never reached %d completed tiles", a.job.JobID, n)
}

var crashLine = regexp.MustCompile(`fault injection: crashing at a seam.*tile_key=([0-9a-f]+)`)

// checkpointUploaded is a worker's line for a checkpoint in the store, naming its tile.
var checkpointUploaded = regexp.MustCompile(`remote checkpoint uploaded.*tile_key=([0-9a-f]+)`)

// killAtSeam starts a worker that kills itself at seam on its first tile and measures how
// long its tile takes to be taken up again.
func killAtSeam(seam string) func(context.Context, *attempt) error {
	return func(ctx context.Context, a *attempt) error {
		if err := a.submit(ctx, 2); err != nil {
			return err
		}
		// Passes of two samples, so a pass can be killed half done.
		victim, err := a.f.startWorker(fmt.Sprintf("victim-%s", seam), "--fault-crash", seam, "--passes", "4")
		if err != nil {
			return err
		}
		a.faults++
		if !victim.WaitExit(90 * time.Second) {
			victim.Kill()
			return fmt.Errorf("%w: the worker never reached the %s seam", errInvalid, seam)
		}
		killedAt := time.Now()
		m := crashLine.FindStringSubmatch(victim.Log())
		a.landed = m != nil && a.inProgress(ctx)
		if m == nil {
			return fmt.Errorf("%w: no crash at %s in the worker's log", errInvalid, seam)
		}
		a.tile = m[1]
		switch seam {
		case "mid-pass", "after-checkpoint", "after-upload":
			a.expectRecovered = true // checkpoints were uploaded after every pass before the kill
		}
		d, err := a.f.waitTileAgain(ctx, m[1], victim.Name, killedAt, 2*time.Minute)
		if err != nil {
			return err
		}
		a.recovery = d
		return nil
	}
}

// freeze pauses a worker mid-tile past its lease, then thaws it: it must give the tile up.
func freeze(ctx context.Context, a *attempt) error {
	if err := a.submit(ctx, 2); err != nil {
		return err
	}
	zombie, err := a.f.startWorker("zombie")
	if err != nil {
		return err
	}
	defer zombie.Kill()
	// Frozen only once a checkpoint is in the store, so another worker can resume the tile.
	uploaded, err := zombie.WaitLog(ctx, checkpointUploaded, 0, time.Minute)
	if err != nil {
		return fmt.Errorf("%w: the worker never uploaded a checkpoint: %w", errInvalid, err)
	}
	tile := uploaded.Groups[1]
	a.tile = tile
	zombie.Signal(syscall.SIGSTOP)
	frozenAt := time.Now()
	a.faults++
	a.landed = a.inProgress(ctx)
	a.expectRecovered = true
	if d, err := a.f.waitTileAgain(ctx, tile, zombie.Name, frozenAt, 2*time.Minute); err == nil {
		a.recovery = d
	}
	time.Sleep(4 * time.Second) // well past the 3 s lease
	zombie.Signal(syscall.SIGCONT)
	if _, err := zombie.WaitLog(ctx, regexp.MustCompile(`lease lost`), uploaded.End, 30*time.Second); err != nil {
		return fmt.Errorf("the thawed worker did not notice it lost its lease: %w", err)
	}
	return nil
}

// killCoordinatorAt restarts the coordinator with a crash seam, lets it die there, and starts
// it again normally.
func killCoordinatorAt(seam string) func(context.Context, *attempt) error {
	return func(ctx context.Context, a *attempt) error {
		a.f.Coord.Kill()
		if err := a.f.StartCoordinator(ctx, "--fault-crash", seam); err != nil {
			return err
		}
		first, last := a.f.nextFrames(2)
		for fr := first; fr <= last; fr++ {
			a.frames = append(a.frames, fr)
		}
		st, submitErr := a.f.submit(ctx, first, last)
		if !a.f.Coord.WaitExit(30 * time.Second) {
			return fmt.Errorf("%w: the coordinator did not die at %s", errInvalid, seam)
		}
		a.faults++
		a.landed = strings.Contains(a.f.Coord.Log(), "seam="+seam)
		if seam == "submit-after-commit" && submitErr == nil {
			a.landed = false // the crash came after the answer
		}
		if err := a.f.StartCoordinator(ctx); err != nil {
			return err
		}
		// A cron job re-running the same submission gets the job the crash left behind.
		again, err := a.f.submit(ctx, first, last)
		if err != nil {
			return fmt.Errorf("resubmitting after the crash: %w", err)
		}
		if submitErr == nil && again.JobID != st.JobID {
			return fmt.Errorf("the resubmission made job %s, not %s", again.JobID, st.JobID)
		}
		a.job = again
		a.landed = a.landed && a.inProgress(ctx)
		return nil
	}
}

// killCoordinatorApplying kills the coordinator with SIGKILL while tile events flow in.
func killCoordinatorApplying(ctx context.Context, a *attempt) error {
	if err := a.submit(ctx, 2); err != nil {
		return err
	}
	if err := a.waitTiles(ctx, 2); err != nil {
		return err
	}
	a.f.Coord.Kill()
	a.faults++
	// Landed: the job still had tiles when the coordinator died, and the events of tiles
	// finished while it was down waited for it in EVENTS. Checked at the kill, since the
	// workers may finish the job while the coordinator is down.
	a.landed = a.inProgressNoAPI(ctx)
	time.Sleep(3 * time.Second) // workers keep rendering; their events wait in EVENTS
	cons, err := a.f.js.Consumer(ctx, queue.StreamEvents, "coordinator")
	if err != nil {
		return err
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return err
	}
	a.landed = a.landed && info.NumPending > 0
	return a.f.StartCoordinator(ctx)
}

// inProgressNoAPI reports whether TILES still holds work, for when the coordinator is down.
func (a *attempt) inProgressNoAPI(ctx context.Context) bool {
	s, err := a.f.js.Stream(ctx, queue.StreamTiles)
	if err != nil {
		return false
	}
	info, err := s.Info(ctx)
	return err == nil && info.State.Msgs > 0
}

// restartNATSLeader kills the TILES stream leader mid-render, brings it back, then restarts
// a second node.
func restartNATSLeader(ctx context.Context, a *attempt) error {
	// Enough frames that the job is still rendering when the second node restarts, after
	// the leader's outage and its catching up.
	if err := a.submit(ctx, 6); err != nil {
		return err
	}
	if err := a.waitTiles(ctx, 2); err != nil {
		return err
	}
	leader, err := a.f.nats.StreamLeader(ctx, a.f.js, queue.StreamTiles)
	if err != nil {
		return err
	}
	a.landed = a.inProgress(ctx)
	a.f.nats.Server(leader).Kill()
	a.faults++
	time.Sleep(3 * time.Second)
	if err := a.f.nats.Server(leader).Relaunch(); err != nil {
		return err
	}
	for _, s := range a.f.nats.Servers {
		if s.Name != leader {
			a.landed = a.landed && a.inProgress(ctx)
			s.Stop()
			a.faults++
			if err := s.Relaunch(); err != nil {
				return err
			}
			break
		}
	}
	return nil
}

// restartNATSServer kills the single NATS server mid-render and starts it again at once.
func restartNATSServer(ctx context.Context, a *attempt) error {
	if err := a.submit(ctx, 2); err != nil {
		return err
	}
	if err := a.waitTiles(ctx, 2); err != nil {
		return err
	}
	a.landed = a.inProgress(ctx)
	s := a.f.nats.Servers[0]
	s.Kill()
	a.faults++
	return s.Relaunch()
}

// natsOutage stops every NATS server for the outage's length.
func natsOutage(ctx context.Context, a *attempt) error {
	if err := a.submit(ctx, 2); err != nil {
		return err
	}
	if err := a.waitTiles(ctx, 2); err != nil {
		return err
	}
	a.landed = a.inProgress(ctx)
	for _, s := range a.f.nats.Servers {
		s.Stop()
	}
	a.faults++
	time.Sleep(a.f.cfg.outage)
	for _, s := range a.f.nats.Servers {
		if err := s.Relaunch(); err != nil {
			return err
		}
	}
	return nil
}

// restartMinIONode kills one MinIO node (not the one clients talk to) mid-render and brings
// it back.
func restartMinIONode(ctx context.Context, a *attempt) error {
	// Enough frames that the job is still rendering once two tiles are done.
	if err := a.submit(ctx, 6); err != nil {
		return err
	}
	if err := a.waitTiles(ctx, 2); err != nil {
		return err
	}
	a.landed = a.inProgress(ctx)
	n := a.f.minio.Nodes() - 1
	a.f.minio.KillNode(n)
	a.faults++
	time.Sleep(5 * time.Second)
	return a.f.minio.RelaunchNode(n)
}

// storageOutage stops every MinIO node for the outage's length.
func storageOutage(ctx context.Context, a *attempt) error {
	if err := a.submit(ctx, 2); err != nil {
		return err
	}
	if err := a.waitTiles(ctx, 2); err != nil {
		return err
	}
	a.landed = a.inProgress(ctx)
	for i := range a.f.minio.Nodes() {
		a.f.minio.StopNode(i)
	}
	a.faults++
	time.Sleep(a.f.cfg.outage)
	for i := range a.f.minio.Nodes() {
		if err := a.f.minio.RelaunchNode(i); err != nil {
			return err
		}
	}
	return nil
}

// randomSchedule injects faults drawn from a seeded generator, one every few seconds, for
// length, on a job big enough to outlast it.
func randomSchedule(seed uint64, length time.Duration) func(context.Context, *attempt) error {
	return func(ctx context.Context, a *attempt) error {
		rng := rand.New(rand.NewPCG(seed, 0x5eed))
		// A frame is about two seconds of the three workers' time (jobSettings, workerSlow).
		frames := max(4, int(length/(2*time.Second)))
		if err := a.submit(ctx, frames); err != nil {
			return err
		}
		a.landed = true
		end := time.Now().Add(length)
		for time.Now().Before(end) && a.inProgress(ctx) {
			time.Sleep(time.Duration(3000+rng.IntN(7000)) * time.Millisecond)
			if !a.inProgress(ctx) {
				break
			}
			a.faults++
			switch k := rng.IntN(4); {
			case k == 0:
				seam := faults.WorkerSeams[rng.IntN(len(faults.WorkerSeams))]
				v, err := a.f.startWorker(fmt.Sprintf("random-%d-%s", a.faults, seam), "--fault-crash", seam)
				if err != nil {
					return err
				}
				go func() {
					if !v.WaitExit(2 * time.Minute) {
						v.Kill()
					}
				}()
			case k == 1 && len(a.f.workers) > 0:
				w := a.f.workers[rng.IntN(len(a.f.workers))]
				w.Signal(syscall.SIGSTOP)
				time.Sleep(4 * time.Second)
				w.Signal(syscall.SIGCONT)
			case k == 2:
				a.f.Coord.Kill()
				if err := a.f.StartCoordinator(ctx); err != nil {
					return err
				}
			default:
				if len(a.f.nats.Servers) > 1 {
					s := a.f.nats.Servers[rng.IntN(len(a.f.nats.Servers))]
					s.Kill()
					time.Sleep(2 * time.Second)
					if err := s.Relaunch(); err != nil {
						return err
					}
				} else {
					n := rng.IntN(a.f.minio.Nodes())
					a.f.minio.KillNode(n)
					time.Sleep(2 * time.Second)
					if err := a.f.minio.RelaunchNode(n); err != nil {
						return err
					}
				}
			}
		}
		return nil
	}
}

// schedule is every scenario of a run: one per worker seam, the freeze, the coordinator at
// each of its seams, NATS and MinIO node restarts and outages, then a random schedule.
func schedule(cfg config) []scenario {
	var out []scenario
	for _, seam := range faults.WorkerSeams {
		out = append(out, scenario{name: "worker killed at " + seam, farm: "cluster", run: killAtSeam(seam)})
	}
	out = append(out,
		scenario{name: "worker frozen past its lease", farm: "cluster", run: freeze},
		scenario{name: "coordinator killed during submit", farm: "cluster", run: killCoordinatorAt("submit-after-commit")},
		scenario{name: "coordinator killed during relay", farm: "cluster", run: killCoordinatorAt("outbox-mid-publish")},
		scenario{name: "coordinator killed applying events", farm: "cluster", run: killCoordinatorApplying},
		scenario{name: "NATS stream leader killed, then a node restarted", farm: "cluster", run: restartNATSLeader},
		scenario{name: "MinIO node killed", farm: "cluster", run: restartMinIONode},
		scenario{name: "single NATS server restarted", farm: "single", run: restartNATSServer},
		scenario{name: fmt.Sprintf("NATS outage of %v", cfg.outage), farm: "single", run: natsOutage},
		scenario{name: fmt.Sprintf("storage outage of %v", cfg.outage), farm: "single", run: storageOutage},
	)
	length := 40 * time.Second
	if cfg.soak > 0 {
		length = cfg.soak
	}
	out = append(out, scenario{name: fmt.Sprintf("random faults for %v (seed %d)", length, cfg.seed), farm: "cluster",
		run: randomSchedule(cfg.seed, length)})
	if cfg.soak > 0 {
		out = out[len(out)-1:]
	}
	return out
}

// runSchedule runs every scenario of the schedule and returns their rows.
func runSchedule(ctx context.Context, cfg config) ([]row, error) {
	bins, err := farmtest.Build(filepath.Join(cfg.dir, "bin"), farmtest.BuildOptions{})
	if err != nil {
		return nil, err
	}
	farms := map[string]*theFarm{}
	defer func() {
		for _, f := range farms {
			f.close()
		}
	}()
	var rows []row
	for _, sc := range schedule(cfg) {
		if cfg.only != "" && !strings.Contains(sc.name, cfg.only) {
			continue
		}
		f, ok := farms[sc.farm]
		if !ok {
			natsNodes, minioNodes := 3, 4
			if sc.farm == "single" {
				natsNodes, minioNodes = 1, 1
			}
			if f, err = newFarm(ctx, cfg, bins, sc.farm, natsNodes, minioNodes, 3); err != nil {
				return rows, err
			}
			farms[sc.farm] = f
		}
		f.logf("scenario: %s", sc.name)
		r := runScenario(ctx, f, sc)
		f.logf("%s: ok=%v %s", sc.name, r.OK, r.Problem)
		rows = append(rows, r)
		if ctx.Err() != nil {
			return rows, ctx.Err()
		}
	}
	return rows, nil
}

// runScenario runs one scenario and checks its outcome.
func runScenario(ctx context.Context, f *theFarm, sc scenario) row {
	r := row{Farm: sc.farm, Scenario: sc.name}
	before := f.deliveries(ctx)
	dupBefore := f.duplicates()
	a := &attempt{f: f}
	err := sc.run(ctx, a)
	r.Faults, r.Landed, r.RecoverySeconds = a.faults, a.landed, a.recovery.Seconds()
	problems := []string{}
	if err != nil {
		problems = append(problems, err.Error())
	}
	if !a.landed {
		problems = append(problems, errInvalid.Error())
	}
	if a.job.JobID != "" {
		st, err := f.waitDone(ctx, a.job.JobID, 4*time.Minute)
		if err != nil {
			problems = append(problems, err.Error())
		}
		r.SamplesRecovered = st.SamplesRecovered
		r.LostTiles = st.TilesTotal - st.TilesCompleted
		if st.State != api.JobCompleted {
			problems = append(problems, fmt.Sprintf("job %s is %s: %v", st.JobID, st.State, st.Failures))
		}
		if st.TilesFailed > 0 {
			problems = append(problems, fmt.Sprintf("%d tiles failed", st.TilesFailed))
		}
		if a.expectRecovered && st.SamplesRecovered == 0 {
			problems = append(problems, "a worker died mid-tile but no sample was recovered")
			f.logf("the story of tile %s:\n%s", a.tile, f.tileStory(a.tile))
		}
		if st.State == api.JobCompleted {
			if err := f.manifestsComplete(ctx, st); err != nil {
				problems = append(problems, err.Error())
			}
			for _, fr := range a.frames {
				ref, err := f.reference(ctx, fr)
				if err != nil {
					problems = append(problems, err.Error())
					continue
				}
				data, err := f.api.FrameOutput(ctx, st.JobID, fr, "png")
				if err != nil {
					problems = append(problems, fmt.Sprintf("frame %d: %v", fr, err))
					continue
				}
				n, err := differingPixels(data, ref)
				if err != nil {
					problems = append(problems, err.Error())
				}
				r.DifferingPixels += n
			}
		}
	}
	if dls, err := f.api.DeadLetters(ctx); err != nil {
		problems = append(problems, "listing dead letters: "+err.Error())
	} else if len(dls) > 0 {
		problems = append(problems, fmt.Sprintf("%d dead letters, e.g. %s", len(dls), dls[0].Reason))
	}
	if a.job.JobID != "" {
		// One delivery per tile and per frame's assembly is the clean run; the rest are
		// redeliveries the faults caused.
		r.Redeliveries = int(f.deliveries(ctx)-before) - (a.job.TilesTotal + len(a.frames))
	}
	r.Duplicates = map[string]float64{}
	for layer, v := range f.duplicates() {
		if d := v - dupBefore[layer]; d > 0 {
			r.Duplicates[layer] = d
		}
	}
	if r.Duplicates["manifest_conflict"] > 0 {
		problems = append(problems, "a manifest conflict")
	}
	if r.DifferingPixels > 0 {
		problems = append(problems, fmt.Sprintf("%d pixels differ from the reference", r.DifferingPixels))
	}
	r.OK = len(problems) == 0
	r.Problem = strings.Join(problems, "; ")
	return r
}

// printTable prints the rows as the harness's table.
func printTable(w io.Writer, rows []row) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FARM\tSCENARIO\tFAULTS\tLANDED\tREDELIVERED\tDUPLICATES SUPPRESSED\tSAMPLES RECOVERED\tBACK IN (s)\tLOST TILES\tDIFFERING PIXELS\tOK")
	for _, r := range rows {
		var dups []string
		for layer, v := range r.Duplicates {
			dups = append(dups, fmt.Sprintf("%s=%g", layer, v))
		}
		sort.Strings(dups)
		dup := strings.Join(dups, ",")
		if dup == "" {
			dup = "-"
		}
		back := "-"
		if r.RecoverySeconds > 0 {
			back = fmt.Sprintf("%.1f", r.RecoverySeconds)
		}
		ok := "ok"
		if !r.OK {
			ok = "FAIL: " + r.Problem
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%v\t%d\t%s\t%d\t%s\t%d\t%d\t%s\n", r.Farm, r.Scenario, r.Faults, r.Landed, r.Redeliveries, dup,
			r.SamplesRecovered, back, r.LostTiles, r.DifferingPixels, ok)
	}
	_ = tw.Flush()
}
