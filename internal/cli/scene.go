package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/tilefarm/tilefarm/blender"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/bundle"
)

// envBlender names the variable that chooses the Blender executable.
const envBlender = "TILEFARM_BLENDER"

// blenderFlags choose the Blender that inspects and renders .blend scenes.
type blenderFlags struct {
	binary string
	hang   time.Duration
}

// addBlenderFlags adds --blender and, for the commands that render for a farm, the hang timeout.
func addBlenderFlags(fs *pflag.FlagSet, renders bool) *blenderFlags {
	bf := &blenderFlags{hang: blender.DefaultHangTimeout}
	fs.StringVar(&bf.binary, "blender", envDefault(envBlender, "blender"), "Blender 3.4 executable for .blend scenes (env "+envBlender+"); every machine of a farm must run the same build")
	if renders {
		fs.DurationVar(&bf.hang, "blender-hang-timeout", bf.hang, "kill and restart a Blender process that shows no sign of life for this long")
	}
	return bf
}

// pool makes a pool of size Blender processes working under dir; none starts until needed.
func (bf *blenderFlags) pool(dir string, size int, log *slog.Logger) *blender.Pool {
	return blender.NewPool(blender.Options{Binary: bf.binary, Dir: dir, Size: size, HangTimeout: bf.hang, Log: log})
}

// workerPool is the pool of a worker with slots tile slots: one process each. A process serves
// one request (a pass, an encoding) at a time, so the assembly loop's encodings take turns
// with the slots' passes instead of costing a process of their own.
func (bf *blenderFlags) workerPool(dir string, slots int, log *slog.Logger) *blender.Pool {
	return bf.pool(dir, slots, log)
}

// isBlendFile reports whether path names a .blend scene: by its extension, or by its first bytes.
func isBlendFile(path string) bool {
	if strings.EqualFold(filepath.Ext(path), ".blend") {
		return true
	}
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	var head [8]byte
	n, _ := f.Read(head[:])
	return blender.IsBlend(head[:n])
}

// readScene reads a scene file into a bundle and validates it, so bad input fails before
// anything starts or is sent: a tilefarm JSON scene with the assets it names, or a .blend
// that Blender (on pool) inspects, with every file it depends on. The settings of a Blender
// scene that cannot be split by tile and are switched off are reported on w, one line each.
func readScene(ctx context.Context, path string, pool *blender.Pool, w io.Writer) (*bundle.Bundle, error) {
	var b *bundle.Bundle
	if isBlendFile(path) {
		in, err := blender.Inspect(ctx, pool, path)
		if err != nil {
			if errors.Is(err, blender.ErrScene) {
				return nil, fmt.Errorf("%w: %v", api.ErrBadInput, err)
			}
			return nil, err
		}
		for _, line := range in.Desc.SwitchedOff {
			fmt.Fprintf(w, "%s: %s\n", filepath.Base(path), line)
		}
		if b, err = bundle.BlendBundle(in); err != nil {
			return nil, fmt.Errorf("%w: %v", api.ErrBadInput, err)
		}
	} else {
		var err error
		if b, err = bundle.ReadBundle(path); err != nil {
			return nil, fmt.Errorf("%w: %v", api.ErrBadInput, err)
		}
	}
	if err := b.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", api.ErrBadInput, err)
	}
	return b, nil
}
