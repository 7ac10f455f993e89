// Package kinds is where every kind of scene the farm renders is registered: the one list of
// scene kinds the commands hand to the coordinator and to the workers, with the options of
// those that have any as command-line flags. Adding a renderer is a package implementing
// scene.Kind and a line here (docs/design.md, "Renderers").
package kinds

import (
	"github.com/spf13/pflag"

	"github.com/tilefarm/tilefarm/blender/blendscene"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/internal/scene/jsonscene"
)

// Options are the options of the kinds that have any.
type Options struct {
	Blender blendscene.Options
}

// Builtin is every kind of scene the farm renders, in the order a file or a bundle is asked:
// a Blender .blend, else a tilefarm JSON scene. Close it to stop the renderer processes.
func Builtin(o Options, env scene.Env) scene.Kinds {
	return scene.Kinds{blendscene.New(o.Blender, env), jsonscene.Kind{Threads: env.Threads}}
}

// Flags are the kinds' options as the flags of a command, read when the command runs.
type Flags struct{ blender *blendscene.Options }

// AddFlags adds the flags of every kind to fs. renders says the command renders for a farm,
// which takes the options of long-running renderer processes (a hang timeout) too.
func AddFlags(fs *pflag.FlagSet, renders bool) *Flags {
	return &Flags{blender: blendscene.AddFlags(fs, renders)}
}

// Open makes the kinds with the options the flags were given.
func (f *Flags) Open(env scene.Env) scene.Kinds { return Builtin(Options{Blender: *f.blender}, env) }
