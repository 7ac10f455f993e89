package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/bench/farmbench"
	"github.com/tilefarm/tilefarm/blender/blendertest"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/client"
	"github.com/tilefarm/tilefarm/internal/farmtest"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/miniotest"
	"github.com/tilefarm/tilefarm/internal/proctest"
	"github.com/tilefarm/tilefarm/objstore"
	"github.com/tilefarm/tilefarm/raster"
	"github.com/tilefarm/tilefarm/render"
)

// EnvOldBinaries names a directory holding `coordinator` and `tileworker` built from the commit
// before scenes travelled by content (one bundle a submit, at most 4,096 files): when it is set,
// BenchmarkStudioScene measures that build's submit too.
const EnvOldBinaries = "TILEFARM_OLD_BINS"

// oldMaxFiles is the most files the old build's bundle takes (its bundle.MaxAssets).
const oldMaxFiles = 4096

// rssTarget is the peak resident set each process of the studio benchmark should stay under.
const rssTarget = 200 << 20

// studioProject is a project blender/testdata/make_studio.py builds: files more files of size
// bytes each (half an image sequence, half textures) beside shot.blend, its linked library, the
// library's texture and the example's.
type studioProject struct {
	files, size int
}

// studioFixed is how many files make_studio.py adds to the extra ones: the shot, its library,
// their two textures, three OpenVDB frames and 24 frames of a baked point cache.
const studioFixed = 4 + 3 + 24

// sceneFiles is how many files the scene names: the extra files and the fixed ones.
func (p studioProject) sceneFiles() int { return p.files + studioFixed }

// makeStudioProject builds p under dir and returns its directory, checking it holds the files
// sceneFiles counts.
func makeStudioProject(tb testing.TB, dir string, p studioProject) string {
	tb.Helper()
	out := filepath.Join(dir, fmt.Sprintf("studio-%d-%d", p.files, p.size))
	blendertest.Run(tb, "--python", filepath.Join(blendertest.Root(tb), "blender", "testdata", "make_studio.py"), "--",
		blendertest.Example(tb), out, strconv.Itoa(p.files), strconv.Itoa(p.size))
	n := 0
	if err := filepath.WalkDir(out, func(_ string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			n++
		}
		return err
	}); err != nil || n != p.sceneFiles() {
		tb.Fatalf("the project holds %d files (%v), want %d", n, err, p.sceneFiles())
	}
	return out
}

// studioSettings are the settings the farm resolves for the project's shot: the example's own.
var studioSettings = render.Settings{Camera: "Camera", Width: 160, Height: 120, SPP: 32, Seed: 7}

var (
	farmBinOnce sync.Once
	farmBins    farmtest.Binaries
	farmBinErr  error
)

// farmBinaries builds cmd/coordinator and cmd/tileworker once per test binary (coordinatorBinary
// builds the coordinator alone).
func farmBinaries() (farmtest.Binaries, error) {
	farmBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tilefarm-bench-farm")
		if err != nil {
			farmBinErr = err
			return
		}
		farmBins, farmBinErr = farmtest.Build(dir, farmtest.BuildOptions{})
	})
	return farmBins, farmBinErr
}

// oldBinaries are the binaries of EnvOldBinaries, or false when it is unset.
func oldBinaries() (farmtest.Binaries, bool, error) {
	dir := os.Getenv(EnvOldBinaries)
	if dir == "" {
		return farmtest.Binaries{}, false, nil
	}
	b := farmtest.Binaries{Dir: dir}
	b.Coordinator, b.Tileworker = b.Path("coordinator"), b.Path("tileworker")
	if _, err := os.Stat(b.Coordinator); err != nil {
		return b, false, fmt.Errorf("$%s: %w", EnvOldBinaries, err)
	}
	return b, true, nil
}

// studioFarm is a farm of processes on an empty MinIO: `coordinator serve --workers 0` and the
// tileworkers started on it, each serving /debug/pprof. (farmbench.StartFarm uploads a scene
// first; this benchmark measures what a submit sends to an empty store.)
type studioFarm struct {
	*farmbench.Farm
	minio *miniotest.Server
	debug map[string]string // process name to its /debug/pprof address
}

