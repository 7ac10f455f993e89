package bundle

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/tilefarm/tilefarm/blender"
	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/render"
)

// Limits of a scene bundle, so a bad submission cannot exhaust the coordinator.
const (
	MaxBytes  = 512 << 20
	MaxAssets = 4096
	maxPath   = 1024
)

// ErrBadBundle is wrapped by every error about a bundle's content or encoding.
var ErrInvalid = errors.New("bad scene bundle")

// Bundle is a scene file with every asset it references, as the coordinator stores it once,
// content-addressed by its scene version, and as workers fetch it.
type Bundle struct {
	Name   string            // base name of the scene file, for display only
	Scene  []byte            // the scene file
	Assets map[string][]byte // by the relative, slash-separated name the scene uses
}

// bundleMagic starts every encoded bundle; the byte after it is the format version.
const bundleMagic = "TFBUNDLE"

const bundleV1 = 1

// ReadBundle reads a scene file and the assets it names from the file's directory.
func ReadBundle(scenePath string) (*Bundle, error) {
	data, err := os.ReadFile(scenePath)
	if err != nil {
		return nil, fmt.Errorf("reading scene %q: %w", scenePath, err)
	}
	paths, err := render.AssetPaths(data)
	if err != nil {
		return nil, fmt.Errorf("scene %q: %w", scenePath, err)
	}
	b := &Bundle{Name: filepath.Base(scenePath), Scene: data, Assets: make(map[string][]byte, len(paths))}
	dir := filepath.Dir(scenePath)
	total := len(data)
	for _, rel := range paths {
		asset, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(rel)))
		if err != nil {
			return nil, fmt.Errorf("scene %q: reading asset %q: %w", scenePath, rel, err)
		}
		total += len(asset)
		if total > MaxBytes {
			return nil, fmt.Errorf("scene %q: scene and assets exceed %d MiB", scenePath, MaxBytes>>20)
		}
		b.Assets[rel] = asset
	}
	return b, nil
}

// BlendBundle reads the .blend and every file it depends on, as Inspect found them, into a
// bundle whose scene document is the description.
func BlendBundle(in *blender.Inspection) (*Bundle, error) {
	b := &Bundle{Name: path.Base(in.Desc.Blend), Scene: in.Desc.Encode(), Assets: make(map[string][]byte, len(in.Desc.Files))}
	total := len(b.Scene)
	for _, name := range in.Desc.Files {
		data, err := os.ReadFile(in.Paths[name])
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", name, err)
		}
		if total += len(data); total > MaxBytes {
			return nil, fmt.Errorf("scene %s: the .blend and its files exceed %d MiB", b.Name, MaxBytes>>20)
		}
		b.Assets[name] = data
	}
	return b, nil
}

// Version is the bundle's scene_version.
func (b *Bundle) Version() string { return identity.SceneVersion(b.Scene, b.Assets) }

// Default tile sizes, in pixels, when a submission gives none. Tile size never changes a
// pixel; it trades parallelism against per-tile cost, and a Blender tile pays a scene sync and
// a render call per pass, so Blender tiles are larger (a 1920x1080 frame is still 40 of them).
const (
	DefaultTileSize = 64
	BlenderTileSize = 256
)

// TileSize is the default tile size of the bundle's kind of scene.
func (b *Bundle) TileSize() int {
	if b.IsBlender() {
		return BlenderTileSize
	}
	return DefaultTileSize
}

// IsBlender reports whether the bundle is a Blender scene (its scene document is a
// blender.Description) rather than a tilefarm JSON scene.
func (b *Bundle) IsBlender() bool { return blender.IsDescription(b.Scene) }

// Parse parses a tilefarm JSON scene with its assets read from the bundle.
func (b *Bundle) Parse() (*render.Scene, error) { return render.ParseScene(b.Scene, b.read) }

// Blender returns a Blender scene's description.
func (b *Bundle) Blender() (*blender.Description, error) { return blender.ParseDescription(b.Scene) }

// SceneSettings is what a submission needs of a scene of either kind: its settings with a
// request's overrides applied, and its own frame range.
type SceneSettings interface {
	Resolve(render.Overrides) (render.Settings, error)
	Frames() (first, last int)
}

