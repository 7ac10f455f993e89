// Package cli implements the coordinator and tileworker commands. The binaries in cmd/ only
// call Coordinator and Tileworker, so tests can run the same code in-process.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/buildinfo"
	"github.com/tilefarm/tilefarm/internal/coordinator"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/node"
	"github.com/tilefarm/tilefarm/internal/scene/jsonscene"
	"github.com/tilefarm/tilefarm/render"
)

// The environment variables flags read their defaults from (besides NATS_URL and
// TILEFARM_BLENDER, next to their flags).
const (
	envServer    = "TILEFARM_SERVER"
	envLogFormat = "TILEFARM_LOG_FORMAT"
)

// Version is what --version prints: the build, and the built-in renderer's build fingerprint
// as pools name it (tilefarm/<Go release> <GOARCH level> render/<version>: a job of the
// built-in renderer renders only on workers reporting the same), which is also what the
// release archives are named by.
func Version() string {
	return buildinfo.Version() + " (" + jsonscene.Build() + ", " + runtime.GOOS + ")"
}

// usageError is a command-line mistake (exit 2).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// exitCode maps an error onto the contract's exit codes and prints it.
func exitCode(stderr io.Writer, cmd string, err error) int {
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "%s: %v\nRun '%s --help' for usage.\n", cmd, err, cmd)
		return api.ExitUsage
	}
	code := api.ExitCode(err)
	var busy *api.BusyError
	switch {
	case err == nil:
	case code == api.ExitInterrupt:
		fmt.Fprintf(stderr, "%s: interrupted\n", cmd)
	case errors.As(err, &busy):
		fmt.Fprintf(stderr, "%s: %v (retry in %s)\n", cmd, err, busy.RetryAfter)
	case code == api.ExitBusy:
		fmt.Fprintf(stderr, "%s: %v (retry later)\n", cmd, err)
	default:
		fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
	}
	return code
}

// runFunc is a command's body, called once cobra has parsed its flags, with its positional
// arguments; it returns the command's exit code, or an error that exitCode maps onto one.
type runFunc func(ctx context.Context, pos []string, stdout, stderr io.Writer) (int, error)

// program runs one of the two command trees: it carries the streams and the global flags, and
// keeps what the command that ran returned, so that every path out of cobra (help, a flag
// mistake, an unknown command, a command's error) ends in the contract's exit code.
type program struct {
	ctx            context.Context
	stdout, stderr io.Writer
	ran            *cobra.Command // the command whose body ran, nil until one did
	code           int
	err            error

	jsonOut   bool   // --json: read commands print one JSON value on stdout
	logFormat string // --log-format
	server    string // --server
}

// newCommand makes a command: use is its synopsis (its first word its name), short the line in
// its parent's list of commands, long its help text.
func newCommand(use, short, long string) *cobra.Command {
	return &cobra.Command{Use: use, Short: short, Long: strings.TrimSpace(long), SilenceErrors: true, SilenceUsage: true,
		DisableFlagsInUseLine: true}
}

// run makes body c's action, with args checking its positional arguments.
func (p *program) run(c *cobra.Command, args cobra.PositionalArgs, body runFunc) {
	c.Args = args
	c.RunE = func(c *cobra.Command, pos []string) error {
		p.ran = c
		p.code, p.err = body(c.Context(), pos, p.stdout, p.stderr)
		return nil
	}
}

// runErr is run for a command whose only outcomes are success (exit 0) and an error.
func (p *program) runErr(c *cobra.Command, args cobra.PositionalArgs, body func(ctx context.Context, pos []string, stdout, stderr io.Writer) error) {
	p.run(c, args, func(ctx context.Context, pos []string, stdout, stderr io.Writer) (int, error) {
		return api.ExitOK, body(ctx, pos, stdout, stderr)
	})
}

