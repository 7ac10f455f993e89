// Package buildinfo says which build of tilefarm is running, for --version and the
// tilefarm_build_info metric: the module version when built from a tagged module, else the VCS
// revision the binary was built from.
package buildinfo

import (
	"runtime"
	"runtime/debug"
	"sync"
)

// Version is the build's version: a module version such as v1.2.0, or "devel+REVISION" (with
// "-dirty" when built from uncommitted changes), or "devel" when neither is recorded.
func Version() string { return info().version }

// GoVersion is the Go release the binary was built with.
func GoVersion() string { return runtime.Version() }

var info = sync.OnceValue(func() struct{ version string } {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return struct{ version string }{"devel"}
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return struct{ version string }{v}
	}
	var rev string
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	v := "devel"
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		v += "+" + rev
		if dirty {
			v += "-dirty"
		}
	}
	return struct{ version string }{v}
})
