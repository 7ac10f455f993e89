package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/client"
	"github.com/tilefarm/tilefarm/internal/kinds"
	"github.com/tilefarm/tilefarm/internal/notify"
	"github.com/tilefarm/tilefarm/internal/scene"
)

// The coordinator's client commands for jobs: submit, status, watch, jobs, outputs, cancel and
// reprioritize.

func (p *program) submitCommand() *cobra.Command {
	c := newCommand("submit SCENE --frames A-B", "submit a job to a running coordinator", `
Submit SCENE to a running coordinator. Safe to re-run from cron: the same request (or the same
--idempotency-key) returns the same job and enqueues nothing new; the same key with a different
request is a conflict (exit 1).

--after JOB[,JOB...] makes the job wait: none of its frames is dispatched until those jobs
completed. --after-frames JOB waits frame by frame: frame N is dispatched once frame N of JOB
completed (a frame JOB does not have waits for all of JOB). A waiting job is "waiting" (exit
42); if a job it waits for fails or is cancelled it is "blocked" (exit 1, saying which), and
it starts if that job is retried (dlq requeue) and completes. Unknown jobs and cycles are
refused (exit 1).

Exit codes: 0 completed, 42 accepted and queued (or waiting), 3 in progress, 1 failed, blocked
or rejected, 2 usage error, 75 farm busy or unreachable (retry later).`)
	fs := c.Flags()
	fr := addFrameFlags(fs, "frames")
	rf := addRenderFlags(fs)
	kf := kinds.AddFlags(fs, false)
	format := fs.String("format", "", "output formats, comma-separated: png, png16, exr, blend (default: a .blend's own output, else png; png is always produced)")
	priority := fs.Int("priority", 0, "priority from -100 to 100: tiles of higher-priority jobs are rendered first (bands: negative, 0, positive)")
	key := fs.String("idempotency-key", "", "idempotency key (default: derived from the request)")
	project := fs.String("project", "", "project name (part of the derived idempotency key)")
	wait := fs.Bool("wait", false, "wait until the job completes or fails")
	requires := fs.StringSlice("requires", nil, "tags a worker must carry to render the job (tileworker --tags), e.g. gpu,highmem")
	build := fs.String("build", "", "render with the live workers' renderer build matching this (e.g. 3.4.1 or cycles-cpu/sse41; default: this machine's if a worker runs it, else the farm's most common)")
	maxSlots := fs.Int("max-slots", 0, "at most this many of the job's tiles render at once, so one job cannot take the whole farm (0: no limit)")
	notifyTo := fs.StringArray("notify", nil, "also post the job's events (completed, failed, cancelled) to this http(s) `URL`, signed by the farm (repeatable; the farm needs a notification secret; loopback, link-local and cloud metadata addresses only if its serve --notify-allow says so)")
	notifyFrames := fs.Bool("notify-frames", false, "send an event for each frame completed or failed too")
	after := fs.StringSlice("after", nil, "start the job only once these jobs completed (job ids, comma-separated)")
	afterFrames := fs.String("after-frames", "", "start each frame N of the job once frame N of this job completed")
	noMovie := fs.Bool("no-movie", false, "make no preview movie of the job once it completes")
	shared := fs.String("shared", "", "the studio's shared storage as this machine mounts it (`ROOT`): the scene's files under it are not uploaded; workers read them from their own mount (tileworker --shared ROOT=PATH) and check each against the hash taken here")
	p.run(c, exactArgs(1, "one SCENE"), func(ctx context.Context, pos []string, stdout, stderr io.Writer) (int, error) {
		if *maxSlots < 0 {
			return 0, usagef("--max-slots %d: want 0 (no limit) or more", *maxSlots)
		}
		if err := notify.CheckURLs(*notifyTo); err != nil {
			return 0, usagef("--notify: %v", err)
		}
		formats, err := formatList(*format)
		if err != nil {
			return 0, err
		}
		tmp, err := os.MkdirTemp("", "tilefarm-submit-")
		if err != nil {
			return 0, err
		}
		defer os.RemoveAll(tmp)
		ks := kf.Open(scene.Env{Dir: tmp, Slots: 1, Log: slog.New(slog.DiscardHandler)})
		defer ks.Close()
		req, bundle, local, err := submitRequest(ctx, pos[0], *fr, rf, "", formats, ks, stderr)
		if err != nil {
			return 0, err
		}
		req.Priority, req.IdempotencyKey, req.Project = *priority, *key, *project
		req.Requires, req.Build, req.MaxSlots, req.NoMovie = *requires, *build, *maxSlots, *noMovie
		req.Notify, req.NotifyFrames = *notifyTo, *notifyFrames
		req.After, req.AfterFrames = *after, *afterFrames
		if *shared != "" {
			if _, err := bundle.Share(*shared); err != nil {
				return 0, usagef("--shared: %v", err)
			}
			req.SceneVersion = bundle.Version()
		}
		api := p.client()
		res, err := api.SubmitAfterUpload(ctx, req, func() error {
			// The upload's progress goes to stderr even with --json: the add-on shows its lines.
			_, err := uploadScene(ctx, api, bundle, stderr, false)
			return err
		})
		if err != nil {
			return 0, err
		}
		st := res.Status
		for _, n := range res.Notes {
			fmt.Fprintf(stderr, "%s: %s\n", filepath.Base(pos[0]), n)
		}
		if local.Build != "" && st.Build != local.Build {
			fmt.Fprintf(stderr, "%s: renders with the farm's %s (this machine runs %s)\n", filepath.Base(pos[0]), st.Build, local.Build)
		}
		before := st.TilesCompleted
		if *wait {
			if st, err = waitJob(ctx, api, st.JobID, newProgress(stderr, p.jsonOut), nil); err != nil {
				return 0, err
			}
		}
		countReuse(&st, before)
		printStatus(stdout, st, p.jsonOut)
		return st.State.ExitCode(), nil
	})
	return c
}

