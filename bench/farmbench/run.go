// Package farmbench measures a farm of real processes on this machine: `coordinator serve`
// and `tileworker`s started from binaries built once, against `tileworker render`, the local
// reference. It is what `go run ./bench/cmd/farmbench` runs; a test runs it at tiny sizes.
package farmbench

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tilefarm/tilefarm/bench/fleet"
	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/farmtest"
	"github.com/tilefarm/tilefarm/internal/proctest"
	"github.com/tilefarm/tilefarm/internal/scene/jsonscene"
)

// Config sizes every measurement of a run.
type Config struct {
	Dir            string // work directory; its farms are removed afterwards
	Workers, Slots int    // worker processes and --concurrency of each
	MinIO          bool   // objects in a MinIO process
	Shot           Shot   // the realistic shot of farm_efficiency
	SmallFrames    int    // frames of the bundled example as it ships (farm_efficiency_small)
	Overhead       Shot   // tiny tiles, 1 spp (tile_overhead_cpu_ms)
	DispatchFrames int    // frames of the 1920x1080 64 px shot (510 tiles a frame)
	RecoveryReps   int    // kills of recovery_seconds
	RecoveryServe  []string
	ResumeKills    int
	ResumeFrames   int
	// ResumeTileSeconds is how long each tile of the resume job renders: long enough that the
	// workers' default checkpoint cadence, remote uploads included, is what a kill meets, as a
	// production tile of tens of seconds meets it (a pass of 40 s / 32 passes outlasts the
	// 1 s floor between remote uploads, so every checkpoint is uploaded).
	ResumeTileSeconds float64
	Seed              uint64
	RSSTiles          int // tiles of the --workers 0 job of coordinator_rss_job_mb (0: skip)
	Growth            bool
	ProfileDir        string // CPU profiles of the overhead farm's coordinator and first worker, and of each fleet's servers
	ProfileDuration   time.Duration
	Log               io.Writer
	// Fleet is the simulated fleet (bench/fleet); it runs when it names sizes.
	Fleet FleetConfig
	// Monitor is the coordinator's CPU with the web monitor open (MeasureMonitor); it runs
	// when it names jobs.
	Monitor MonitorLoad
	// Only names the measurements to make (Steps); empty is all of them. The figures of the
	// others stay 0, and Result.Steps says which were made.
	Only []string
}

// FleetConfig sizes the fleet step: one fleet measured per size, each against a fresh
// coordinator and JetStream (fleet.Spec says what each field does).
type FleetConfig struct {
	Sizes       []int   // workers of each fleet; empty skips the step
	TileSeconds float64 // 0 is 1 s
	WorkSeconds float64 // each worker's share of a job in seconds of tiles; 0 is 30
	Passes      int     // passes per tile; 0 is the worker's default
	PerProcess  int     // workers per fleetnode process; 0 is 250
	FrameTiles  int     // a frame is FrameTiles x FrameTiles tiles; 0 is 16
	Cluster     bool    // a 3-node JetStream cluster instead of one server
	SharedConn  bool    // one NATS connection per worker process
	Nice        int     // niceness of the worker processes; 0 is 10, -1 none
	SampleEvery time.Duration
}

// FleetSaturation is the fraction of its ideal throughput (workers / tile seconds) below which
// a fleet counts as saturated.
const FleetSaturation = 0.8

// Steps are the measurements of a run, in order, by the names Config.Only takes.
var Steps = []string{"efficiency", "small", "overhead", "dispatch", "recovery", "resume", "rss", "growth", "fleet", "monitor"}

// Default is the full run: a realistic shot of about a second a tile.
func Default() Config {
	return Config{Workers: 2, Slots: 1, MinIO: true, Shot: Shot{First: 1, Last: 2, Width: 1280, Height: 720, SPP: 16, TileSize: 256},
		SmallFrames: 24, Overhead: Shot{First: 1, Last: 4, Width: 192, Height: 108, SPP: 1, TileSize: 16},
		DispatchFrames: 240, RecoveryReps: 5, ResumeKills: 12, ResumeFrames: 1, ResumeTileSeconds: 40, Seed: 1, Log: io.Discard}
}

