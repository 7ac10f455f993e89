package farmtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/tilefarm/tilefarm/internal/proctest"
)

// Binaries are the farm's commands, built once per run so every farm of the run starts the
// same code and no `go run` compile lands inside a measurement or a fault test.
type Binaries struct {
	Dir         string // where Build put them
	Coordinator string // cmd/coordinator, empty when not built
	Tileworker  string // cmd/tileworker, empty when not built
}

// Path is the binary of the command called name in Dir.
func (b Binaries) Path(name string) string { return filepath.Join(b.Dir, name) }

// BuildOptions say how Build builds.
type BuildOptions struct {
	// Race builds with the race detector: a binary then reports a data race in its log
	// (DataRace) and exits 66.
	Race bool
	// Commands are what to build, of "coordinator" and "tileworker"; empty is both. A
	// benchmark that starts no worker builds the coordinator alone and so spends no link on
	// the other.
	Commands []string
}

// EnvBinaries names a directory holding the farm's commands already built from this checkout
// (test.sh builds them once per run and sets it), which Build then uses instead of building
// them again in every package that starts a farm.
const EnvBinaries = "TILEFARM_BINS"

// Build builds the farm's commands of this module into dir; without the race detector, those
// of EnvBinaries when it is set.
func Build(dir string, o BuildOptions) (Binaries, error) {
	cmds := o.Commands
	if len(cmds) == 0 {
		cmds = []string{"coordinator", "tileworker"}
	}
	if built := os.Getenv(EnvBinaries); built != "" && !o.Race {
		return prebuilt(built, cmds)
	}
	root, err := proctest.ModuleRoot()
	if err != nil {
		return Binaries{}, err
	}
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	if o.Race {
		args = append(args, "-race")
	}
	b := Binaries{Dir: dir}
	for _, c := range cmds {
		if err := b.name(c); err != nil {
			return Binaries{}, err
		}
		args = append(args, "./cmd/"+c)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return Binaries{}, fmt.Errorf("building the farm: %w\n%s", err, out)
	}
	return b, nil
}

// prebuilt is the commands cmds in dir, each of which must be there.
func prebuilt(dir string, cmds []string) (Binaries, error) {
	b := Binaries{Dir: dir}
	for _, c := range cmds {
		if err := b.name(c); err != nil {
			return Binaries{}, err
		}
		if fi, err := os.Stat(b.Path(c)); err != nil || fi.IsDir() {
			return Binaries{}, fmt.Errorf("the farm's %s is not in $%s (%s)", c, EnvBinaries, dir)
		}
	}
	return b, nil
}

// name sets the field of the command c to its path in b.Dir.
func (b *Binaries) name(c string) error {
	switch c {
	case "coordinator":
		b.Coordinator = b.Path(c)
	case "tileworker":
		b.Tileworker = b.Path(c)
	default:
		return fmt.Errorf("building the farm: no command %q", c)
	}
	return nil
}

// DataRace reports whether p, a process of binaries built with BuildOptions.Race, reported a
// data race.
func DataRace(p *proctest.Proc) bool { return strings.Contains(p.Log(), "WARNING: DATA RACE") }

// Reference is one frame rendered locally by `tileworker render`: what a farm's output of
// that frame must equal pixel for pixel, and the local time a benchmark compares the farm's
// with.
type Reference struct {
	Scene string
	Frame int
	Out   string   // the image it writes
	Args  []string // further flags: the settings (--width, --spp, ...), -j
}

// RenderReference renders r with the tileworker binary and returns the finished process's
// state, whose rusage is the render's CPU time.
func (b Binaries) RenderReference(ctx context.Context, r Reference) (*os.ProcessState, error) {
	args := append([]string{"render", r.Scene, "--frame", strconv.Itoa(r.Frame), "--out", r.Out, "-q"}, r.Args...)
	cmd := exec.CommandContext(ctx, b.Tileworker, args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("rendering frame %d locally: %w\n%s", r.Frame, err, out)
	}
	return cmd.ProcessState, nil
}