// startStudioFarm starts MinIO and a coordinator of bins under dir. Close kills both.
func startStudioFarm(ctx context.Context, bins farmtest.Binaries, dir string) (*studioFarm, error) {
	m, err := miniotest.Launch(filepath.Join(dir, "minio"))
	if err != nil {
		if m != nil {
			m.Kill()
		}
		return nil, fmt.Errorf("starting minio: %w", err)
	}
	f := &farmtest.Farm{Bins: bins, Dir: dir, LogLevel: "warn", ServeArgs: []string{"--workers", "0"}}
	f.UseMinIO(m)
	sf := &studioFarm{Farm: &farmbench.Farm{Farm: f}, minio: m, debug: map[string]string{}}
	addr, err := proctest.FreeAddr()
	if err != nil {
		f.Close()
		return nil, err
	}
	sf.debug["coordinator"] = addr
	if err := f.StartCoordinator(ctx, "--debug-listen", addr); err != nil {
		f.Close()
		return nil, err
	}
	sf.API = client.New(f.HTTP, "")
	return sf, nil
}

// startWorker starts one tileworker of one slot with its node cache under ckpt.
func (f *studioFarm) startWorker(name, ckpt string) (*farmtest.Worker, error) {
	addr, err := proctest.FreeAddr()
	if err != nil {
		return nil, err
	}
	f.debug[name] = addr
	return f.Farm.Farm.StartWorker(farmtest.WorkerSpec{Name: name, Checkpoints: ckpt, Args: []string{"--debug-listen", addr}})
}