// Settings reads what a submission needs from the scene document alone, assets unread.
func (b *Bundle) Settings() (SceneSettings, error) {
	if b.IsBlender() {
		return b.Blender()
	}
	return render.ParseSceneInfo(b.Scene)
}

// Validate checks the scene and every asset it references, with the errors Parse gives, but
// builds nothing: it is how a submission is checked where nothing is rendered. A Blender
// scene's files must all be there and its .blend must look like one; only Blender itself can
// check more, which Inspect did where the bundle was made.
func (b *Bundle) Validate() error {
	if !b.IsBlender() {
		return render.ValidateScene(b.Scene, b.read)
	}
	d, err := b.Blender()
	if err != nil {
		return err
	}
	for _, name := range d.Files {
		if _, err := b.read(name); err != nil {
			return err
		}
	}
	if !blender.IsBlend(b.Assets[d.Blend]) {
		return fmt.Errorf("%s is not a .blend file", d.Blend)
	}
	return nil
}

// Unpack writes a Blender scene's files under dir/version for Blender to open, once.
func (b *Bundle) Unpack(dir, version string) (*blender.Scene, error) {
	d, err := b.Blender()
	if err != nil {
		return nil, err
	}
	return blender.Unpack(dir, version, d, b.read)
}

func (b *Bundle) read(rel string) ([]byte, error) {
	data, ok := b.Assets[rel]
	if !ok {
		return nil, fmt.Errorf("asset %q is not in the scene bundle: %w", rel, os.ErrNotExist)
	}
	return data, nil
}

// CheckAssets rejects a bundle carrying a file its scene does not reference: a bundle holds
// exactly what renders the scene, nothing an attacker or a stray directory could add.
func (b *Bundle) CheckAssets() error {
	var refs []string
	if b.IsBlender() {
		d, err := b.Blender()
		if err != nil {
			return fmt.Errorf("%w: %v", ErrInvalid, err)
		}
		refs = d.AssetPaths()
	} else {
		var err error
		if refs, err = render.AssetPaths(b.Scene); err != nil {
			return fmt.Errorf("%w: %v", ErrInvalid, err)
		}
	}
	for name := range b.Assets {
		if !slices.Contains(refs, name) {
			return fmt.Errorf("%w: asset %q is not referenced by the scene", ErrInvalid, name)
		}
	}
	return nil
}

// Encode serialises the bundle:
//
//	"TFBUNDLE" | version u8 | uvarint len + name | uvarint scene size | uvarint asset count |
//	per asset, by name: uvarint len + name | uvarint size
//	then the scene's bytes, then each asset's bytes in the same order.
//
// The header comes first so a decoder knows every size before it touches the content, and the
// content is stored raw so decoding needs no copy (see DecodeBundle).
func (b *Bundle) Encode() []byte {
	names := make([]string, 0, len(b.Assets))
	size := len(bundleMagic) + 1 + 3*binary.MaxVarintLen64 + len(b.Name) + len(b.Scene)
	for n, a := range b.Assets {
		names = append(names, n)
		size += 2*binary.MaxVarintLen64 + len(n) + len(a)
	}
	slices.Sort(names)
	out := make([]byte, 0, size)
	out = append(out, bundleMagic...)
	out = append(out, bundleV1)
	out = binary.AppendUvarint(out, uint64(len(b.Name)))
	out = append(out, b.Name...)
	out = binary.AppendUvarint(out, uint64(len(b.Scene)))
	out = binary.AppendUvarint(out, uint64(len(names)))
	for _, n := range names {
		out = binary.AppendUvarint(out, uint64(len(n)))
		out = append(out, n...)
		out = binary.AppendUvarint(out, uint64(len(b.Assets[n])))
	}
	out = append(out, b.Scene...)
	for _, n := range names {
		out = append(out, b.Assets[n]...)
	}
	return out
}