// execute runs root on args and returns the exit code: 0 for help, 2 for a usage mistake, and
// otherwise what the command that ran says.
func (p *program) execute(root *cobra.Command, args []string) int {
	root.SetArgs(args)
	root.SetOut(p.stdout)
	root.SetErr(p.stderr)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return usagef("%v", err) })
	root.PersistentPreRunE = func(c *cobra.Command, _ []string) error {
		_, err := newLogger(io.Discard, "info", p.logFormat)
		return err
	}
	root.Version = Version()
	root.SetVersionTemplate("{{.Name}} {{.Version}}\n")
	root.CompletionOptions.HiddenDefaultCmd = false
	cmd, err := root.ExecuteContextC(p.ctx)
	if err != nil {
		// Cobra's own refusals (an unknown command or flag, wrong arguments) are usage mistakes.
		var ue *usageError
		if !errors.As(err, &ue) {
			err = usagef("%v", err)
		}
		return exitCode(p.stderr, cmd.CommandPath(), err)
	}
	if p.ran == nil {
		return api.ExitOK // help, --version or completion was asked for and printed
	}
	if p.err != nil || p.code < 0 {
		return exitCode(p.stderr, p.ran.CommandPath(), p.err)
	}
	return p.code
}

// noArgs refuses positional arguments.
func noArgs(c *cobra.Command, pos []string) error {
	if len(pos) > 0 {
		return usagef("unexpected argument %q", pos[0])
	}
	return nil
}

// exactArgs wants n positional arguments, named by what in the error.
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(c *cobra.Command, pos []string) error {
		if len(pos) != n {
			return usagef("want exactly %s, got %d arguments", what, len(pos))
		}
		return nil
	}
}

// envDefault is the value of the environment variable env, or def when it is unset: the
// default of a flag that may also be set from the environment.
func envDefault(env, def string) string {
	if v := os.Getenv(env); v != "" {
		return v
	}
	return def
}

// parseFrames parses "A-B" or "N".
func parseFrames(s string) (first, last int, err error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		b = a
	}
	first, err1 := strconv.Atoi(strings.TrimSpace(a))
	last, err2 := strconv.Atoi(strings.TrimSpace(b))
	if err1 != nil || err2 != nil {
		return 0, 0, usagef("--frames %q: want A-B or N, e.g. 1-24", s)
	}
	return first, last, coordinator.CheckFrameRange(first, last)
}

// checkFormat checks a --format value: "" (the default, decided with the scene: defaultFormat)
// or a format the farm writes.
func checkFormat(f string) error {
	if _, ok := layout.FrameOutputName(f); !ok && f != "" {
		return usagef("--format %q: want png, png16, exr or blend (a Blender scene's own output)", f)
	}
	return nil
}

// formatList parses submit's comma-separated --format list; "" is the scene's default.
func formatList(flagValue string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(flagValue, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if err := checkFormat(f); err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	return out, nil
}

// newLogger makes the process's structured logger: format is "text" or "json" ("" picks JSON
// unless stderr is a terminal, where people read it).
func newLogger(stderr io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: l}
	if format == "" {
		format = "json"
		if isTerminal(stderr) {
			format = "text"
		}
	}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(stderr, opts)), nil
	}
	return nil, usagef("--log-format %q: want text or json", format)
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

func isNotFound(err error) bool { return errors.Is(err, api.ErrNotFound) }

// killSelf is the crash hook of fault tests: it kills this process with SIGKILL at a seam, so
// the test sees exactly what a real crash there leaves behind.
func killSelf(log *slog.Logger, process, seam string) {
	log.Warn("fault injection: killing "+process, "seam", seam)
	if self, err := os.FindProcess(os.Getpid()); err == nil {
		_ = self.Kill() // SIGKILL; TerminateProcess on Windows
	}
	time.Sleep(time.Hour)
}

func mustAbs(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	return a
}

// renderFlags are the settings overrides shared by render, submit and tileworker render.
// frameFlags are which frames render and in which order: --frames, --step, --preview.
type frameFlags struct {
	frames        string
	step, preview int
}

func addFrameFlags(fs *pflag.FlagSet, what string) *frameFlags {
	f := &frameFlags{}
	fs.StringVar(&f.frames, "frames", "", what+", A-B or N (default: the scene's frame range)")
	fs.IntVar(&f.step, "step", 0, "render every Nth frame of the range (default: the scene's frame step, a .blend's; else 1)")
	fs.IntVar(&f.preview, "preview", 0, "render first the frames A, A+N, A+2N, ... and B, then the rest (status says when they are done)")
	return f
}

