// Package blendscene is the Blender .blend as a kind of scene of the farm (scene.Kind):
// Blender inspects it where it is submitted, and persistent Blender processes (a blender.Pool
// the kind owns) render its tiles pass by pass, every view layer and pass, and write its frames
// through Blender's own pipeline: the compositor and the file the .blend asks for
// (docs/design.md, "Blender scenes").
package blendscene

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"

	"github.com/tilefarm/tilefarm/blender"
	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/failure"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/raster"
	"github.com/tilefarm/tilefarm/render"
)

// TileSize is the default tile edge of a Blender scene. A Blender tile pays a scene sync and a
// render call per pass, so its tiles are larger (a 1920x1080 frame is still 40 of them).
const TileSize = 256

// EnvBinary names the variable that chooses the Blender builds: one path, or several
// separated as PATH separates its directories.
const EnvBinary = "TILEFARM_BLENDER"

// Options say which Blender builds render on this machine; the rest of a pool's options (its
// directory, its size, its log) are the process's.
type Options struct {
	// Binaries are the builds, each a Blender executable or a Python that imports bpy
	// (blender.IsPython); none means "blender" on PATH. Each is a pool of its own.
	Binaries    []string
	HangTimeout time.Duration
	Kernel      string // caps the Cycles CPU kernel (blender.Options.Kernel)
	// BuildCache remembers this machine's Blender builds (blender.Options.BuildCache); AddFlags
	// makes it DefaultBuildCache.
	BuildCache string
}

// DefaultBuildCache is where the commands remember the builds of this machine's Blenders:
// tilefarm/blender-builds in the user's cache directory, or "" (none) where there is none.
func DefaultBuildCache() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "tilefarm", "blender-builds")
}

// AddFlags adds --blender (repeatable; default $TILEFARM_BLENDER, else blender) and, for the
// commands that render for a farm, --blender-hang-timeout.
func AddFlags(fs *pflag.FlagSet, renders bool) *Options {
	o := &Options{Binaries: filepath.SplitList(os.Getenv(EnvBinary)), HangTimeout: blender.DefaultHangTimeout}
	o.BuildCache = DefaultBuildCache()
	fs.StringVar(&o.BuildCache, "blender-build-cache", o.BuildCache, "directory remembering the build each Blender of this machine reported, so a start need not run Blender to know it (\"\": ask Blender every start)")
	fs.Var(&binaries{list: &o.Binaries}, "blender", "a Blender build for .blend scenes: its executable, or a Python that imports bpy (Blender as a module); repeat it for several builds, each its own pool (env "+EnvBinary+", several separated by '"+string(filepath.ListSeparator)+"'; default blender). A .blend renders on a build of the line that saved it, else the nearest newer")
	var names []string
	for _, k := range blender.Kernels {
		names = append(names, k.Name)
	}
	fs.Func("blender-kernel", "cap Cycles' CPU kernel at this one ("+strings.Join(names, ", ")+"; default: the best this CPU has), so machines of different CPUs render with one build", func(v string) error {
		for _, k := range blender.Kernels {
			if k.Name == v {
				o.Kernel = v
				return nil
			}
		}
		return fmt.Errorf("unknown Cycles kernel %q: want one of %s", v, strings.Join(names, ", "))
	})
	if renders {
		fs.DurationVar(&o.HangTimeout, "blender-hang-timeout", o.HangTimeout, "kill and restart a Blender process that shows no sign of life for this long")
	}
	return o
}

// binaries is --blender: each value a build that must exist (an executable, found on PATH if
// it names no directory); the first replaces the default.
type binaries struct {
	list *[]string
	set  bool
}

func (b *binaries) String() string { return strings.Join(*b.list, string(filepath.ListSeparator)) }

func (b *binaries) Type() string { return "path" }

func (b *binaries) Set(v string) error {
	if _, err := exec.LookPath(v); err != nil {
		return fmt.Errorf("%s is not an executable Blender or Python with bpy: %v (README, \"Blender lines\")", v, errors.Unwrap(err))
	}
	if !b.set {
		*b.list, b.set = nil, true
	}
	*b.list = append(*b.list, v)
	return nil
}

