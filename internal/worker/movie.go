package worker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/internal/failure"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/internal/wire"
	"github.com/tilefarm/tilefarm/objstore"
)

// EnvFFmpeg names the ffmpeg a worker encodes preview movies with when its Config names none
// (tileworker --ffmpeg); without either, ffmpeg is looked for on the PATH.
const EnvFFmpeg = "TILEFARM_FFMPEG"

// MovieMaxSize caps the longer side of a preview movie, in pixels: a job's frames are encoded
// at their own resolution up to it, and scaled down to it, keeping their aspect, beyond.
const MovieMaxSize = 1280

// movieRun is one delivery of a movie job: the preview movie of a completed job encoded from
// its frames' PNG outputs and promoted like a frame output (docs/design.md, "Preview movie").
// Like an assembly it needs no lease: whoever promotes first wins, and a racing encoder finds
// the manifest.
type movieRun struct {
	*delivery
	w   *Worker
	job wire.MovieJob
}

var _ run = (*movieRun)(nil)

// newMovieRun prepares the run of a movie delivery.
func (w *Worker) newMovieRun(d *delivery, job wire.MovieJob) *movieRun {
	d.log = d.log.With("job_id", job.JobID)
	return &movieRun{delivery: d, w: w, job: job}
}

// blocklistJob is none: a movie's failure is the movie's, not a reason to stop rendering a job.
func (m *movieRun) blocklistJob() string { return "" }

// failureEvent is movie.failed about this job's movie.
func (m *movieRun) failureEvent(ev wire.Event) wire.Event {
	ev.Type, ev.JobID = wire.EventMovieFailed, m.job.JobID
	return ev
}

// promoted reports whether the movie's manifest exists.
func (m *movieRun) promoted(ctx context.Context) (bool, error) {
	return finalize.ManifestExists(ctx, m.w.objects, layout.MovieKey(m.job.JobID))
}

// completePromoted announces the movie found promoted and acks.
func (m *movieRun) completePromoted(ctx context.Context) error { return m.ready(ctx, true) }

// perform encodes the movie unless it is promoted already, promotes it and announces it.
func (m *movieRun) perform(ctx context.Context) error {
	w, job := m.w, m.job
	// Reading every frame and encoding them can outlast the ack-wait: keep the message alive.
	hb := w.startHeartbeat(ctx, m.msg, nil, m.log)
	defer hb.stop()
	var done bool
	if err := w.retryStore(ctx, m.delivery, "checking the movie's manifest", func(ctx context.Context) (err error) {
		done, err = m.promoted(ctx)
		return err
	}); err != nil {
		return err
	}
	if done {
		w.m.DuplicatesSuppressed.WithLabelValues(metrics.LayerManifestCheck).Inc()
		return m.ready(ctx, true)
	}
	ffmpeg, err := w.ffmpeg()
	if err != nil {
		return err
	}
	began := time.Now()
	data, frames, err := m.encode(ctx, ffmpeg)
	if err != nil {
		return err
	}
	width, height := movieSize(job.Width, job.Height)
	opts := []finalize.PromoteOption{finalize.Absent()} // the manifest was missing just now
	var p finalize.Promotion
	err = w.retryStore(ctx, m.delivery, "promoting the movie", func(ctx context.Context) (err error) {
		p, err = finalize.Promote(ctx, w.objects, layout.MovieKey(job.JobID), m.attempt, identity.BuildFingerprint(),
			[]finalize.Output{{Name: layout.MovieName, Data: data}},
			map[string]string{"job_id": job.JobID, "frames": strconv.Itoa(frames), "fps": strconv.Itoa(job.FPS),
				"size": fmt.Sprintf("%dx%d", width, height), "worker": w.cfg.Name}, opts...)
		opts = nil // a retry reads the manifest first, and may find its own promotion
		return err
	})
	switch {
	case errors.Is(err, finalize.ErrConflict):
		// Another worker's encoder (another ffmpeg build) promoted its movie first: a preview
		// is not a frame, and the first one stands.
		m.log.Info("another worker promoted the movie first; keeping theirs", "err", err)
	case err != nil:
		w.m.FinalizeFailures.Inc()
		return err
	case p.Existing:
		w.m.DuplicatesSuppressed.WithLabelValues(metrics.LayerManifestExisting).Inc()
	}
	m.log.Info("movie encoded", "frames", frames, "seconds", time.Since(began).Seconds(), "bytes", len(data),
		"width", width, "height", height, "fps", job.FPS)
	return m.ready(ctx, false)
}

// ready announces the movie promoted (retrying a NATS outage in place) and acks; the
// coordinator checks the claim against the manifest.
func (m *movieRun) ready(ctx context.Context, duplicate bool) error {
	ev := wire.Event{ID: wire.EventMovieReady + ":" + m.job.JobID, Type: wire.EventMovieReady, JobID: m.job.JobID, Duplicate: duplicate}
	return m.w.announce(ctx, m.delivery, "movie", ev)
}

// ffmpeg finds the ffmpeg to encode with: the Config's, else EnvFFmpeg's, else the PATH's. A
// worker without one fails the movie terminally, saying how to install it: retrying on the
// same machine cannot help, and the movie's dead letter can be requeued once it is installed.
func (w *Worker) ffmpeg() (string, error) {
	name, from := w.cfg.FFmpeg, "tileworker --ffmpeg"
	if name == "" {
		name, from = os.Getenv(EnvFFmpeg), EnvFFmpeg
	}
	if name == "" {
		name, from = "ffmpeg", "the PATH"
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", failure.Terminalf("encoding the preview movie needs ffmpeg, and worker %s has none (%s, from %s, is not found: %w): "+
			"install it (apt-get install ffmpeg) or name it with tileworker --ffmpeg PATH or %s, then requeue the movie with coordinator dlq requeue",
			w.cfg.Name, name, from, err, EnvFFmpeg)
	}
	return p, nil
}

