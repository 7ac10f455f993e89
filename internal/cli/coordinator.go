package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/client"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/render"
)

// The coordinator command's root, and what its command groups share: the API client, the
// submission render and submit build, a job's status as the commands print it, and --json.

// Coordinator runs the coordinator command with args (without the program name).
func Coordinator(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	p := &program{ctx: ctx, stdout: stdout, stderr: stderr}
	return p.execute(p.coordinatorRoot(), args)
}

// coordinatorRoot is the coordinator's command tree.
func (p *program) coordinatorRoot() *cobra.Command {
	root := newCommand("coordinator", "tilefarm's coordinator", `
tilefarm coordinator: splits frames into tile jobs on NATS JetStream and tracks every frame.

Exit codes: 0 completed, 42 accepted/queued, 3 in progress, 1 failed or cancelled, 2 usage
error, 75 busy or unreachable (retry), 130 interrupted.`)
	root.RunE = func(c *cobra.Command, pos []string) error {
		if len(pos) == 0 {
			fmt.Fprint(p.stderr, c.UsageString())
			return usagef("no command given")
		}
		return usagef("unknown command %q", pos[0])
	}
	root.Args = cobra.ArbitraryArgs
	// "coordinator frobnicate --data x" is an unknown command, whatever flags follow it.
	root.FParseErrWhitelist.UnknownFlags = true
	pf := root.PersistentFlags()
	pf.BoolVar(&p.jsonOut, "json", false, "print one JSON value on stdout (read commands; shapes in docs/operations.md)")
	pf.StringVar(&p.logFormat, "log-format", os.Getenv(envLogFormat), "log format: text or json (default json unless stderr is a terminal; env "+envLogFormat+")")
	pf.StringVar(&p.server, "server", envDefault(envServer, "http://127.0.0.1:7070"), "coordinator HTTP address for the client commands, or several separated by commas, tried in turn while one does not answer (env "+envServer+"); the API token is read from "+client.EnvToken)
	root.AddGroup(&cobra.Group{ID: "farm", Title: "Running a farm:"}, &cobra.Group{ID: "jobs", Title: "Jobs:"},
		&cobra.Group{ID: "ops", Title: "Operating:"})
	for _, c := range []*cobra.Command{p.renderCommand(), p.serveCommand(), p.credentialsCommand()} {
		c.GroupID = "farm"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{p.submitCommand(), p.statusCommand(), p.watchCommand(), p.jobsCommand(), p.outputsCommand(),
		p.cancelCommand(), p.reprioritizeCommand()} {
		c.GroupID = "jobs"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{p.workersCommand(), p.dlqCommand(), p.gcCommand()} {
		c.GroupID = "ops"
		root.AddCommand(c)
	}
	return root
}

// client is the API client of the client commands: --server, and the token from the
// environment only, where a process listing cannot show it.
func (p *program) client() *client.Client { return client.New(p.server, os.Getenv(client.EnvToken)) }

// submitRequest builds a submission and its scene bundle from the shared flags of render and
// submit. With no formats the scene kind's default is asked for (defaultFormat: a Blender
// scene's own output); req.Formats says which.
func submitRequest(ctx context.Context, path string, fr frameFlags, rf *renderFlags, out string, formats []string, ks scene.Kinds, stderr io.Writer) (api.SubmitRequest, *bundle.Bundle, render.Settings, error) {
	frames, step := fr.frames, fr.step
	var req api.SubmitRequest
	first, last := 0, 0
	if frames != "" {
		var err error
		if first, last, err = parseFrames(frames); err != nil {
			return req, nil, render.Settings{}, err
		}
	}
	if err := rf.check(); err != nil {
		return req, nil, render.Settings{}, err
	}
	if step < 0 {
		return req, nil, render.Settings{}, usagef("--step %d: want 1 or more (0: the scene's frame step)", step)
	}
	if fr.preview < 0 {
		return req, nil, render.Settings{}, usagef("--preview %d: want 1 or more (0: no preview)", fr.preview)
	}
	b, k, s, local, err := readScene(ctx, path, ks, rf.overrides(), stderr)
	if err != nil {
		return req, nil, render.Settings{}, err
	}
	if frames == "" {
		first, last = s.Frames()
	}
	if len(formats) == 0 {
		formats = []string{defaultFormat(k, out)}
	}
	for _, f := range formats {
		if !slices.Contains(k.Formats(), f) {
			return req, nil, render.Settings{}, usagef("--format %s: a %s is written as %s", f, k.Name(), strings.Join(k.Formats(), ", "))
		}
	}
	if out != "" {
		if err := checkPattern(outPattern(out, formats[0]), first, last); err != nil {
			return req, nil, render.Settings{}, err
		}
	}
	return api.SubmitRequest{SceneVersion: b.Version(), Camera: rf.camera, First: first, Last: last, Step: step, Preview: fr.preview, SPP: rf.spp,
		Passes: rf.passes, Split: rf.split, Width: rf.width, Height: rf.height, TileSize: rf.tile, Formats: formats}, b, local, nil
}

func printStatus(w io.Writer, st api.Status, asJSON bool) {
	if asJSON {
		_ = writeJSON(w, st)
		return
	}
	fmt.Fprintf(w, "job %s: %s\n", st.JobID, st.State)
	every := ""
	if st.FrameStep > 1 {
		every = fmt.Sprintf(", every %d", st.FrameStep)
	}
	fmt.Fprintf(w, "  scene %s (%s), camera %s, frames %d-%d%s\n", st.Scene, short(st.SceneVersion), st.Camera, st.FirstFrame, st.LastFrame, every)
	if len(st.PreviewFrames) > 0 {
		done := "rendering first"
		if st.PreviewDone {
			done = "done"
		}
		fmt.Fprintf(w, "  preview frames %s: %s\n", strings.Trim(fmt.Sprint(st.PreviewFrames), "[]"), done)
	}
	fmt.Fprintf(w, "  frames %d/%d completed, %d failed; tiles %d/%d completed (%d rendered now, %d reused), %d attempts, %d samples recovered from checkpoints\n",
		st.FramesCompleted, st.FramesTotal, st.FramesFailed, st.TilesCompleted, st.TilesTotal, st.TilesRendered, st.TilesReused, st.TileAttempts, st.SamplesRecovered)
	if st.SamplesTotal > 0 && st.State != api.JobCompleted {
		fmt.Fprintf(w, "  samples %d/%d (%d%%), priority %d, ETA %s\n", st.SamplesDone, st.SamplesTotal, st.SamplesDone*100/st.SamplesTotal,
			st.Priority, eta(st))
	}
	if st.Pool != "" && st.Pool != "any worker" {
		fmt.Fprintf(w, "  renders on %s\n", st.Pool)
	}
	if len(st.After) > 0 || st.AfterFrames != "" {
		fmt.Fprintf(w, "  after %s\n", dependencies(st))
	}
	if st.WaitingFor != "" {
		fmt.Fprintf(w, "  waiting for %s\n", st.WaitingFor)
	}
	if st.BlockedReason != "" {
		fmt.Fprintf(w, "  BLOCKED: %s\n", st.BlockedReason)
	}
	if len(st.BlocklistedWorkers) > 0 {
		fmt.Fprintf(w, "  blocklisted by workers %s\n", strings.Join(st.BlocklistedWorkers, ", "))
	}
	switch m := st.Movie; m.State {
	case api.MovieReady:
		fmt.Fprintf(w, "  movie ready: coordinator outputs %s --movie PATH\n", st.JobID)
	case api.MoviePending, api.MovieFailed:
		fmt.Fprintf(w, "  movie %s: %s\n", m.State, m.Reason)
	}
	for _, f := range st.Failures {
		fmt.Fprintf(w, "  FAILED %s\n", f)
	}
	for _, o := range st.Outputs {
		fmt.Fprintf(w, "  wrote %s\n", o)
	}
}

// dependencies names the jobs a job waits for: "job-a, job-b completed; frame by frame job-c".
func dependencies(st api.Status) string {
	var parts []string
	if len(st.After) > 0 {
		parts = append(parts, strings.Join(st.After, ", ")+" completed")
	}
	if st.AfterFrames != "" {
		parts = append(parts, "frame by frame "+st.AfterFrames)
	}
	return strings.Join(parts, "; ")
}

// eta says how long a job has left, when that is known.
func eta(st api.Status) string {
	if st.ETASeconds == nil {
		return "-"
	}
	return (time.Duration(*st.ETASeconds) * time.Second).String()
}

func short(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}

// writeJSON prints v as indented JSON: the --json output of every read command.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