// Kind is the Blender .blend scene, with a pool of Blender processes for each build of this
// machine, which inspect and render it; none starts until one is needed.
type Kind struct {
	pools []*blender.Pool

	mu      sync.Mutex
	byBuild map[string]*blender.Pool // the pools that reported their build, by it
}

var _ scene.Kind = (*Kind)(nil)

// New makes the kind with a pool of Blender processes in env.Dir for each build: one process
// per slot, since a process serves one request (a pass, an assembly) at a time and the
// assembly loop's requests take turns with the slots' passes.
func New(o Options, env scene.Env) *Kind {
	binaries := o.Binaries
	if len(binaries) == 0 {
		binaries = []string{"blender"}
	}
	k := &Kind{}
	for _, b := range binaries {
		k.pools = append(k.pools, blender.NewPool(blender.Options{Binary: b, HangTimeout: o.HangTimeout, Kernel: o.Kernel,
			BuildCache: o.BuildCache, Dir: env.Dir, Size: env.Slots, Threads: env.Threads, Log: env.Log}))
	}
	return k
}

// Builds are the fingerprints of this machine's Blender builds (scene.Builder), asked of every
// pool at once, starting a process of each that has not reported its build yet. A build that
// cannot start is left out and named in the error; two paths to one build count once.
func (k *Kind) Builds(ctx context.Context) ([]string, error) {
	builds := k.builds(ctx)
	var out []string
	var errs []error
	for i, b := range builds {
		switch {
		case b.err != nil:
			errs = append(errs, fmt.Errorf("--blender %s: %w", k.pools[i].Binary(), b.err))
		case !slices.Contains(out, b.build):
			out = append(out, b.build)
		}
	}
	return out, errors.Join(errs...)
}

// poolBuild is what one pool answered: its build or why it has none.
type poolBuild struct {
	build string
	err   error
}

// builds asks every pool for its build at once.
func (k *Kind) builds(ctx context.Context) []poolBuild {
	out := make([]poolBuild, len(k.pools))
	var wg sync.WaitGroup
	for i, p := range k.pools {
		wg.Go(func() {
			out[i].build, out[i].err = p.Build(ctx)
		})
	}
	wg.Wait()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.byBuild == nil {
		k.byBuild = map[string]*blender.Pool{}
	}
	for i, b := range out {
		if b.err == nil {
			k.byBuild[b.build] = k.pools[i]
		}
	}
	return out
}

// pool is the pool of build, or ErrBuildMismatch naming this machine's builds. A build
// reported before is found without asking the pools again (a broken one would start a process
// for every tile).
func (k *Kind) pool(ctx context.Context, build string) (*blender.Pool, error) {
	k.mu.Lock()
	p := k.byBuild[build]
	k.mu.Unlock()
	if p != nil {
		return p, nil
	}
	var have []string
	for i, b := range k.builds(ctx) {
		if b.err == nil && b.build == build {
			return k.pools[i], nil
		}
		if b.err == nil {
			have = append(have, b.build)
		}
	}
	return nil, fmt.Errorf("%w: the job renders with %q, this worker runs %s (the farm routes a job only to workers of its build: is this worker misconfigured?)",
		blender.ErrBuildMismatch, build, orNone(have))
}

// inspector is the pool that inspects a .blend saved by Blender line saved: of that line if
// this machine has one, else of the nearest newer line, as the farm chooses the build that
// renders it (blender.Description.FitBuilds). Pools that cannot start are skipped; with none
// left the error says why.
func (k *Kind) inspector(ctx context.Context, name string, saved blender.Version) (*blender.Pool, error) {
	var have []string
	var errs []error
	answers := k.builds(ctx)
	for i, b := range answers {
		if b.err != nil {
			errs = append(errs, fmt.Errorf("--blender %s: %w", k.pools[i].Binary(), b.err))
			continue
		}
		have = append(have, b.build)
	}
	if len(have) == 0 {
		return nil, errors.Join(errs...)
	}
	if line, ok := blender.RenderingLine(saved, have); ok {
		for i, b := range answers {
			if v, _ := blender.BuildLine(b.build); b.err == nil && v == line {
				return k.pools[i], nil
			}
		}
	}
	return nil, failure.Terminalf("%s was saved by Blender %s, which none of this machine's builds can read (%s): point --blender at a Blender %s or newer (README, \"Blender lines\")",
		name, saved, orNone(have), saved)
}