// Targets are the figures' goals, printed next to them.
var Targets = map[string]string{
	"farm_efficiency":                 ">= 0.97",
	"farm_efficiency_small":           ">= 0.9",
	"tile_overhead_cpu_ms":            "<= 5",
	"store_requests_per_tile":         "<= 3 per tile; the farm's own per frame on top",
	"tile_overhead_cpu_ms_file_store": "<= 5",
	"recovery_seconds_p99":            "<= 5",
	"resume_rate":                     ">= 0.95",
	"dispatch_tiles_per_s":            ">= 50000",
	"coordinator_rss_mb":              "<= 150",
}

// GrowthRow is the key figures of one farm of a growth table.
type GrowthRow struct {
	Table          string  `json:"table"`
	Value          int     `json:"value"`
	Tiles          int     `json:"tiles"`
	FarmEfficiency float64 `json:"farm_efficiency"`
	OverheadCPUms  float64 `json:"tile_overhead_cpu_ms"`
	CoordRSSMB     float64 `json:"coordinator_rss_mb"`
	WorkerRSSMB    float64 `json:"worker_rss_mb_per_slot"`
}

// Result is every figure of a run; --json prints it.
type Result struct {
	FarmEfficiency      float64 `json:"farm_efficiency"`
	FarmEfficiencySmall float64 `json:"farm_efficiency_small"`
	// FarmEfficiencyFactors and FarmEfficiencySmallFactors split each efficiency into
	// slot_busy / render_slowdown / local_busy (FarmRun.EfficiencyFactors).
	FarmEfficiencyFactors      map[string]float64 `json:"farm_efficiency_factors"`
	FarmEfficiencySmallFactors map[string]float64 `json:"farm_efficiency_small_factors"`
	TileOverheadCPUms          float64            `json:"tile_overhead_cpu_ms"`
	TileOverheadBy             map[string]float64 `json:"tile_overhead_cpu_ms_by_process"`
	OverheadStore              string             `json:"tile_overhead_store"`
	// TileOverheadFileCPUms is tile_overhead_cpu_ms on the coordinator's file store: the farm's
	// own cost without MinIO's.
	TileOverheadFileCPUms float64            `json:"tile_overhead_cpu_ms_file_store"`
	TileOverheadFileBy    map[string]float64 `json:"tile_overhead_cpu_ms_file_store_by_process"`
	// StoreRequestsPerTile is the S3 requests MinIO served per tile of the overhead job, by its
	// own counters: every request of the farm (frames', scenes' and checkpoints' too), over its
	// tiles; by API beside. docs/design.md, "Store requests of a tile", says what a tile costs.
	StoreRequestsPerTile      float64            `json:"store_requests_per_tile"`
	StoreRequestsPerTileByAPI map[string]float64 `json:"store_requests_per_tile_by_api,omitempty"`
	DispatchTilesPerS         float64            `json:"dispatch_tiles_per_s"`
	DispatchTiles             int                `json:"dispatch_tiles"`
	RecoveryP50               float64            `json:"recovery_seconds_p50"`
	RecoveryP99               float64            `json:"recovery_seconds_p99"`
	ResumeRate                float64            `json:"resume_rate"`
	ResumeKills               int                `json:"resume_kills"`
	ResumeRecovered           int64              `json:"resume_samples_recovered"`
	ResumeAgain               float64            `json:"resume_samples_rendered_again"`
	// ResumeLogged is the samples the workers logged as resumed from checkpoints, which
	// MeasureResume checks against ResumeRecovered, the job's status.
	ResumeLogged int64 `json:"resume_samples_recovered_logged"`
	// ResumeSecondsLost is the render time a kill cost: samples rendered again x seconds a
	// sample / kills; ResumeTileSeconds is how long a tile of the job took to render.
	ResumeSecondsLost   float64           `json:"resume_seconds_lost_per_kill"`
	ResumeTileSeconds   float64           `json:"resume_tile_seconds"`
	CoordinatorRSSMB    float64           `json:"coordinator_rss_mb"`
	CoordinatorRSSTiles int               `json:"coordinator_rss_tiles"`
	WorkerRSSMBPerSlot  float64           `json:"worker_rss_mb_per_slot"`
	FarmSeconds         float64           `json:"farm_seconds"`
	LocalSeconds        float64           `json:"local_seconds"`
	ShotTiles           int               `json:"shot_tiles"`
	ShotTileSeconds     float64           `json:"shot_tile_cpu_seconds"`
	Targets             map[string]string `json:"targets"`
	Growth              []GrowthRow       `json:"growth,omitempty"`
	// Fleet is one row per fleet size; FleetSaturation the first size whose tiles_per_s fell
	// below FleetSaturation of its ideal, 0 if none did (absent when no fleet was measured).
	Fleet           []fleet.Row `json:"fleet,omitempty"`
	FleetSaturation *int        `json:"fleet_saturation_workers,omitempty"`
	// Monitor is the coordinator's CPU with the monitor closed and open (absent when not
	// measured).
	Monitor  *MonitorCPU `json:"monitor,omitempty"`
	Profiles []string    `json:"profiles,omitempty"`
	Machine  string      `json:"machine"`
	Steps    []string    `json:"steps"` // the measurements made
}

