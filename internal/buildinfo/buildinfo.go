// Package buildinfo says which build of tilefarm is running, for --version and the
// tilefarm_build_info metric: the module version when built from a tagged module, else the VCS
// revision the binary was built from.
package buildinfo

import (
	"runtime"
	"runtime/debug"
	"sync"
)

// Version is the build's version: the release's (stamped, below), a module version such as
// v1.2.0, or "devel+REVISION" (with "-dirty" when built from uncommitted changes), or "devel"
// when none is recorded.
func Version() string {
	if stamped != "" {
		return stamped
	}
	return info().version
}

// stamped is the version release.sh gives a release build (-ldflags -X), so its binaries say
// the version their archives are named by whatever the build's VCS stamping.
var stamped string

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
