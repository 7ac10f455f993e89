package render

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
)

// AssetPaths lists, sorted and de-duplicated, the relative asset paths a
// scene file references, after validating the scene's structure and each
// path (relative, slash-separated, clean, no "..", no backslash or drive).
// The farm hashes and bundles the scene from this list.
func AssetPaths(data []byte) ([]string, error) {
	s, err := decodeScene(data)
	if err != nil {
		return nil, err
	}
	return s.assetPaths(), nil
}

// assetPaths lists the scene's asset paths, sorted and de-duplicated.
func (s *Scene) assetPaths() []string {
	var paths []string
	for i := range s.objects {
		if s.objects[i].kind == objMesh {
			paths = append(paths, s.objects[i].file)
		}
	}
	slices.Sort(paths)
	return slices.Compact(paths)
}

// validateAssetPath accepts only clean, relative, slash-separated paths that
// stay inside the scene's directory, so an asset name can never reach
// outside a bundle or differ between operating systems.
func validateAssetPath(p string) error {
	switch {
	case p == "":
		return errors.New("empty asset path")
	case strings.ContainsRune(p, 0) || strings.ContainsAny(p, "\r\n"):
		return fmt.Errorf("asset path %q contains control characters", p)
	case strings.Contains(p, `\`):
		return fmt.Errorf("asset path %q contains a backslash: use / as separator", p)
	case strings.HasPrefix(p, "/"):
		return fmt.Errorf("asset path %q is absolute: it must be relative to the scene file", p)
	case len(p) >= 2 && p[1] == ':':
		return fmt.Errorf("asset path %q has a drive letter: it must be relative to the scene file", p)
	case strings.Contains(p, ":"):
		return fmt.Errorf("asset path %q contains ':'", p)
	}
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return fmt.Errorf("asset path %q contains \"..\": it must stay inside the scene's directory", p)
		}
	}
	if c := path.Clean(p); c != p || c == "." {
		return fmt.Errorf("asset path %q is not clean (want %q)", p, c)
	}
	return nil
}
