package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/tilefarm/tilefarm/internal/kinds"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/internal/worker"
)

// The local reference render, 'tileworker render': one frame on this machine with no farm.

func (p *program) localRenderCommand() *cobra.Command {
	c := newCommand("render SCENE --frame N --out FILE", "render one frame locally with no farm (the reference)", `
Render one frame of SCENE (a tilefarm JSON scene or a .blend) on all cores of this machine, tile
by tile and pass by pass as the farm's workers do, with no farm, and write it to FILE (PNG, or
OpenEXR for .exr). This is the reference a farm render must equal pixel for pixel: tile size and
worker count never change a pixel. A .blend renders with one Blender process per -j, and is
written as the farm writes it: by default its own output (format blend) where Blender would
write it, or at FILE.`)
	fs := c.Flags()
	frame := fs.Int("frame", 0, "frame number (default: the scene's first frame)")
	out := fs.String("out", "", "output file (.png, or .exr for 32-bit float OpenEXR; for a .blend, default its own output path)")
	format := fs.String("format", "", "png, png16, exr or blend (default: a .blend's own output, else from --out's extension)")
	rf := addRenderFlags(fs)
	kf := kinds.AddFlags(fs, false)
	jobs := fs.IntP("jobs", "j", runtime.NumCPU(), "tiles rendered in parallel")
	quiet := fs.BoolP("quiet", "q", false, "no progress bar")
	p.runErr(c, exactArgs(1, "one SCENE"), func(ctx context.Context, pos []string, stdout, stderr io.Writer) error {
		if err := checkFormat(*format); err != nil {
			return err
		}
		if err := rf.check(); err != nil {
			return err
		}
		if *jobs < 1 || *jobs > 1024 {
			return usagef("--jobs %d: want 1-1024", *jobs)
		}
		tmp, err := os.MkdirTemp("", "tilefarm-render-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		ks := kf.Open(scene.Env{Dir: tmp, Slots: *jobs, Log: slog.New(slog.DiscardHandler)})
		defer ks.Close()
		bundle, k, info, st, err := readScene(ctx, pos[0], ks, rf.overrides(), stderr)
		if err != nil {
			return err
		}
		f := *format
		if f == "" {
			f = defaultFormat(k, *out)
		}
		if !slices.Contains(k.Formats(), f) {
			return usagef("--format %s: a %s is written as %s", f, k.Name(), strings.Join(k.Formats(), ", "))
		}
		if *out == "" && f != formatBlend {
			return usagef("--out is required")
		}
		fr := *frame
		if fr == 0 {
			fr, _ = info.Frames()
		}
		ref, err := worker.NewReference(ctx, ks, bundle, tmp)
		if err != nil {
			return err
		}
		p := newProgress(stderr, *quiet)
		img, err := ref.RenderFrame(ctx, st, fr, rf.tile, *jobs, func(done, total int) { p.update(done, total, "tiles") })
		p.done()
		if err != nil {
			return err
		}
		outs, err := ref.Encode(ctx, img, fr, st, []string{f})
		if err != nil {
			return err
		}
		o := outs[0]
		paths := slices.Sorted(maps.Keys(o.Files))
		to, err := framePaths(outputDest{Pattern: outPattern(*out, f), Base: filepath.Dir(pos[0])}, fr, o.Name, paths)
		if err != nil {
			return err
		}
		written, err := writeFrame(fr, to, o.Data, func(i int) ([]byte, error) { return o.Files[paths[i]], nil })
		if err != nil {
			return err
		}
		for _, w := range written {
			fmt.Fprintf(stdout, "wrote %s (%dx%d, %d spp, frame %d)\n", filepath.Clean(w), st.Width, st.Height, st.SPP, fr)
		}
		return nil
	})
	return c
}