// Run builds the binaries and makes every measurement of c.
func Run(ctx context.Context, c Config) (Result, error) {
	res := Result{Targets: Targets, Machine: machine()}
	root, err := proctest.ModuleRoot()
	if err != nil {
		return res, err
	}
	dir, err := os.MkdirTemp(c.Dir, "farmbench-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	if c.ProfileDir != "" {
		if err := os.MkdirAll(c.ProfileDir, 0o755); err != nil {
			return res, fmt.Errorf("profile directory: %w", err)
		}
	}
	logf := func(format string, args ...any) { fmt.Fprintf(c.Log, "farmbench: "+format+"\n", args...) }
	off := map[string]bool{"rss": c.RSSTiles == 0, "growth": !c.Growth, "fleet": len(c.Fleet.Sizes) == 0, "monitor": c.Monitor.Jobs == 0}
	var run []string
	for _, name := range Steps {
		if !off[name] && (len(c.Only) == 0 || slices.Contains(c.Only, name)) {
			run = append(run, name)
		}
	}
	// The fleet runs binaries of its own: the farm's are built only for the other steps.
	var bins farmtest.Binaries
	if slices.ContainsFunc(run, func(name string) bool { return name != "fleet" }) {
		logf("building the farm")
		if bins, err = farmtest.Build(filepath.Join(dir, "bin"), farmtest.BuildOptions{}); err != nil {
			return res, err
		}
	}
	scene := filepath.Join(root, "examples", "shot", "scene.json")
	b, err := jsonscene.ReadFile(ctx, scene)
	if err != nil {
		return res, fmt.Errorf("reading the shot: %w", err)
	}
	spec := FarmSpec{Workers: c.Workers, Slots: c.Slots, MinIO: c.MinIO}

	steps := map[string]func() error{
		"efficiency": func() error {
			logf("farm_efficiency: %+v", c.Shot)
			shot, err := MeasureFarm(ctx, bins, scene, b, filepath.Join(dir, "shot"), c.Shot, spec, nil)
			if err != nil {
				return fmt.Errorf("farm efficiency: %w", err)
			}
			res.FarmEfficiency, res.FarmSeconds, res.LocalSeconds = shot.Efficiency(), shot.Farm.Seconds(), shot.Local.Seconds()
			res.FarmEfficiencyFactors = shot.EfficiencyFactors()
			res.ShotTiles, res.ShotTileSeconds = shot.Tiles, shot.LocalCPU.Seconds()/float64(shot.Tiles)
			res.CoordinatorRSSMB, res.WorkerRSSMBPerSlot = mb(shot.CoordRSS), mb(shot.WorkerRSSPerSlot)
			return nil
		},
		"small": func() error {
			logf("farm_efficiency_small: %d frames as the example ships", c.SmallFrames)
			small, err := MeasureFarm(ctx, bins, scene, b, filepath.Join(dir, "small"), Shot{First: 1, Last: c.SmallFrames}, spec, nil)
			if err != nil {
				return fmt.Errorf("farm efficiency of the example: %w", err)
			}
			res.FarmEfficiencySmall, res.FarmEfficiencySmallFactors = small.Efficiency(), small.EfficiencyFactors()
			return nil
		},
		"overhead": func() error {
			logf("tile_overhead_cpu_ms: %+v", c.Overhead)
			var prof *Profiles
			if c.ProfileDir != "" {
				prof = &Profiles{Dir: c.ProfileDir, Seconds: c.ProfileDuration}
			}
			over, err := MeasureFarm(ctx, bins, scene, b, filepath.Join(dir, "overhead"), c.Overhead, spec, prof)
			if err != nil {
				return fmt.Errorf("tile overhead: %w", err)
			}
			res.TileOverheadCPUms, res.TileOverheadBy = over.OverheadCPUms(), over.OverheadByProcess()
			res.StoreRequestsPerTile, res.StoreRequestsPerTileByAPI = over.StoreRequestsPerTile, over.StoreRequestsPerTileByAPI
			res.OverheadStore = map[bool]string{true: "minio", false: "file"}[c.MinIO]
			if c.MinIO {
				fileSpec := spec
				fileSpec.MinIO = false
				if over, err = MeasureFarm(ctx, bins, scene, b, filepath.Join(dir, "overhead-file"), c.Overhead, fileSpec, nil); err != nil {
					return fmt.Errorf("tile overhead on the file store: %w", err)
				}
			}
			res.TileOverheadFileCPUms, res.TileOverheadFileBy = over.OverheadCPUms(), over.OverheadByProcess()
			if prof != nil {
				for _, name := range []string{"coordinator", "w1"} {
					res.Profiles = append(res.Profiles, filepath.Join(c.ProfileDir, name+".pprof"))
				}
			}
			return nil
		},
		"dispatch": func() error {
			logf("dispatch: %d frames", c.DispatchFrames)
			d, err := MeasureShotDispatch(ctx, bins, filepath.Join(dir, "dispatch"), b,
				DispatchShot{Frames: c.DispatchFrames, Width: 1920, Height: 1080, TileSize: 64, Sync: "1s"})
			if err != nil {
				return fmt.Errorf("dispatch: %w", err)
			}
			res.DispatchTiles, res.DispatchTilesPerS = d.Tiles, float64(d.Tiles)/d.Durable.Seconds()
			res.CoordinatorRSSMB, res.CoordinatorRSSTiles = max(res.CoordinatorRSSMB, mb(d.PeakRSS)), d.Tiles
			return nil
		},
		"recovery": func() error {
			logf("recovery: %d kills", c.RecoveryReps)
			rec, err := MeasureRecovery(ctx, bins, b, filepath.Join(dir, "recovery"), c.RecoveryReps, c.RecoveryServe, c.MinIO)
			if err != nil {
				return fmt.Errorf("recovery: %w", err)
			}
			res.RecoveryP50, res.RecoveryP99 = percentile(rec, 50).Seconds(), percentile(rec, 99).Seconds()
			return nil
		},
		"resume": func() error {
			logf("resume: %d kills, seed %d, tiles of %g s", c.ResumeKills, c.Seed, c.ResumeTileSeconds)
			rr, err := MeasureResume(ctx, bins, b, filepath.Join(dir, "resume"), ResumeSpec{Workers: c.Workers, Kills: c.ResumeKills,
				Seed: c.Seed, Frames: c.ResumeFrames, MinIO: c.MinIO, TileSeconds: c.ResumeTileSeconds})
			if err != nil {
				return fmt.Errorf("resume: %w", err)
			}
			res.ResumeRate, res.ResumeKills = rr.Rate(), rr.Kills
			res.ResumeRecovered, res.ResumeAgain, res.ResumeLogged = rr.Recovered, rr.Again(), rr.LoggedRecovered
			res.ResumeSecondsLost, res.ResumeTileSeconds = rr.SecondsLostPerKill(), rr.TileSeconds()
			return nil
		},
		"rss": func() error {
			logf("coordinator rss: a job of %d tiles", c.RSSTiles)
			n, rss, err := MeasureCoordinatorRSS(ctx, bins, b, filepath.Join(dir, "rss"), c.RSSTiles)
			if err != nil {
				return fmt.Errorf("coordinator rss: %w", err)
			}
			res.CoordinatorRSSMB, res.CoordinatorRSSTiles = mb(rss), n
			return nil
		},
		"growth": func() (err error) {
			res.Growth, err = growth(ctx, c, bins, scene, b, filepath.Join(dir, "growth"), logf)
			return err
		},
		"monitor": func() error {
			logf("monitor: %d jobs of %d frames, %d tile events a second, %v windows", c.Monitor.Jobs, c.Monitor.Frames, c.Monitor.Rate, c.Monitor.Window)
			m, err := MeasureMonitor(ctx, bins, filepath.Join(dir, "monitor"), b, c.Monitor)
			if err != nil {
				return fmt.Errorf("monitor: %w", err)
			}
			res.Monitor = &m
			return nil
		},
		"fleet": func() error {
			rows, err := measureFleet(ctx, c, filepath.Join(dir, "fleet"))
			res.Fleet = rows
			if err != nil {
				return err
			}
			at := fleet.Saturation(rows, FleetSaturation)
			res.FleetSaturation = &at
			for _, r := range rows {
				res.Profiles = append(res.Profiles, r.Profiles...)
			}
			return nil
		},
	}
	for _, name := range run {
		if err := steps[name](); err != nil {
			return res, err
		}
		res.Steps = append(res.Steps, name)
	}
	return res, nil
}