func (p *program) statusCommand() *cobra.Command {
	return p.jobCommand("status JOB", "where a job stands (exit 0 done, 42 queued, 3 running, 1 failed or cancelled)", `
Show where JOB stands: frames, tiles, samples, the estimated time left, failures, and what it
waits for. Exit codes: 0 completed, 42 queued or waiting for other jobs, 3 in progress, 1
failed, blocked (a job it waits for failed or was cancelled: named) or cancelled (the failing
frames and tiles are named), 2 usage error, 75 coordinator unreachable.`,
		func(ctx context.Context, api *client.Client, job string) (api.Status, error) {
			return api.Status(ctx, job)
		})
}

func (p *program) watchCommand() *cobra.Command {
	return p.jobCommand("watch JOB", "follow a job with a progress bar until it ends", `
Follow JOB with a progress bar until it completes, fails, is blocked or cancelled, then print
its status. A job waiting for other jobs is followed while it waits. Exits like status: 0
completed, 1 failed, blocked or cancelled, 75 coordinator unreachable, 130 interrupted.`,
		func(ctx context.Context, api *client.Client, job string) (api.Status, error) {
			return waitJob(ctx, api, job, newProgress(p.stderr, false), nil)
		})
}

func (p *program) jobsCommand() *cobra.Command {
	c := newCommand("jobs", "list jobs", "List every job, oldest first, with what a waiting job waits for and why a blocked one is.")
	p.runErr(c, noArgs, func(ctx context.Context, _ []string, stdout, stderr io.Writer) error {
		jobs, err := p.client().Jobs(ctx)
		if err != nil {
			return err
		}
		if p.jsonOut {
			if jobs == nil {
				jobs = []api.Status{}
			}
			return writeJSON(stdout, jobs)
		}
		tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "JOB\tSTATE\tPRIORITY\tSCENE\tFRAMES\tDONE\tTILES\tETA\tWAITING FOR")
		for _, j := range jobs {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d-%d\t%d/%d\t%d/%d\t%s\t%s\n", j.JobID, j.State, j.Priority, j.Scene, j.FirstFrame, j.LastFrame,
				j.FramesCompleted, j.FramesTotal, j.TilesCompleted, j.TilesTotal, eta(j), waitsFor(j))
		}
		return tw.Flush()
	})
	return c
}

// waitsFor is the jobs list's last column: why a blocked job is, what a waiting one waits for.
func waitsFor(st api.Status) string {
	switch {
	case st.BlockedReason != "":
		return "blocked: " + st.BlockedReason
	case st.WaitingFor != "":
		return st.WaitingFor
	}
	return "-"
}