type renderFlags struct {
	spp, width, height, tile, passes int
	camera                           string
	split                            bool
}

func addRenderFlags(fs *pflag.FlagSet) *renderFlags {
	rf := &renderFlags{}
	fs.IntVar(&rf.spp, "spp", 0, "samples per pixel (default: the scene's)")
	fs.IntVar(&rf.width, "width", 0, "image width override")
	fs.IntVar(&rf.height, "height", 0, "image height override")
	fs.StringVar(&rf.camera, "camera", "", "camera name (default: the scene's)")
	fs.Func("tile", "tile size in pixels, 1-4096 (default 64, 256 for Blender scenes; never changes a pixel)", func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 4096 {
			return fmt.Errorf("--tile wants 1-4096, got %q", v)
		}
		rf.tile = n
		return nil
	})
	fs.IntVar(&rf.passes, "passes", 0, "Blender scenes: passes each tile's samples are split into, each a checkpoint (default 4; part of the frame's identity)")
	fs.BoolVar(&rf.split, "split", false, "Blender scenes that render whole (adaptive sampling, a time limit, Freestyle...): split them into tiles and passes anyway, with those settings switched off (changes the picture)")
	return rf
}

// check rejects values no scene could accept; the scene validates the rest and names the field.
func (rf *renderFlags) check() error {
	if rf.passes < 0 {
		return usagef("--passes %d: want at least 1", rf.passes)
	}
	return nil
}

// overrides are the settings the flags change.
func (rf *renderFlags) overrides() render.Overrides {
	return render.Overrides{Camera: rf.camera, Width: rf.width, Height: rf.height, SPP: rf.spp, Passes: rf.passes, Split: rf.split}
}

// natsFlags are how a process reaches NATS: --nats (default NATS_URL), --nats-creds and the TLS
// files. A user name, password or token come from NATS_USER, NATS_PASSWORD and NATS_TOKEN only.
func natsFlags(fs *pflag.FlagSet, def string) *node.NATSClient {
	c := &node.NATSClient{User: os.Getenv("NATS_USER"), Password: os.Getenv("NATS_PASSWORD"), Token: os.Getenv("NATS_TOKEN")}
	if env := os.Getenv("NATS_URL"); env != "" {
		def = env
	}
	fs.StringVar(&c.URLs, "nats", def, "NATS URL, or several comma-separated (the nodes of a cluster) (env NATS_URL)")
	fs.StringVar(&c.Creds, "nats-creds", "", "NATS credentials file: an nkey seed such as serve's worker.creds, or a JWT .creds file")
	fs.StringVar(&c.CA, "nats-ca", "", "CA certificate file for NATS TLS")
	fs.StringVar(&c.Cert, "nats-cert", "", "certificate file for NATS TLS")
	fs.StringVar(&c.Key, "nats-key", "", "key file of --nats-cert")
	return c
}

// threadsFlag is --threads: the threads each renderer process of a slot renders with.
type threadsFlag struct{ n *int }

// addThreadsFlag adds --threads to fs; what is one slot is "tile slot" or "in-process worker".
func addThreadsFlag(fs *pflag.FlagSet, slot string) threadsFlag {
	return threadsFlag{fs.Int("threads", 0, "threads each "+slot+"'s renderer renders with (default: this machine's cores divided by the "+slot+"s, at least 1); never changes a pixel. One "+slot+" with every thread is the production setting for Blender nodes: one process holds one copy of the scene")}
}

// of is the threads for slots slots: the flag's, else the cores divided among them.
func (f threadsFlag) of(slots int) (int, error) {
	switch n := *f.n; {
	case n < 0 || n > 1024:
		return 0, usagef("--threads %d: want 1-1024", n)
	case n > 0:
		return n, nil
	}
	return max(1, runtime.NumCPU()/max(slots, 1)), nil
}