// growth measures the key figures at three sizes of tiles per frame, frames per job and
// workers, each from the realistic shot scaled down to a fraction of a second per tile.
func growth(ctx context.Context, c Config, bins farmtest.Binaries, scene string, b *bundle.Bundle, dir string, logf func(string, ...any)) ([]GrowthRow, error) {
	base := Shot{First: 1, Last: 2, Width: 320, Height: 180, SPP: 8, TileSize: 64}
	var rows []GrowthRow
	run := func(table string, value int, s Shot, spec FarmSpec) error {
		logf("growth %s=%d", table, value)
		r, err := MeasureFarm(ctx, bins, scene, b, filepath.Join(dir, fmt.Sprintf("%s-%d", table, value)), s, spec, nil)
		if err != nil {
			return fmt.Errorf("growth %s=%d: %w", table, value, err)
		}
		rows = append(rows, GrowthRow{Table: table, Value: value, Tiles: r.Tiles, FarmEfficiency: r.Efficiency(),
			OverheadCPUms: r.OverheadCPUms(), CoordRSSMB: mb(r.CoordRSS), WorkerRSSMB: mb(r.WorkerRSSPerSlot)})
		return nil
	}
	spec := FarmSpec{Workers: c.Workers, Slots: c.Slots, MinIO: c.MinIO}
	for _, ts := range []int{64, 32, 16} {
		s := base
		s.TileSize = ts
		if err := run("tiles_per_frame", tilesPerFrame(s), s, spec); err != nil {
			return nil, err
		}
	}
	for _, n := range []int{1, 4, 16} {
		s := base
		s.Last = n
		if err := run("frames_per_job", n, s, spec); err != nil {
			return nil, err
		}
	}
	for _, n := range []int{1, 2, 4} {
		sp := spec
		sp.Workers, sp.Slots = n, 1
		if err := run("workers", n, base, sp); err != nil {
			return nil, err
		}
	}
	return rows, nil
}