// store opens the farm's MinIO bucket as the farm does: objstore.OpenStore, with the
// credentials miniotest gives the farm in the environment.
func (f *studioFarm) store(tb testing.TB, ctx context.Context) objstore.Store {
	tb.Helper()
	for _, kv := range f.minio.Env() {
		k, v, _ := strings.Cut(kv, "=")
		tb.Setenv(k, v)
	}
	s, err := objstore.OpenStore(ctx, f.minio.URL())
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// heapProfile saves the named process's heap profile (/debug/pprof/heap) to path.
func (f *studioFarm) heapProfile(ctx context.Context, name, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+f.debug[name]+"/debug/pprof/heap", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("heap profile of %s: %s", name, resp.Status)
	}
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// submitRun is one `coordinator submit` process, run to its end.
type submitRun struct {
	elapsed        time.Duration
	code           int
	stdout, stderr string
	peakRSS        int64 // its own VmHWM, polled every 50 ms while it ran
	status         api.Status
}

// runSubmit runs `BIN submit ARGS --server SERVER --json` and polls the process's own peak
// resident set (VmHWM: its Blender inspection is a process of its own, not counted) every 50 ms
// until it exits. A non-zero exit is not an error: the caller reads code.
func runSubmit(ctx context.Context, bin, server string, args ...string) (submitRun, error) {
	cmd := exec.CommandContext(ctx, bin, append(append([]string{"submit"}, args...), "--server", server, "--json")...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	var r submitRun
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return r, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var err error
polling:
	for {
		// VmHWM only grows; once the process is a zombie it has none, and the last read stands.
		if p, perr := farmbench.PeakRSS(cmd.Process.Pid); perr == nil {
			r.peakRSS = max(r.peakRSS, p)
		}
		select {
		case err = <-done:
			break polling
		case <-tick.C:
		}
	}
	r.elapsed = time.Since(start)
	r.stdout, r.stderr = out.String(), errb.String()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		r.code = ee.ExitCode()
	} else if err != nil {
		return r, err
	}
	if r.code == 0 || r.code == 3 || r.code == 42 {
		if err := json.Unmarshal(out.Bytes(), &r.status); err != nil {
			return r, fmt.Errorf("decoding submit's status: %v\n%s", err, r)
		}
	}
	return r, nil
}

func (r submitRun) String() string {
	return fmt.Sprintf("exit %d after %v\nstdout:\n%s\nstderr:\n%s", r.code, r.elapsed, r.stdout, r.stderr)
}

// sentLine is submit's line about its upload (cli.uploadSummary).
var sentLine = regexp.MustCompile(`sent (\d+) of (\d+) files \(([\d.]+ [KMGT]?i?B) of ([\d.]+ [KMGT]?i?B)`)

// uploadLine is what submit said it sent: files and bytes (to the 0.1 of a unit it prints) of
// the scene's.
type uploadLine struct {
	sent, files           int
	sentBytes, sceneBytes float64
	sentUnit              float64 // the unit sentBytes was printed in (to one decimal)
}

// parseUpload reads submit's line about its upload from its stderr.
func parseUpload(stderr string) (uploadLine, error) {
	m := sentLine.FindStringSubmatch(stderr)
	if m == nil {
		return uploadLine{}, fmt.Errorf("submit said nothing of its upload:\n%s", stderr)
	}
	var u uploadLine
	u.sent, _ = strconv.Atoi(m[1])
	u.files, _ = strconv.Atoi(m[2])
	u.sentBytes, u.sentUnit = humanBytes(m[3])
	u.sceneBytes, _ = humanBytes(m[4])
	return u, nil
}

// humanBytes reads "1.2 MiB" (cli.humanBytes) back, and the unit it is printed in.
func humanBytes(s string) (v, unit float64) {
	num, u, _ := strings.Cut(s, " ")
	v, _ = strconv.ParseFloat(num, 64)
	unit = 1
	if i := strings.IndexByte("KMGT", u[0]); i >= 0 {
		for range i + 1 {
			unit *= 1024
		}
	}
	return v * unit, unit
}

// storedContent counts the files the store holds by content and their bytes.
func storedContent(ctx context.Context, s objstore.Store) (int, int64, error) {
	objs, err := s.List(ctx, layout.ContentPrefix)
	if err != nil {
		return 0, 0, err
	}
	var n int64
	for _, o := range objs {
		n += o.Size
	}
	return len(objs), n, nil
}

// studioRun is what one run of the studio project measured.
type studioRun struct {
	files                       int // the scene's files
	firstSent, firstContents    int // files submit said it sent; contents the store then held
	firstBytes                  int64
	first                       time.Duration
	firstManifest               int64
	firstJob                    time.Duration // from the first submit's end to its job completed
	secondSent                  int
	secondBytes, secondManifest int64
	second                      time.Duration
	maxRelDiff                  float64
	cached                      int // files in the worker's node cache at the end
	submitRSS, coordRSS         int64
	workerRSS                   int64
}

// measureStudio runs a fresh farm (coordinator and one tileworker on MinIO) for the project at
// project (p): a first submit, one texture changed, a second submit, both jobs waited for, the
// second's frame compared with Blender's own render of the project.
func measureStudio(tb testing.TB, ctx context.Context, bins farmtest.Binaries, dir, project string, p studioProject) (studioRun, error) {
	var r studioRun
	f, err := startStudioFarm(ctx, bins, filepath.Join(dir, "farm"))
	if err != nil {
		return r, err
	}
	defer f.Close()
	node := filepath.Join(dir, "node")
	w, err := f.startWorker("w", node)
	if err != nil {
		return r, err
	}
	s := f.store(tb, ctx)
	blend := filepath.Join(project, "shot.blend")
	args := []string{blend, "--frames", "1", "--format", "exr"}

	first, err := runSubmit(ctx, bins.Coordinator, f.HTTP, args...)
	if err != nil {
		return r, err
	}
	if first.code != 42 && first.code != 3 {
		return r, fmt.Errorf("first submit: %s", first)
	}
	up, err := parseUpload(first.stderr)
	if err != nil {
		return r, err
	}
	r.first, r.files, r.firstSent, r.submitRSS = first.elapsed, up.files, up.sent, first.peakRSS
	// Every file once: the library's texture is a copy of the example's, one content twice.
	if up.files != p.sceneFiles() || up.sent != up.files-1 {
		return r, fmt.Errorf("the first submit sent %d of %d files, want %d of %d (one content twice)", up.sent, up.files, p.sceneFiles()-1, p.sceneFiles())
	}
	if r.firstContents, r.firstBytes, err = storedContent(ctx, s); err != nil {
		return r, err
	}
	if r.firstContents != up.sent {
		return r, fmt.Errorf("the store holds %d files after the first submit, which said it sent %d", r.firstContents, up.sent)
	}
	if d := up.sentBytes - float64(r.firstBytes); d > 0.05*up.sentUnit || -d > 0.05*up.sentUnit {
		return r, fmt.Errorf("submit said it sent %.1f units of %.0f bytes, the store holds %d bytes", up.sentBytes/up.sentUnit, up.sentUnit, r.firstBytes)
	}
	info, err := s.Stat(ctx, layout.SceneKey(first.status.SceneVersion))
	if err != nil {
		return r, err
	}
	r.firstManifest = info.Size
	jobStart := time.Now()
	if _, err := f.Wait(ctx, first.status.JobID, 30*time.Minute); err != nil {
		return r, err
	}
	r.firstJob = time.Since(jobStart)

	// One texture changes: only it and the new manifest travel.
	tex := filepath.Join(project, "tex", "t_0007.png")
	data, err := os.ReadFile(tex)
	if err != nil {
		return r, err
	}
	data[0] ^= 0xff
	if err := os.WriteFile(tex, data, 0o644); err != nil {
		return r, err
	}
	second, err := runSubmit(ctx, bins.Coordinator, f.HTTP, args...)
	if err != nil {
		return r, err
	}
	if second.code != 42 && second.code != 3 && second.code != 0 {
		return r, fmt.Errorf("second submit: %s", second)
	}
	r.second, r.submitRSS = second.elapsed, max(r.submitRSS, second.peakRSS)
	if up, err = parseUpload(second.stderr); err != nil {
		return r, err
	}
	r.secondSent = up.sent
	if up.sent != 1 || up.files != p.sceneFiles() {
		return r, fmt.Errorf("after one texture changed the submit sent %d of %d files, want 1:\n%s", up.sent, up.files, second.stderr)
	}
	if second.status.SceneVersion == first.status.SceneVersion {
		return r, errors.New("a changed texture kept the scene version")
	}
	n, total, err := storedContent(ctx, s)
	if err != nil {
		return r, err
	}
	if n != r.firstContents+1 {
		return r, fmt.Errorf("the store holds %d files after the second submit, want %d", n, r.firstContents+1)
	}
	r.secondBytes = total - r.firstBytes
	if r.secondBytes != int64(len(data)) {
		return r, fmt.Errorf("the second submit stored %d bytes of content, the texture is %d", r.secondBytes, len(data))
	}
	if info, err = s.Stat(ctx, layout.SceneKey(second.status.SceneVersion)); err != nil {
		return r, err
	}
	r.secondManifest = info.Size
	if _, err := f.Wait(ctx, second.status.JobID, 30*time.Minute); err != nil {
		return r, err
	}
	// Peaks over the whole run, read while the processes live.
	if r.coordRSS, err = farmbench.PeakRSS(f.Coord.Pid()); err != nil {
		return r, err
	}
	if r.workerRSS, err = farmbench.PeakRSS(w.Pid()); err != nil {
		return r, err
	}
	for name, peak := range map[string]int64{"coordinator": r.coordRSS, "w": r.workerRSS} {
		if peak > rssTarget {
			prof, err := os.MkdirTemp("", "studio-heap-")
			if err == nil {
				path := filepath.Join(prof, name+".heap")
				if err = f.heapProfile(ctx, name, path); err == nil {
					tb.Logf("%s peaked at %.0f MB (target 200): its heap profile at the end is %s", name, float64(peak)/1e6, path)
				}
			}
			if err != nil {
				tb.Logf("heap profile of %s: %v", name, err)
			}
		}
	}

	got, err := f.API.FrameOutput(ctx, second.status.JobID, 1, "exr")
	if err != nil {
		return r, err
	}
	gotFrame, err := raster.DecodeEXR(got)
	if err != nil {
		return r, err
	}
	own := blendertest.ReadEXR(tb, blendertest.OwnRender(tb, blend, studioSettings, 1, false))
	if r.maxRelDiff = blendertest.MaxRelDiff(gotFrame.Pix, own.Pix); r.maxRelDiff > 1e-5 {
		return r, fmt.Errorf("%w: the project's frame differs from Blender's own render by %g relative", errMismatch, r.maxRelDiff)
	}
	err = filepath.WalkDir(filepath.Join(node, "scenes", "content"), func(_ string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && len(d.Name()) == 64 {
			r.cached++
		}
		return err
	})
	return r, err
}

// smallRun is one submit of a project of small files to a fresh farm of its build, with no
// worker: what is measured is the submit.
type smallRun struct {
	files   int // the scene's files
	elapsed time.Duration
	code    int
	refusal string // what a submit that failed said last
	peakRSS int64
}

// measureSmall submits the project at project (p) once to a fresh farm (coordinator on MinIO)
// of bins under dir. A refused submit is no error: code and refusal say what happened. checkSent
// checks submit's line about its upload (a build that sends files by content prints one).
func measureSmall(ctx context.Context, bins farmtest.Binaries, dir, project string, p studioProject, checkSent bool) (smallRun, error) {
	f, err := startStudioFarm(ctx, bins, dir)
	if err != nil {
		return smallRun{}, err
	}
	defer f.Close()
	r, err := runSubmit(ctx, bins.Coordinator, f.HTTP, filepath.Join(project, "shot.blend"), "--frames", "1", "--format", "exr")
	if err != nil {
		return smallRun{}, err
	}
	res := smallRun{files: p.sceneFiles(), elapsed: r.elapsed, code: r.code, peakRSS: r.peakRSS}
	if r.code != 42 && r.code != 3 {
		lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
		res.refusal = lines[len(lines)-1]
		return res, nil
	}
	if checkSent {
		up, err := parseUpload(r.stderr)
		if err != nil {
			return res, err
		}
		if up.files != p.sceneFiles() || up.sent != up.files-1 {
			return res, fmt.Errorf("submit sent %d of %d files, want %d of %d", up.sent, up.files, p.sceneFiles()-1, p.sceneFiles())
		}
	}
	return res, nil
}

// Projects of BenchmarkStudioScene: a studio shot of about 2 GB in 5,000 files, and projects of
// 1 KiB files, 10,000 (beyond the old build's 4,096) and 4,000 (within it).
var (
	studioBig    = studioProject{files: 4996, size: 400 << 10}
	studioMany   = studioProject{files: 10000, size: 1 << 10}
	studioMany4k = studioProject{files: 4000, size: 1 << 10}
)

// BenchmarkStudioScene: scenes travelling by content, all real processes (a `coordinator serve`
// on MinIO, one `tileworker`, `coordinator submit` as a CLI process). A project of 5,000 files
// of about 2 GB: the first submit (every file sent) and, after one texture changed, the second
// (that file and the manifest), both jobs rendered, the second's frame checked against
// Blender's own render; the peak resident set of the submit, the coordinator and the worker.
// Then submits of 10,000 and 4,000 files of 1 KiB each to fresh farms, and, with
// TILEFARM_OLD_BINS set, the old build's one-bundle submit of the 4,000 and its refusal of the
// 10,000.
func BenchmarkStudioScene(b *testing.B) {
	ctx, base := b.Context(), b.TempDir()
	bins, err := farmBinaries()
	if err != nil {
		b.Fatal(err)
	}
	old, haveOld, err := oldBinaries()
	if err != nil {
		b.Fatal(err)
	}
	if !haveOld {
		b.Logf("$%s is not set: the old build's one-bundle submit is not measured", EnvOldBinaries)
	}
	projects := filepath.Join(base, "projects")
	start := time.Now()
	big := makeStudioProject(b, projects, studioBig)
	many := makeStudioProject(b, projects, studioMany)
	many4k := makeStudioProject(b, projects, studioMany4k)
	b.Logf("projects made in %v", time.Since(start).Round(time.Second))

	var run studioRun
	small := map[string]smallRun{}
	for b.Loop() {
		dir, err := os.MkdirTemp(base, "studio-*")
		if err != nil {
			b.Fatal(err)
		}
		r, err := measureStudio(b, ctx, bins, dir, big, studioBig)
		if err != nil {
			b.Fatal(err)
		}
		run = r
		type smallCase struct {
			name    string
			bins    farmtest.Binaries
			project string
			p       studioProject
			old     bool
		}
		cases := []smallCase{{"", bins, many, studioMany, false}, {"", bins, many4k, studioMany4k, false}}
		if haveOld {
			cases = append(cases, smallCase{"old-", old, many4k, studioMany4k, true}, smallCase{"old-", old, many, studioMany, true})
		}
		for _, c := range cases {
			name := fmt.Sprintf("%s%dx1KiB", c.name, c.p.files)
			s, err := measureSmall(ctx, c.bins, filepath.Join(dir, name), c.project, c.p, !c.old)
			if err != nil {
				b.Fatalf("%s: %v", name, err)
			}
			switch {
			case c.old && c.p.files > oldMaxFiles:
				if s.code == 42 || s.code == 3 {
					b.Fatalf("the old build accepted %d files", s.files)
				}
				b.Logf("the old build refused %d files: exit %d: %s", s.files, s.code, s.refusal)
			case s.code != 42 && s.code != 3:
				b.Fatalf("%s: submit exited %d: %s", name, s.code, s.refusal)
			}
			small[name] = s
		}
		if err := os.RemoveAll(dir); err != nil {
			b.Fatal(err)
		}
	}
	reportStudio(b, run, small)
}

func reportStudio(r reporter, run studioRun, small map[string]smallRun) {
	const mb = 1e6
	r.ReportMetric(float64(run.files), "files")
	r.ReportMetric(float64(run.firstSent), "first-files-sent")
	r.ReportMetric(float64(run.firstBytes)/mb, "first-MB-sent")
	r.ReportMetric(run.first.Seconds(), "first-submit-s")
	r.ReportMetric(float64(run.firstBytes)/mb/run.first.Seconds(), "first-submit-MB/s")
	r.ReportMetric(float64(run.firstManifest), "first-manifest-bytes")
	r.ReportMetric(run.firstJob.Seconds(), "first-job-s")
	r.ReportMetric(float64(run.secondSent), "second-files-sent")
	r.ReportMetric(float64(run.secondBytes), "second-file-bytes")
	r.ReportMetric(float64(run.secondManifest), "second-manifest-bytes")
	r.ReportMetric(float64(run.secondBytes+run.secondManifest), "second-bytes-sent")
	r.ReportMetric(run.second.Seconds(), "second-submit-s")
	r.ReportMetric(run.maxRelDiff, "max-rel-diff")
	r.ReportMetric(float64(run.cached), "node-cache-files")
	r.ReportMetric(float64(run.submitRSS)/mb, "submit-peak-rss-MB")
	r.ReportMetric(float64(run.coordRSS)/mb, "coordinator-peak-rss-MB")
	r.ReportMetric(float64(run.workerRSS)/mb, "worker-peak-rss-MB")
	for name, s := range small {
		if s.code != 42 && s.code != 3 {
			r.ReportMetric(float64(s.code), name+"-exit-code")
			continue
		}
		r.ReportMetric(s.elapsed.Seconds(), name+"-submit-s")
		r.ReportMetric(rate(s.files, s.elapsed), name+"-files/s")
		r.ReportMetric(float64(s.peakRSS)/mb, name+"-submit-peak-rss-MB")
	}
}
