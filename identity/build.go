package identity

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/tilefarm/tilefarm/render"
)

// BuildFingerprint identifies the build that rendered something: all workers of a farm must run
// the same one, and every manifest records it.
func BuildFingerprint() string {
	amd64 := ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "GOAMD64" {
				amd64 = "/" + s.Value
			}
		}
	}
	return fmt.Sprintf("%s %s%s render/%s", runtime.Version(), runtime.GOARCH, amd64, render.Version)
}

// BuildFor is the build fingerprint of tiles and frames rendered with st: this build's, plus
// the external renderer's (Blender's version, Cycles kernel and BVH) for scenes that need one.
// Manifests and checkpoints record it, so neither is ever mixed across builds.
func BuildFor(st render.Settings) string {
	if st.Build == "" {
		return BuildFingerprint()
	}
	return BuildFingerprint() + "; " + st.Build
}