// measureFleet measures a simulated fleet of each of c.Fleet.Sizes, each in a directory of its
// own under dir, with CPU profiles during each window when c.ProfileDir is set.
func measureFleet(ctx context.Context, c Config, dir string) ([]fleet.Row, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	fmt.Fprintf(c.Log, "farmbench: building fleetnode\n")
	bin, err := fleet.Build(dir)
	if err != nil {
		return nil, err
	}
	fc := c.Fleet
	if fc.TileSeconds <= 0 {
		fc.TileSeconds = 1
	}
	var rows []fleet.Row
	for _, n := range fc.Sizes {
		row, err := fleet.Measure(ctx, fleet.Spec{Bin: bin, Dir: filepath.Join(dir, strconv.Itoa(n)), Workers: n, PerProcess: fc.PerProcess,
			TileSeconds: fc.TileSeconds, WorkSeconds: fc.WorkSeconds, FrameTiles: fc.FrameTiles, Passes: fc.Passes,
			Cluster: fc.Cluster, SharedConn: fc.SharedConn, Nice: fc.Nice, SampleEvery: fc.SampleEvery,
			ProfileDir: c.ProfileDir, ProfileSeconds: c.ProfileDuration, Log: c.Log})
		if err != nil {
			return rows, fmt.Errorf("fleet of %d: %w", n, err)
		}
		rows = append(rows, row)
	}
	return rows, nil
}