func (p *program) outputsCommand() *cobra.Command {
	c := newCommand("outputs JOB --out PATTERN | --movie PATH", "download a job's finished frames or its preview movie", `
Download the finished frames of JOB, verified against their manifests, into files named by
PATTERN ('####' is the zero-padded frame number). Frames not finished yet are skipped and listed.
A .blend's own output (format blend, the default for a job that asked for it) is written as
Blender names it, under --dir as if it were the .blend's directory (or at --out, taken as
Blender's -o takes it), with its File Output nodes' files under --dir. Nothing of the scene's
is written outside --dir: an output path that leaves it (//../) or is absolute is refused
(exit 1) before any frame is written; give --out to say where those frames go. --movie writes
the job's preview movie (a WebM, the extension added when PATH has none), alone or with the
frames; while it is not ready the command exits 3, and 1 if it failed or the job has none.`)
	fs := c.Flags()
	out := fs.String("out", "", "output path pattern, e.g. out/shot_####.png (for a .blend's own output, default its own path)")
	format := fs.String("format", "", "png, png16, exr or blend (default: blend if the job asked for it, else from --out's extension; png16/exr only if submitted with it)")
	dir := fs.String("dir", ".", "the directory a .blend's own output paths and File Output files are written under, as if it were the .blend's")
	movie := fs.String("movie", "", "write the job's preview movie to this path (.webm added when it has no extension)")
	p.runErr(c, exactArgs(1, "one JOB"), func(ctx context.Context, pos []string, stdout, stderr io.Writer) error {
		if err := checkFormat(*format); err != nil {
			return err
		}
		api := p.client()
		st, err := api.Status(ctx, pos[0])
		if err != nil {
			return err
		}
		if *movie != "" {
			path, err := moviePath(*movie)
			if err != nil {
				return err
			}
			if err := writeMovie(ctx, api, st, path); err != nil {
				return err
			}
			fmt.Fprintln(stdout, path)
			if *out == "" && *format == "" {
				return nil // the movie alone
			}
		}
		f := *format
		switch {
		case f != "":
		case slices.Contains(st.Formats, formatBlend):
			f = formatBlend
		case strings.EqualFold(filepath.Ext(*out), ".exr"):
			f = "exr"
		default:
			f = "png"
		}
		if *out != "" || f != formatBlend {
			if err := checkPattern(outPattern(*out, f), st.FirstFrame, st.LastFrame); err != nil {
				return err
			}
		}
		if err := writeOutputs(ctx, api, &st, outputDest{Pattern: outPattern(*out, f), Base: *dir, Confined: true}, f); err != nil {
			return err
		}
		if p.jsonOut {
			if err := writeJSON(stdout, map[string]any{"job_id": st.JobID, "outputs": st.Outputs}); err != nil {
				return err
			}
		} else {
			for _, o := range st.Outputs {
				fmt.Fprintln(stdout, o)
			}
		}
		if missing := st.FramesTotal - len(st.Outputs); missing > 0 {
			return fmt.Errorf("%d of %d frames are not finished yet (job is %s)", missing, st.FramesTotal, st.State)
		}
		return nil
	})
	return c
}

func (p *program) cancelCommand() *cobra.Command {
	return p.jobCommand("cancel JOB", "stop rendering a job's tiles", `
Cancel JOB: no further tile of it is rendered (workers drop its tiles before leasing them and
between passes), frames another job also asked for keep rendering for that job, and nothing is
half-published. Prints the job's status; exit 1 (cancelled), or 1 with a message when the job
had already finished.`,
		func(ctx context.Context, api *client.Client, job string) (api.Status, error) {
			return api.Cancel(ctx, job)
		})
}

// jobCommand is status, watch and cancel: one JOB argument, a status obtained by get, printed,
// and the job's state as the exit code.
func (p *program) jobCommand(use, short, long string, get func(ctx context.Context, api *client.Client, job string) (api.Status, error)) *cobra.Command {
	c := newCommand(use, short, long)
	p.run(c, exactArgs(1, "one JOB"), func(ctx context.Context, pos []string, stdout, stderr io.Writer) (int, error) {
		st, err := get(ctx, p.client(), pos[0])
		if err != nil {
			if isNotFound(err) {
				return 0, fmt.Errorf("no job %q", pos[0])
			}
			return 0, err
		}
		printStatus(stdout, st, p.jsonOut)
		return st.State.ExitCode(), nil
	})
	return c
}

func (p *program) reprioritizeCommand() *cobra.Command {
	c := newCommand("reprioritize JOB PRIORITY", "change the priority of a job's tiles not started yet", `
Give JOB a new priority (-100 to 100; higher renders first). Tiles of the job not yet started
are dispatched in their new band; tiles already rendering finish where they are.`)
	p.run(c, exactArgs(2, "JOB and PRIORITY"), func(ctx context.Context, pos []string, stdout, stderr io.Writer) (int, error) {
		prio, err := strconv.Atoi(pos[1])
		if err != nil {
			return 0, usagef("priority %q: want an integer from %d to %d", pos[1], api.MinPriority, api.MaxPriority)
		}
		st, err := p.client().Reprioritize(ctx, pos[0], prio)
		if err != nil {
			if isNotFound(err) {
				return 0, fmt.Errorf("no job %q", pos[0])
			}
			return 0, err
		}
		printStatus(stdout, st, p.jsonOut)
		return api.ExitOK, nil
	})
	return c
}