// movieSize is the size a w x h job's movie is encoded at: its own, unless its longer side
// exceeds MovieMaxSize, then scaled down to it, keeping the aspect.
func movieSize(w, h int) (int, int) {
	long := max(w, h)
	if long <= MovieMaxSize {
		return w, h
	}
	scale := func(v int) int { return max(1, (v*MovieMaxSize+long/2)/long) }
	return scale(w), scale(h)
}

// ffmpegArgs are ffmpeg's arguments to encode PNGs read from its standard input, at fps, into
// a VP9 WebM at out, scaled to width x height when that is not the frames' own w x h. The
// encoding is bit-exact (no version or time in the file, fixed threads) so two encodings of the
// same frames by the same ffmpeg promote the same bytes.
func ffmpegArgs(w, h, width, height, fps int, out string) []string {
	args := []string{"-hide_banner", "-nostats", "-loglevel", "error",
		"-f", "image2pipe", "-framerate", strconv.Itoa(fps), "-c:v", "png", "-i", "pipe:0"}
	if width != w || height != h {
		args = append(args, "-vf", fmt.Sprintf("scale=%d:%d:flags=lanczos", width, height))
	}
	return append(args, "-c:v", "libvpx-vp9", "-pix_fmt", "yuv420p", "-b:v", "0", "-crf", "32",
		"-deadline", "good", "-cpu-used", "4", "-row-mt", "1", "-threads", "2",
		"-fflags", "+bitexact", "-flags:v", "+bitexact", "-map_metadata", "-1", "-f", "webm", "-y", out)
}

// encode pipes the job's frames' PNG outputs, in frame order, into ffmpeg and returns the movie
// and how many frames it holds.
func (m *movieRun) encode(ctx context.Context, ffmpeg string) ([]byte, int, error) {
	job := m.job
	if job.FPS <= 0 || job.Width <= 0 || job.Height <= 0 || job.Last < job.First {
		return nil, 0, failure.Terminalf("movie job of %s: %d fps, %dx%d, frames %d-%d", job.JobID, job.FPS, job.Width, job.Height, job.First, job.Last)
	}
	tmp, err := os.MkdirTemp("", "tilefarm-movie-")
	if err != nil {
		return nil, 0, fmt.Errorf("encoding the movie: %w", err)
	}
	defer os.RemoveAll(tmp)
	out := filepath.Join(tmp, layout.MovieName)
	width, height := movieSize(job.Width, job.Height)
	cmd := exec.CommandContext(ctx, ffmpeg, ffmpegArgs(job.Width, job.Height, width, height, job.FPS, out)...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, 0, fmt.Errorf("encoding the movie: %w", err)
	}
	var stderr tail
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, 0, failure.Terminalf("starting %s: %w", ffmpeg, err)
	}
	frames, feedErr := m.feed(ctx, stdin)
	stdin.Close()
	waitErr := cmd.Wait()
	switch {
	case waitErr != nil && (feedErr == nil || isPipeError(feedErr)):
		// ffmpeg failed, and stopped reading if it did before the last frame: its words say why.
		return nil, 0, fmt.Errorf("%s failed encoding %d frames: %w: %s", ffmpeg, frames, waitErr, bytes.TrimSpace(stderr.b))
	case feedErr != nil:
		return nil, 0, feedErr // a frame could not be read: ffmpeg saw part of the movie
	}
	data, err := os.ReadFile(out)
	if err != nil {
		return nil, 0, fmt.Errorf("reading the encoded movie: %w", err)
	}
	return data, frames, nil
}

// feed writes every frame's PNG output to ffmpeg's standard input, in frame order, each read
// through its manifest and verified.
func (m *movieRun) feed(ctx context.Context, stdin io.Writer) (int, error) {
	job, w := m.job, m.w
	name, _ := layout.FrameOutputName("png")
	frames := 0
	for n := job.First; n <= job.Last; n += max(job.Step, 1) {
		fk := identity.FrameKey(job.SceneVersion, job.Camera, n, job.SettingsHash)
		var png []byte
		err := w.retryStore(ctx, m.delivery, "reading a frame", func(ctx context.Context) error {
			man, err := finalize.ReadManifest(ctx, w.objects, layout.FrameManifestKey(fk, "png"))
			if err != nil {
				return err
			}
			png, err = finalize.ReadObject(ctx, w.objects, man, name)
			return err
		})
		if errors.Is(err, objstore.ErrNotFound) {
			return frames, failure.Terminalf("frame %d of job %s has no png output in the store: %w", n, job.JobID, err)
		}
		if err != nil {
			return frames, fmt.Errorf("reading frame %d: %w", n, err)
		}
		if _, err := stdin.Write(png); err != nil {
			return frames, fmt.Errorf("writing frame %d to ffmpeg: %w", n, err)
		}
		frames++
	}
	return frames, nil
}

// isPipeError reports whether err is a write to a pipe whose reader is gone: ffmpeg exited
// first, and its own error says why.
func isPipeError(err error) bool {
	return errors.Is(err, syscall.EPIPE) || errors.Is(err, os.ErrClosed) || errors.Is(err, io.ErrClosedPipe)
}

// tail keeps the last tailMax bytes written to it: the end of ffmpeg's error output.
type tail struct{ b []byte }

const tailMax = 2048

func (t *tail) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > tailMax {
		t.b = t.b[len(t.b)-tailMax:]
	}
	return len(p), nil
}