// DecodeBundle parses an encoded bundle. The bundle's Scene and Assets are slices of data, not
// copies, so a submission holds its bundle in memory once. Every size is checked against the
// limits and against what data holds before anything is sliced.
func Decode(data []byte) (*Bundle, error) {
	if len(data) > MaxBytes+64*1024 {
		return nil, fmt.Errorf("%w: %d bytes exceed the %d MiB limit", ErrInvalid, len(data), MaxBytes>>20)
	}
	if !bytes.HasPrefix(data, []byte(bundleMagic)) || len(data) < len(bundleMagic)+1 {
		return nil, fmt.Errorf("%w: not a tilefarm scene bundle", ErrInvalid)
	}
	if v := data[len(bundleMagic)]; v != bundleV1 {
		return nil, fmt.Errorf("%w: unknown bundle format version %d", ErrInvalid, v)
	}
	r := bundleReader{data: data, off: len(bundleMagic) + 1}
	name := r.str("scene name", 255)
	sceneSize := r.size("scene")
	count := r.uvarint("asset count")
	if r.err == nil && count > MaxAssets {
		r.err = fmt.Errorf("%w: %d assets exceed the limit of %d", ErrInvalid, count, MaxAssets)
	}
	type entry struct {
		name string
		size int
	}
	entries := make([]entry, 0, min(count, MaxAssets))
	total := sceneSize
	for i := uint64(0); i < count && r.err == nil; i++ {
		n := r.str("asset name", maxPath)
		sz := r.size("asset " + n)
		if r.err != nil {
			break
		}
		if err := checkAssetName(n); err != nil {
			return nil, err
		}
		if i > 0 && n <= entries[i-1].name {
			return nil, fmt.Errorf("%w: asset names are not sorted and unique at %q", ErrInvalid, n)
		}
		entries = append(entries, entry{n, sz})
		total += sz
	}
	if r.err != nil {
		return nil, r.err
	}
	if total > MaxBytes {
		return nil, fmt.Errorf("%w: scene and assets exceed %d MiB", ErrInvalid, MaxBytes>>20)
	}
	if rest := len(data) - r.off; rest != total {
		return nil, fmt.Errorf("%w: header declares %d content bytes, %d follow", ErrInvalid, total, rest)
	}
	b := &Bundle{Name: name, Assets: make(map[string][]byte, len(entries))}
	off := r.off
	b.Scene = data[off : off+sceneSize : off+sceneSize]
	off += sceneSize
	for _, e := range entries {
		b.Assets[e.name] = data[off : off+e.size : off+e.size]
		off += e.size
	}
	return b, nil
}

// checkAssetName accepts the relative, slash-separated names scenes use, and nothing that could
// name a file outside the scene's directory.
func checkAssetName(n string) error {
	if n == "" || strings.HasPrefix(n, "/") || strings.ContainsAny(n, "\\\x00") || path.Clean(n) != n ||
		n == ".." || strings.HasPrefix(n, "../") {
		return fmt.Errorf("%w: asset name %q is not a clean relative path", ErrInvalid, n)
	}
	return nil
}

// bundleReader reads the header of an encoded bundle; the first error sticks.
type bundleReader struct {
	data []byte
	off  int
	err  error
}

func (r *bundleReader) uvarint(what string) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.data[r.off:])
	if n <= 0 {
		r.err = fmt.Errorf("%w: truncated or malformed header at %s", ErrInvalid, what)
		return 0
	}
	r.off += n
	return v
}

func (r *bundleReader) size(what string) int {
	v := r.uvarint(what)
	if r.err == nil && v > MaxBytes {
		r.err = fmt.Errorf("%w: %s is %d bytes, over the %d MiB limit", ErrInvalid, what, v, MaxBytes>>20)
	}
	return int(v)
}

func (r *bundleReader) str(what string, limit int) string {
	n := r.uvarint(what)
	if r.err != nil {
		return ""
	}
	if n > uint64(limit) || n > uint64(len(r.data)-r.off) {
		r.err = fmt.Errorf("%w: %s of %d bytes is too long or truncated", ErrInvalid, what, n)
		return ""
	}
	s := string(r.data[r.off : r.off+int(n)])
	r.off += int(n)
	return s
}