func tilesPerFrame(s Shot) int {
	return ((s.Width + s.TileSize - 1) / s.TileSize) * ((s.Height + s.TileSize - 1) / s.TileSize)
}

func mb(b int64) float64 { return float64(b) / (1 << 20) }

// machine names the CPU, its cores and the Go version, so a figure is never read without them.
func machine() string {
	model := "unknown cpu"
	if raw, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(raw), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				model = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	ver, _ := exec.Command("go", "env", "GOVERSION").Output()
	return fmt.Sprintf("%s, %d cores, %s", model, numCPU(), strings.TrimSpace(string(ver)))
}

// Figures are the result's top-level numbers by name, for the table and the finite check.
func (r Result) Figures() [][2]any {
	return [][2]any{
		{"farm_efficiency", r.FarmEfficiency}, {"farm_efficiency_small", r.FarmEfficiencySmall},
		{"tile_overhead_cpu_ms", r.TileOverheadCPUms}, {"tile_overhead_cpu_ms_file_store", r.TileOverheadFileCPUms}, {"dispatch_tiles_per_s", r.DispatchTilesPerS},
		{"recovery_seconds_p50", r.RecoveryP50}, {"recovery_seconds_p99", r.RecoveryP99},
		{"resume_rate", r.ResumeRate}, {"resume_seconds_lost_per_kill", r.ResumeSecondsLost}, {"resume_tile_seconds", r.ResumeTileSeconds},
		{"coordinator_rss_mb", r.CoordinatorRSSMB},
		{"worker_rss_mb_per_slot", r.WorkerRSSMBPerSlot},
	}
}

