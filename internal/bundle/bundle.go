package bundle

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/tilefarm/tilefarm/identity"
)

// Limits of a scene bundle, so a bad submission cannot exhaust the coordinator.
const (
	MaxBytes  = 512 << 20
	MaxAssets = 4096
	maxPath   = 1024
)

// ErrInvalid is wrapped by every error about a bundle's content or encoding.
var ErrInvalid = errors.New("bad scene bundle")

// Bundle is a scene document with every file it references, as the coordinator stores it
// once, content-addressed by its scene version, and as workers fetch it.
type Bundle struct {
	Name   string            // base name of the scene file, for display only
	Scene  []byte            // the scene document (a tilefarm JSON scene, a Blender scene description, ...)
	Assets map[string][]byte // by the relative, slash-separated name the scene uses
}

// magic starts every encoded bundle; the byte after it is the format version.
const magic = "TFBUNDLE"

const formatV1 = 1

// FromFiles makes the bundle of a scene document named name and the files it needs: each of
// names, read from where path says it is on disk, within MaxBytes in all.
func FromFiles(name string, scene []byte, names []string, path func(name string) string) (*Bundle, error) {
	b := &Bundle{Name: name, Scene: scene, Assets: make(map[string][]byte, len(names))}
	total := len(scene)
	for _, n := range names {
		data, err := os.ReadFile(path(n))
		if err != nil {
			return nil, fmt.Errorf("reading asset %q: %w", n, err)
		}
		if total += len(data); total > MaxBytes {
			return nil, fmt.Errorf("the scene and its files exceed %d MiB", MaxBytes>>20)
		}
		b.Assets[n] = data
	}
	return b, nil
}

// Version is the bundle's scene_version.
func (b *Bundle) Version() string { return identity.SceneVersion(b.Scene, b.Assets) }

// Asset returns the content of the bundle file the scene names rel; one the bundle does not
// carry wraps os.ErrNotExist. It is the asset reader a scene is parsed and unpacked with.
func (b *Bundle) Asset(rel string) ([]byte, error) {
	data, ok := b.Assets[rel]
	if !ok {
		return nil, fmt.Errorf("asset %q is not in the scene bundle: %w", rel, os.ErrNotExist)
	}
	return data, nil
}

// Encode serialises the bundle:
//
//	"TFBUNDLE" | version u8 | uvarint len + name | uvarint scene size | uvarint asset count |
//	per asset, by name: uvarint len + name | uvarint size
//	then the scene's bytes, then each asset's bytes in the same order.
//
// The header comes first so a decoder knows every size before it touches the content, and the
// content is stored raw so decoding needs no copy (see Decode).
func (b *Bundle) Encode() []byte {
	names := make([]string, 0, len(b.Assets))
	size := len(magic) + 1 + 3*binary.MaxVarintLen64 + len(b.Name) + len(b.Scene)
	for n, a := range b.Assets {
		names = append(names, n)
		size += 2*binary.MaxVarintLen64 + len(n) + len(a)
	}
	slices.Sort(names)
	out := make([]byte, 0, size)
	out = append(out, magic...)
	out = append(out, formatV1)
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

// Decode parses an encoded bundle. The bundle's Scene and Assets are slices of data, not
// copies, so a submission holds its bundle in memory once. Every size is checked against the
// limits and against what data holds before anything is sliced. The encoding is canonical:
// varints are minimal and assets sorted by name, unique, so a bundle Decode accepts Encodes to
// exactly the bytes it was decoded from.
func Decode(data []byte) (*Bundle, error) {
	if len(data) > MaxBytes+64*1024 {
		return nil, fmt.Errorf("%w: %d bytes exceed the %d MiB limit", ErrInvalid, len(data), MaxBytes>>20)
	}
	if !bytes.HasPrefix(data, []byte(magic)) || len(data) < len(magic)+1 {
		return nil, fmt.Errorf("%w: not a tilefarm scene bundle", ErrInvalid)
	}
	if v := data[len(magic)]; v != formatV1 {
		return nil, fmt.Errorf("%w: unknown bundle format version %d", ErrInvalid, v)
	}
	r := bundleReader{data: data, off: len(magic) + 1}
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
	// A varint of more than one byte ending in a zero byte has padding Encode never writes
	// (0x80 0x00 for 0): refused, so each bundle has one encoding and decodes only from it.
	if n > 1 && r.data[r.off+n-1] == 0 {
		r.err = fmt.Errorf("%w: non-minimal varint at %s", ErrInvalid, what)
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
