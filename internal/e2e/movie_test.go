//go:build linux

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
)

// ffprobe finds ffprobe, the tests' reader of preview movies: installed with ffmpeg (test.sh),
// never skipped.
func ffprobe(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("ffprobe")
	if err != nil {
		t.Fatal("no ffprobe for the movie tests: install ffmpeg (apt-get install ffmpeg, or run ./test.sh)")
	}
	return p
}

// probeMovie says what ffprobe counts in a movie file: "codec,width,height,frames".
func probeMovie(t *testing.T, path string) string {
	t.Helper()
	out, err := exec.Command(ffprobe(t), "-v", "error", "-count_frames", "-select_streams", "v:0",
		"-show_entries", "stream=codec_name,width,height,nb_read_frames", "-of", "csv=p=0", path).CombinedOutput()
	if err != nil {
		t.Fatalf("ffprobe %s: %v\n%s", path, err, out)
	}
	return strings.TrimSpace(string(out))
}

// waitMovie polls the job's status until its movie is in state want, failing on any other
// final state.
func (f *farmProc) waitMovie(job string, want api.MovieState, d time.Duration) api.Status {
	f.t.Helper()
	deadline := time.Now().Add(d)
	for {
		st := apiStatus(f.t, f, job)
		switch st.Movie.State {
		case want:
			return st
		case api.MoviePending:
		default:
			f.t.Fatalf("job %s's movie is %s (%s), want %s", job, st.Movie.State, st.Movie.Reason, want)
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("job %s's movie still %s after %v (job %s): %s", job, st.Movie.State, d, st.State, st.Movie.Reason)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// The preview movie of a 24-frame job: once the job completes a worker encodes it, `outputs
// --movie` writes it (the extension added) and ffprobe counts 24 frames at the job's
// resolution; the job's page plays it, its video reporting about a second (24 frames at 24
// fps), and nothing on the page fails.
func TestMovieOfA24FrameJob(t *testing.T) {
	t.Parallel()
	f := startServe(t, t.TempDir())
	w := f.worker("w", t.TempDir(), "--concurrency", "2")
	began := time.Now()
	st, r := f.submit(example("shot"), "--frames", "1-24", "--width", "64", "--height", "36", "--spp", "1", "--tile", "64")
	if r.code != 42 {
		t.Fatalf("submit: %s", r)
	}
	if done := f.waitDone(st.JobID, 2*time.Minute); done.State != api.JobCompleted {
		t.Fatalf("job: %+v", done)
	}
	ready := f.waitMovie(st.JobID, api.MovieReady, time.Minute)
	t.Logf("24 frames rendered and their movie encoded in %v", time.Since(began).Round(time.Millisecond))
	if ready.Movie.URL != "/v1/jobs/"+st.JobID+"/movie" {
		t.Fatalf("ready movie at %q", ready.Movie.URL)
	}
	if !strings.Contains(w.Log(), `msg="movie encoded"`) || !strings.Contains(w.Log(), "frames=24") {
		t.Fatalf("the worker did not log the movie's encoding at info:\n%s", w.Log())
	}

	out := filepath.Join(t.TempDir(), "movies", "preview")
	r = f.cli("outputs", st.JobID, "--movie", out)
	if r.code != 0 || strings.TrimSpace(r.stdout) != out+".webm" {
		t.Fatalf("outputs --movie: %s", r)
	}
	if got := probeMovie(t, out+".webm"); got != "vp9,64,36,24" {
		t.Fatalf("ffprobe says %q of the movie, want vp9,64,36,24: 24 frames at the job's 64x36", got)
	}

	b := newBrowser(t, "http://"+f.HTTP)
	b.open()
	b.route("#/jobs/" + st.JobID)
	b.waitTrue(`document.querySelector('#movie video')?.readyState >= 1`, 30*time.Second)
	dur := eval[float64](b, `document.querySelector('#movie video').duration`)
	if dur < 0.9 || dur > 1.1 {
		t.Fatalf("the job page's video reports a duration of %v s, want about 1 s (24 frames at 24 fps)", dur)
	}
	if size := eval[string](b, `(v => v.videoWidth + 'x' + v.videoHeight)(document.querySelector('#movie video'))`); size != "64x36" {
		t.Fatalf("the video plays at %s, want 64x36", size)
	}
	b.screenshot("job-movie")
	b.clean(false)
}

// A job submitted with --no-movie completes with no movie: its status says skipped and why,
// `outputs --movie` exits 1 saying so, and no movie is promoted.
func TestMovieSkippedWithNoMovie(t *testing.T) {
	t.Parallel() // its own farm on free ports; most of its time is waiting
	data := t.TempDir()
	f := startServe(t, data)
	f.worker("w", t.TempDir())
	st, r := f.submit(append([]string{example("shot"), "--frames", "1-2", "--no-movie"}, small...)...)
	if r.code != 42 {
		t.Fatalf("submit: %s", r)
	}
	done := f.waitDone(st.JobID, 2*time.Minute)
	if done.State != api.JobCompleted || done.Movie.State != api.MovieSkipped || !strings.Contains(done.Movie.Reason, "--no-movie") {
		t.Fatalf("job submitted with --no-movie: %s, movie %+v", done.State, done.Movie)
	}
	r = f.cli("outputs", st.JobID, "--movie", filepath.Join(t.TempDir(), "m"))
	if r.code != 1 || !strings.Contains(r.stderr, "no preview movie") {
		t.Fatalf("outputs --movie of a job without one: %s", r)
	}
	// Give a worker time to encode one, were one asked for: none may be promoted.
	time.Sleep(2 * time.Second)
	if _, err := os.Stat(filepath.Join(data, "store", "manifests", "movies")); !os.IsNotExist(err) {
		t.Fatalf("a movie was promoted for a job submitted with --no-movie (%v)", err)
	}
}

// A worker without ffmpeg fails the movie terminally, saying how to install ffmpeg, while the
// job stays completed (status exits 0); `outputs --movie` exits 1 with the reason. Once the
// farm's worker has ffmpeg, requeueing the movie's dead letter makes it.
func TestMovieWithoutFFmpegLeavesTheJobCompleted(t *testing.T) {
	t.Parallel() // its own farm on free ports; most of its time is waiting
	f := startServe(t, t.TempDir())
	noPath := t.TempDir() // a PATH without ffmpeg
	bare := startEnv(t, []string{"PATH=" + noPath, "TILEFARM_FFMPEG="}, "tileworker", "--nats", f.NATSURL(), "--store", f.StoreURL(),
		"--checkpoints", t.TempDir(), "--name", "w-no-ffmpeg", "--log-level", "debug")
	st, r := f.submit(append([]string{example("shot"), "--frames", "1-2"}, small...)...)
	if r.code != 42 {
		t.Fatalf("submit: %s", r)
	}
	if done := f.waitDone(st.JobID, 2*time.Minute); done.State != api.JobCompleted {
		t.Fatalf("job: %+v", done)
	}
	failed := f.waitMovie(st.JobID, api.MovieFailed, time.Minute)
	if failed.State != api.JobCompleted || !strings.Contains(failed.Movie.Reason, "apt-get install ffmpeg") {
		t.Fatalf("status after the movie failed: %s, movie %+v", failed.State, failed.Movie)
	}
	if _, r := f.status(st.JobID); r.code != 0 || !strings.Contains(f.cli("status", st.JobID).stdout, "movie failed") {
		t.Fatalf("status of the completed job whose movie failed: %s", r)
	}
	r = f.cli("outputs", st.JobID, "--movie", filepath.Join(t.TempDir(), "m"))
	if r.code != 1 || !strings.Contains(r.stderr, "apt-get install ffmpeg") {
		t.Fatalf("outputs --movie of a failed movie: %s", r)
	}

	dlq := f.deadLetters()
	seq := ""
	for _, line := range strings.Split(dlq, "\n") {
		if strings.Contains(line, "needs ffmpeg") {
			seq = strings.Fields(line)[0]
		}
	}
	if _, err := strconv.Atoi(seq); err != nil {
		t.Fatalf("no dead letter of the movie saying it needs ffmpeg:\n%s", dlq)
	}
	// ffmpeg installed: the worker without it stops, one with it starts.
	bare.Signal(syscall.SIGTERM)
	if !bare.WaitExit(30 * time.Second) {
		t.Fatal("the worker without ffmpeg did not stop on SIGTERM")
	}
	f.worker("w-ffmpeg", t.TempDir())
	if r := f.cli("dlq", "requeue", seq); r.code != 0 {
		t.Fatalf("dlq requeue %s: %s", seq, r)
	}
	f.waitMovie(st.JobID, api.MovieReady, time.Minute)
	out := filepath.Join(t.TempDir(), "m.webm")
	if r := f.cli("outputs", st.JobID, "--movie", out); r.code != 0 {
		t.Fatalf("outputs --movie after the requeue: %s", r)
	}
	if got := probeMovie(t, out); got != fmt.Sprintf("vp9,%s,%s,2", small[1], small[3]) {
		t.Fatalf("ffprobe says %q of the movie made after the requeue", got)
	}
}
