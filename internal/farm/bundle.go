package farm

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tilefarm/tilefarm/render"
	"github.com/tilefarm/tilefarm/tiles"
)

// MaxBundleBytes bounds a scene bundle so a bad submission cannot exhaust the coordinator.
const MaxBundleBytes = 512 << 20

// Bundle is a scene file with every asset it references, as the coordinator stores it once,
// content-addressed by its scene version, and as workers fetch it.
type Bundle struct {
	Name   string            `json:"name"` // base name of the scene file, for display only
	Scene  []byte            `json:"scene"`
	Assets map[string][]byte `json:"assets"`
}

// ReadBundle reads a scene file and the assets it names from the file's directory.
func ReadBundle(path string) (*Bundle, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading scene %q: %w", path, err)
	}
	paths, err := render.AssetPaths(data)
	if err != nil {
		return nil, fmt.Errorf("scene %q: %w", path, err)
	}
	b := &Bundle{Name: filepath.Base(path), Scene: data, Assets: make(map[string][]byte, len(paths))}
	dir := filepath.Dir(path)
	total := len(data)
	for _, rel := range paths {
		asset, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(rel)))
		if err != nil {
			return nil, fmt.Errorf("scene %q: reading asset %q: %w", path, rel, err)
		}
		total += len(asset)
		if total > MaxBundleBytes {
			return nil, fmt.Errorf("scene %q: scene and assets exceed %d MiB", path, MaxBundleBytes>>20)
		}
		b.Assets[rel] = asset
	}
	return b, nil
}

// Version is the bundle's scene_version.
func (b *Bundle) Version() string { return tiles.SceneVersion(b.Scene, b.Assets) }

// Parse parses the scene with its assets read from the bundle.
func (b *Bundle) Parse() (*render.Scene, error) {
	return render.ParseScene(b.Scene, func(rel string) ([]byte, error) {
		data, ok := b.Assets[rel]
		if !ok {
			return nil, fmt.Errorf("asset %q is not in the scene bundle: %w", rel, os.ErrNotExist)
		}
		return data, nil
	})
}

// Encode serialises the bundle for storage.
func (b *Bundle) Encode() ([]byte, error) { return json.Marshal(b) }

// DecodeBundle parses a stored bundle.
func DecodeBundle(data []byte) (*Bundle, error) {
	var b Bundle
	if err := json.Unmarshal(data, &b); err != nil {
		return nil, fmt.Errorf("decoding scene bundle: %w", err)
	}
	return &b, nil
}