func orNone(builds []string) string {
	if len(builds) == 0 {
		return "none"
	}
	return strings.Join(builds, "; ")
}

// Close stops the kind's Blender processes.
func (k *Kind) Close() error {
	var errs []error
	for _, p := range k.pools {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}

// Name names the kind.
func (k *Kind) Name() string { return "Blender scene" }

// SlotsPerMachine is 1: one Blender process with every thread of the machine holds one copy
// of the scene in memory and renders a frame that renders whole (adaptive sampling, a
// denoiser) on every core, where a process per core holds as many copies and renders such a
// frame on one (docs/operations.md, "Threads and memory").
func (k *Kind) SlotsPerMachine(cores int) int { return 1 }

// ClaimsFile claims a .blend by its extension or by its first bytes.
func (k *Kind) ClaimsFile(p string) bool {
	if strings.EqualFold(filepath.Ext(p), ".blend") {
		return true
	}
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	var head [8]byte
	n, _ := f.Read(head[:])
	return blender.IsBlend(head[:n])
}

// ClaimsDocument claims a Blender scene description.
func (k *Kind) ClaimsDocument(doc []byte) bool { return blender.IsDescription(doc) }

// Read has Blender inspect the .blend (blender.Inspect) and bundles the description as the
// scene document with the .blend and every file it depends on, by their paths under a common
// root.
func (k *Kind) Read(ctx context.Context, p string) (*bundle.Bundle, error) {
	saved, err := blender.FileVersion(p)
	if err != nil {
		return nil, failure.Terminal(err)
	}
	pool, err := k.inspector(ctx, filepath.Base(p), saved)
	if err != nil {
		return nil, err
	}
	// Where this machine renders the scene too (`coordinator render`, `tileworker render`), its
	// other slots' processes start beside the inspecting one, on cores still idle, instead of
	// when their first tile comes, while the first slot renders (a pool of one slot, a submit's,
	// starts nothing more).
	pool.Warm(context.WithoutCancel(ctx))
	in, err := blender.Inspect(ctx, pool, p)
	if err != nil {
		if errors.Is(err, blender.ErrScene) {
			return nil, failure.Terminal(err)
		}
		return nil, err
	}
	b, err := bundle.FromFiles(ctx, path.Base(in.Desc.Blend), in.Desc.Encode(), in.Desc.Files, func(name string) string { return in.Paths[name] })
	if err != nil {
		return nil, failure.Terminalf("scene %s: %w", path.Base(in.Desc.Blend), err)
	}
	return b, nil
}

// Describe parses the scene description.
func (k *Kind) Describe(doc []byte) (scene.Description, error) {
	d, err := blender.ParseDescription(doc)
	if err != nil {
		return nil, err
	}
	return d, nil
}

// Validate checks that every file the description names is in the bundle and that the .blend
// looks like one; only Blender itself can check more, which Read did where the bundle was made.
func (k *Kind) Validate(ctx context.Context, b *bundle.Bundle) error {
	d, err := blender.ParseDescription(b.Scene)
	if err != nil {
		return failure.Terminal(err)
	}
	for _, name := range d.Files {
		if _, ok := b.Files[name]; !ok {
			return failure.Terminalf("the scene needs %q, which its manifest does not name: %w", name, os.ErrNotExist)
		}
	}
	if b.Files[d.Blend].Shared != "" {
		return nil // on the studio's share, which only workers read: each checks its hash there
	}
	head, err := b.Head(ctx, d.Blend, blender.BlendHeaderSize)
	if err != nil {
		return err // the source's: a store or a network failing is retried, a file missing is not
	}
	if !blender.IsBlend(head) {
		return failure.Terminalf("%s is not a .blend file", d.Blend)
	}
	return nil
}

// Load unpacks the scene's files under dir/blender/<version> for Blender to open, once, and
// starts the pool's processes: every slot will want one for the tiles that are coming.
func (k *Kind) Load(ctx context.Context, b *bundle.Bundle, version, dir string) (scene.Renderer, error) {
	if dir == "" {
		return nil, fmt.Errorf("scene %s is a Blender scene and this worker has no directory to unpack it in", version)
	}
	if err := k.Validate(ctx, b); err != nil {
		return nil, fmt.Errorf("scene %s: %w", version, err) // terminal where the scene's fault
	}
	d, err := blender.ParseDescription(b.Scene)
	if err != nil {
		return nil, failure.Terminalf("scene %s: %w", version, err)
	}
	s, err := blender.Unpack(ctx, filepath.Join(dir, "blender"), version, d, b)
	if err != nil {
		return nil, fmt.Errorf("scene %s: %w", version, err)
	}
	return cycles{s: s, kind: k}, nil
}

// TileSize is the default tile edge.
func (k *Kind) TileSize() int { return TileSize }

// Formats are the .blend's own output first (blender.FormatBlend), then the farm's formats of
// the Composite result.
func (k *Kind) Formats() []string { return blender.Formats }

// TilePreviews is false: Blender's compositor and colour management encode a PNG from the
// whole frame.
func (k *Kind) TilePreviews() bool { return false }

// EncodeTilePreview refuses: see TilePreviews.
func (k *Kind) EncodeTilePreview(render.Rect, []float32, render.Settings) ([]byte, error) {
	return nil, failure.Terminalf("a tile of a Blender scene has no PNG of its own: Blender's colour management encodes the frame's")
}

// cycles is a loaded Blender scene, rendered by Blender's Cycles on the kind's pool of the
// job's build (Settings.Build).
type cycles struct {
	s    *blender.Scene
	kind *Kind
}

func (c cycles) NewTile(ctx context.Context, st render.Settings, frame int, r render.Rect) (scene.Tile, error) {
	pool, err := c.kind.pool(ctx, st.Build)
	if err != nil {
		return nil, classify("creating tile", err)
	}
	// Every slot will want a process of the job's build for the tiles that are coming.
	pool.Warm(context.WithoutCancel(ctx))
	t, err := blender.NewTile(ctx, pool, c.s, st, frame, r)
	if err != nil {
		return nil, classify("creating tile", err)
	}
	return cyclesTile{t}, nil
}

// Channels are the scene's every view layer and pass, as a tile of a frame rendered whole or
// not renders them.
func (c cycles) Channels(st render.Settings) []string { return c.s.Desc.TileChannels(st.Whole) }

// Encode has Blender write the assembled frame (blender.Assemble): the compositor run on it
// and the file the .blend asks for, or the farm's formats of its Composite result.
func (c cycles) Encode(ctx context.Context, f *raster.Frame, frame int, st render.Settings, formats []string) ([]scene.Output, error) {
	what := "encoding " + strings.Join(formats, ", ")
	pool, err := c.kind.pool(ctx, st.Build)
	if err != nil {
		return nil, classify(what, err)
	}
	as, err := blender.Assemble(ctx, pool, c.s, f, frame, st, formats)
	if err != nil {
		return nil, classify(what, err)
	}
	outs := make([]scene.Output, len(as))
	for i, a := range as {
		outs[i] = scene.Output{Data: a.Main, Files: a.Files}
		if formats[i] == blender.FormatBlend {
			outs[i].Name = a.Name
		}
	}
	return outs, nil
}

// cyclesTile classifies the errors of a Blender tile for the farm.
type cyclesTile struct{ *blender.Tile }

func (t cyclesTile) Render(ctx context.Context, from, to int) error {
	if err := t.Tile.Render(ctx, from, to); err != nil {
		return classify("rendering", err)
	}
	return nil
}

// classify makes an error of the scene or of a build mismatch terminal: no worker of this
// farm can render it. A crashed or hung Blender process is retried.
func classify(what string, err error) error {
	if errors.Is(err, blender.ErrScene) || errors.Is(err, blender.ErrBuildMismatch) {
		return failure.Terminalf("%s: %w", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
