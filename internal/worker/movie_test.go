package worker

import (
	"bytes"
	"encoding/json"
	"image"
	"image/color"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/wire"
)

// ffmpegTool finds ffmpeg or ffprobe for a test: the movie is tested with the real ones, never
// skipped.
func ffmpegTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("no %s for the movie tests: install it (apt-get install ffmpeg, or run ./test.sh)", name)
	}
	return p
}

// movieColors are the frames of the movie tests, one solid colour each, in frame order.
var movieColors = []color.RGBA{{R: 250, A: 255}, {G: 250, A: 255}, {B: 250, A: 255}}

// movieJob promotes the PNG outputs of frames 1-3 of a 33x17 job, one colour each, as
// assemblies would, and returns the movie job of that job.
func (h *runHarness) movieJob(t *testing.T) wire.MovieJob {
	t.Helper()
	job := wire.MovieJob{Kind: wire.KindMovie, JobID: "job-0123456789abcdef01234567", SceneVersion: h.bundle.Version(),
		Camera: h.st.Camera, SettingsHash: identity.SettingsHash(h.st), First: 1, Last: 3, Width: 33, Height: 17, FPS: 24}
	for i, c := range movieColors {
		img := image.NewRGBA(image.Rect(0, 0, job.Width, job.Height))
		for y := range job.Height {
			for x := range job.Width {
				img.SetRGBA(x, y, c)
			}
		}
		var buf bytes.Buffer
		if err := png.Encode(&buf, img); err != nil {
			t.Fatal(err)
		}
		fk := identity.FrameKey(job.SceneVersion, job.Camera, i+1, job.SettingsHash)
		if _, err := finalize.Promote(h.ctx, h.objects, layout.FrameManifestKey(fk, "png"), "a1", identity.BuildFingerprint(),
			[]finalize.Output{{Name: "frame.png", Data: buf.Bytes()}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	return job
}

// deliverMovie publishes job on the assembly subject, as the relay does, and has w handle it.
func (h *runHarness) deliverMovie(t *testing.T, w *Worker, job wire.MovieJob) {
	t.Helper()
	data, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.queue.Publish(h.ctx, queue.SubjectAssemble, "movie:"+job.JobID, data, nil); err != nil {
		t.Fatal(err)
	}
	msg, err := h.queue.Sources(queue.Capabilities{}).FetchAssembly(h.ctx, 2*time.Second)
	if err != nil || msg == nil {
		t.Fatalf("FetchAssembly = %v, %v", msg, err)
	}
	w.handle(h.ctx, msg)
}

// A worker encodes a job's frames, in frame order, at the job's size (odd sizes too) into a
// VP9 WebM that ffprobe reads as one frame per frame of the job, promotes it under its
// manifest and says so with movie.ready; encoding the same frames again gives the same bytes.
func TestMovieRunEncodesTheJobsFrames(t *testing.T) {
	ffmpegTool(t, "ffmpeg")
	ffprobe := ffmpegTool(t, "ffprobe")
	h := newRunHarness(t)
	w, _ := h.worker(t, Config{})
	job := h.movieJob(t)
	h.deliverMovie(t, w, job)

	m, err := finalize.ReadManifest(h.ctx, h.objects, layout.MovieKey(job.JobID))
	if err != nil {
		t.Fatalf("no movie manifest: %v\nworker log:\n%s", err, h.logs)
	}
	movie, err := finalize.ReadObject(h.ctx, h.objects, m, layout.MovieName)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "movie.webm")
	if err := os.WriteFile(path, movie, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(ffprobe, "-v", "error", "-count_frames", "-select_streams", "v:0",
		"-show_entries", "stream=codec_name,width,height,nb_read_frames,r_frame_rate", "-of", "csv=p=0", path).Output()
	if err != nil {
		t.Fatalf("ffprobe: %v", err)
	}
	if got := strings.TrimSpace(string(out)); got != "vp9,33,17,24/1,3" {
		t.Fatalf("ffprobe says %q, want vp9,33,17,24/1,3", got)
	}
	// The frames come out in frame order: each one's middle pixel is its frame's colour.
	raw, err := exec.Command(ffmpegTool(t, "ffmpeg"), "-v", "error", "-i", path, "-f", "rawvideo", "-pix_fmt", "rgb24", "-").Output()
	if err != nil || len(raw) != 3*33*17*3 {
		t.Fatalf("decoding the movie: %d bytes, %v", len(raw), err)
	}
	for i, c := range movieColors {
		px := raw[i*33*17*3+(8*33+16)*3:]
		if d := max(absDiff(px[0], c.R), absDiff(px[1], c.G), absDiff(px[2], c.B)); d > 24 {
			t.Errorf("frame %d's middle pixel is %v, want about %v", i+1, px[:3], c)
		}
	}
	var ready []wire.Event
	for _, ev := range h.events(t) {
		if ev.Type == wire.EventMovieReady && ev.JobID == job.JobID {
			ready = append(ready, ev)
		}
	}
	if len(ready) != 1 {
		t.Fatalf("movie.ready events: %+v, want one", ready)
	}
	if !strings.Contains(h.logs.String(), `msg="movie encoded"`) || !strings.Contains(h.logs.String(), "frames=3") {
		t.Fatalf("the worker did not log the encoding:\n%s", h.logs)
	}
	// The same frames encode to the same bytes, so a second promotion would be idempotent.
	again := &movieRun{delivery: &delivery{log: w.log}, w: w, job: job}
	data, frames, err := again.encode(h.ctx, ffmpegTool(t, "ffmpeg"))
	if err != nil || frames != 3 || !bytes.Equal(data, movie) {
		t.Fatalf("encoding again: %d frames, %d bytes (promoted %d), equal %v, %v", frames, len(data), len(movie), bytes.Equal(data, movie), err)
	}
}

func absDiff(a, b uint8) uint8 {
	if a > b {
		return a - b
	}
	return b - a
}

// A worker without ffmpeg fails the movie terminally, at once: its dead letter and its
// movie.failed say how to install it, and nothing is promoted.
func TestMovieRunWithoutFFmpegSaysHowToInstallIt(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv(EnvFFmpeg, "")
	h := newRunHarness(t)
	w, _ := h.worker(t, Config{})
	job := h.movieJob(t)
	h.deliverMovie(t, w, job)

	dls, err := h.queue.ListDeadLetters(h.ctx)
	if err != nil || len(dls) != 1 {
		t.Fatalf("dead letters %+v, %v: want the movie's", dls, err)
	}
	for _, want := range []string{"needs ffmpeg", "apt-get install ffmpeg", "--ffmpeg", EnvFFmpeg} {
		if !strings.Contains(dls[0].Reason, want) {
			t.Errorf("dead letter's reason %q does not say %q", dls[0].Reason, want)
		}
	}
	var failed []wire.Event
	for _, ev := range h.events(t) {
		if ev.Type == wire.EventMovieFailed {
			failed = append(failed, ev)
		}
	}
	if len(failed) != 1 || !failed[0].Terminal || failed[0].JobID != job.JobID || !strings.Contains(failed[0].Error, "apt-get install ffmpeg") {
		t.Fatalf("movie.failed events: %+v, want one, terminal, saying how to install ffmpeg", failed)
	}
	if ok, err := finalize.ManifestExists(h.ctx, h.objects, layout.MovieKey(job.JobID)); ok || err != nil {
		t.Fatalf("a movie manifest exists (%v, %v)", ok, err)
	}
	// Named by the flag and missing, the error names the flag's path.
	w2, _ := h.worker(t, Config{FFmpeg: "/nonexistent/ffmpeg"})
	if _, err := w2.ffmpeg(); err == nil || !strings.Contains(err.Error(), "/nonexistent/ffmpeg, from tileworker --ffmpeg") {
		t.Fatalf("ffmpeg named by the flag and missing: %v", err)
	}
}

// A movie keeps the job's size up to MovieMaxSize on its longer side, then keeps its aspect.
func TestMovieSize(t *testing.T) {
	for _, c := range []struct{ w, h, ww, wh int }{
		{96, 54, 96, 54}, {33, 17, 33, 17}, {1280, 720, 1280, 720}, {1920, 1080, 1280, 720},
		{1080, 1920, 720, 1280}, {4096, 1, 1280, 1}, {2000, 2000, 1280, 1280},
	} {
		if w, h := movieSize(c.w, c.h); w != c.ww || h != c.wh {
			t.Errorf("movieSize(%d, %d) = %dx%d, want %dx%d", c.w, c.h, w, h, c.ww, c.wh)
		}
	}
}