// Table writes the figures, with their targets, as a readable table.
func (r Result) Table(w io.Writer) {
	width := 0
	for _, f := range r.Figures() {
		width = max(width, len(f[0].(string)))
	}
	fmt.Fprintf(w, "machine: %s\n\n%-*s %14s  %s\n", r.Machine, width, "figure", "value", "target")
	for _, f := range r.Figures() {
		fmt.Fprintf(w, "%-*s %14.4g  %s\n", width, f[0], f[1], Targets[f[0].(string)])
	}
	fmt.Fprintf(w, "\nshot: %d tiles, %.2f s of CPU a tile; local %.1f s, farm %.1f s; dispatch %d tiles; rss at %d tiles\n",
		r.ShotTiles, r.ShotTileSeconds, r.LocalSeconds, r.FarmSeconds, r.DispatchTiles, r.CoordinatorRSSTiles)
	if slices.Contains(r.Steps, "resume") {
		fmt.Fprintf(w, "resume: %d kills, %d samples recovered (%d logged by the workers), %.0f rendered again\n",
			r.ResumeKills, r.ResumeRecovered, r.ResumeLogged, r.ResumeAgain)
	}
	for _, e := range []struct {
		name    string
		factors map[string]float64
	}{{"farm_efficiency", r.FarmEfficiencyFactors}, {"farm_efficiency_small", r.FarmEfficiencySmallFactors}} {
		if e.factors != nil {
			fmt.Fprintf(w, "%s = slot_busy %.3f / render_slowdown %.3f / local_busy %.3f\n", e.name,
				e.factors["slot_busy"], e.factors["render_slowdown"], e.factors["local_busy"])
		}
	}
	if len(r.Fleet) > 0 {
		f := r.Fleet[0]
		fmt.Fprintf(w, "\nfleet: %gs tiles in %d passes, %s, %s, workers at nice %d\n", f.TileSeconds, f.Passes, f.JetStream, f.Store, f.WorkersNice)
		fmt.Fprintf(w, "%8s %9s %9s %9s %8s %8s %7s %7s %7s %10s\n", "workers", "tiles/s", "ideal", "events/s",
			"p50-ms", "p99-ms", "coord", "jetstr", "wrkrs", "job")
		for _, f := range r.Fleet {
			fmt.Fprintf(w, "%8d %9.1f %9.1f %9.1f %8.1f %8.1f %7.2f %7.2f %7.2f %10s\n", f.Workers, f.TilesPerS, f.IdealTilesPerS,
				f.EventsPerS, f.DispatchP50ms, f.DispatchP99ms, f.CoordinatorCPU, f.JetStreamCPU, f.WorkersCPU, f.JobState)
		}
		if r.FleetSaturation != nil {
			if *r.FleetSaturation == 0 {
				fmt.Fprintf(w, "no fleet size fell below %.0f%% of its ideal throughput\n", 100*FleetSaturation)
			} else {
				fmt.Fprintf(w, "throughput stops growing at %d workers (below %.0f%% of ideal)\n", *r.FleetSaturation, 100*FleetSaturation)
			}
		}
	}
	if m := r.Monitor; m != nil {
		fmt.Fprintf(w, "\nmonitor: %d jobs, %d frames, %d tiles, %.0f tile events a second; coordinator CPU in cores\n", m.Jobs, m.Frames, m.Tiles, m.EventsPerS)
		fmt.Fprintf(w, "%-12s %8.3f\n%-12s %8.3f  (x%.2f, +%.1f%% of a core)\n%-12s %8.3f  (x%.2f, +%.1f%% of a core)\n", "closed", m.Closed,
			"jobs view", m.JobsView, m.JobsView/m.Closed, 100*(m.JobsView-m.Closed), "job view", m.JobView, m.JobView/m.Closed, 100*(m.JobView-m.Closed))
	}
	if len(r.Growth) > 0 {
		table := ""
		for _, g := range r.Growth {
			if g.Table != table {
				table = g.Table
				fmt.Fprintf(w, "\n%-16s %8s %10s %12s %10s %10s\n", table, "tiles", "efficiency", "overhead-ms", "coord-MB", "worker-MB")
			}
			fmt.Fprintf(w, "%-16d %8d %10.3f %12.2f %10.1f %10.1f\n", g.Value, g.Tiles, g.FarmEfficiency, g.OverheadCPUms, g.CoordRSSMB, g.WorkerRSSMB)
		}
	}
}

// Finite reports the first figure that is not a finite number, if any.
func (r Result) Finite() error {
	for _, f := range r.Figures() {
		if v := f[1].(float64); math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("%s is %v", f[0], v)
		}
	}
	return nil
}
