package bundle

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/internal/content"
)

// Limits bound what a scene manifest may name, so a bad submission cannot exhaust the
// coordinator: an operator sets them (coordinator serve --max-scene-files, --max-scene-bytes);
// nothing is held in memory per byte of content, so the defaults are far above a studio shot.
type Limits struct {
	Files int   // files a scene may name
	Bytes int64 // bytes of content in all; 0 is no limit
}

// DefaultLimits are the limits of a coordinator that sets none.
var DefaultLimits = Limits{Files: 1_000_000}

const (
	maxPath     = 1024
	maxScene    = 64 << 20  // the scene document itself (a tilefarm JSON scene, a .blend's description)
	maxFileSize = 1 << 50   // one file: a size no disk holds is a bad manifest
	maxManifest = 128 << 20 // read whole, decoded and re-encoded once: a few times this in memory
)

// ErrInvalid is wrapped by every error about a manifest's content or encoding.
var ErrInvalid = errors.New("bad scene manifest")

// ErrMissing is wrapped when a file the scene names cannot be read from where the bundle's
// content is (not uploaded, not on the share, not in the cache).
var ErrMissing = errors.New("scene file missing")

// File is one file of a scene, by content: it is stored once in the object store under its
// SHA-256 (layout.ContentKey) and never uploaded again by any job, and a worker keeps it on
// its disk under the same hash (internal/content). A file on the studio's shared storage
// travels by the share instead: Shared is its slash-separated path under the share's root,
// and nothing of it is uploaded.
type File struct {
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	Shared string `json:"shared,omitempty"`
}

// Source reads the content of a scene's files: the artist's disk at submit, the object store
// at the coordinator, a worker's cache. Open streams, so no file is ever held whole.
type Source interface {
	Open(ctx context.Context, name string, f File) (io.ReadCloser, error)
}

// Pather is a Source that has each file on the local disk (the artist's files at submit, a
// worker's cache): Path returns where, verified against f, so a scene can be unpacked by
// hard links rather than copies.
type Pather interface {
	Path(ctx context.Context, name string, f File) (string, error)
}

// Bundle is a scene's manifest: the scene document, and every file it needs by the relative,
// slash-separated name the scene uses, by content. Its version (Version) covers every byte a
// frame renders from, so a frame's identity does too. Where the files' content is read from is
// its Source (WithSource), never part of it.
type Bundle struct {
	Name  string          // base name of the scene file, for display only
	Scene []byte          // the scene document (a tilefarm JSON scene, a Blender scene description, ...)
	Files map[string]File // by the relative, slash-separated name the scene uses
	// SharedRoot is the studio's share as the submitter named it (submit --shared), where the
	// files whose File.Shared is set lie; a worker reads them under its mount of that root.
	SharedRoot string
	src        Source
}

// WithSource returns b reading its files' content from src.
func (b *Bundle) WithSource(src Source) *Bundle {
	c := *b
	c.src = src
	return &c
}

// Source returns where b reads its files' content from (nil: nowhere).
func (b *Bundle) Source() Source { return b.src }

// Version is the bundle's scene_version: the hash of its manifest.
func (b *Bundle) Version() string {
	files := make(map[string]identity.SceneFile, len(b.Files))
	for n, f := range b.Files {
		files[n] = identity.SceneFile{Size: f.Size, SHA256: f.SHA256, Shared: f.Shared}
	}
	return identity.SceneVersion(b.Scene, b.SharedRoot, files)
}

// Names returns the files' names, sorted.
func (b *Bundle) Names() []string { return slices.Sorted(maps.Keys(b.Files)) }

// Bytes is the content the bundle names, in all, and what of it is on the share.
func (b *Bundle) Bytes() (total, shared int64) {
	for _, f := range b.Files {
		total += f.Size
		if f.Shared != "" {
			shared += f.Size
		}
	}
	return total, shared
}

// Open streams the content of the file the scene names rel; one the bundle does not name
// wraps os.ErrNotExist.
func (b *Bundle) Open(ctx context.Context, rel string) (io.ReadCloser, error) {
	f, ok := b.Files[rel]
	if !ok {
		return nil, fmt.Errorf("asset %q is not in the scene bundle: %w", rel, os.ErrNotExist)
	}
	if b.src == nil {
		return nil, fmt.Errorf("asset %q: %w: the bundle has no source of content", rel, ErrMissing)
	}
	return b.src.Open(ctx, rel, f)
}

// Assets returns a reader of whole files bound to ctx, the asset reader a scene of small files
// is parsed and loaded with (a tilefarm JSON scene's meshes and textures, which its renderer
// holds in memory anyway). A file larger than limit bytes is refused rather than read.
func (b *Bundle) Assets(ctx context.Context, limit int64) func(rel string) ([]byte, error) {
	return func(rel string) ([]byte, error) {
		if f, ok := b.Files[rel]; ok && limit > 0 && f.Size > limit {
			return nil, fmt.Errorf("asset %q is %d bytes, over the %d MiB this kind reads into memory", rel, f.Size, limit>>20)
		}
		r, err := b.Open(ctx, rel)
		if err != nil {
			return nil, err
		}
		defer r.Close()
		data, err := io.ReadAll(r)
		if err != nil {
			return nil, fmt.Errorf("reading asset %q: %w", rel, err)
		}
		return data, nil
	}
}

// Head returns up to n first bytes of the file rel, for a check of its kind (a .blend's
// header) that must not read a studio file whole.
func (b *Bundle) Head(ctx context.Context, rel string, n int) ([]byte, error) {
	r, err := b.Open(ctx, rel)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	buf := make([]byte, n)
	k, err := io.ReadFull(r, buf)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("reading asset %q: %w", rel, err)
	}
	return buf[:k], nil
}

// FromMemory makes the bundle of a scene document and files held in memory (the built-in
// scenes, tests, the fleet benchmark): each file's content is hashed here, and the bundle
// reads it back from memory.
func FromMemory(name string, scene []byte, assets map[string][]byte) *Bundle {
	b := &Bundle{Name: name, Scene: scene, Files: make(map[string]File, len(assets))}
	for n, data := range assets {
		sum := sha256.Sum256(data)
		b.Files[n] = File{Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}
	}
	b.src = memory(assets)
	return b
}

// memory is the Source of FromMemory.
type memory map[string][]byte

func (m memory) Open(_ context.Context, name string, _ File) (io.ReadCloser, error) {
	data, ok := m[name]
	if !ok {
		return nil, fmt.Errorf("asset %q: %w", name, ErrMissing)
	}
	return io.NopCloser(bytes.NewReader(data)), nil
}

// manifest is the encoding of a Bundle.
type manifest struct {
	Format     string          `json:"format"`
	Name       string          `json:"name"`
	Scene      []byte          `json:"scene"`
	Files      map[string]File `json:"files"`
	SharedRoot string          `json:"shared_root,omitempty"`
}

// Format names the manifest encoding.
const Format = "tilefarm-scene/2"

// Encode serialises the manifest (not the content): JSON, files by name (encoding/json sorts
// map keys), so one bundle always encodes to the same bytes.
func (b *Bundle) Encode() []byte {
	files := b.Files
	if files == nil {
		files = map[string]File{}
	}
	data, err := json.Marshal(manifest{Format: Format, Name: b.Name, Scene: b.Scene, Files: files, SharedRoot: b.SharedRoot})
	if err != nil { // only for values json cannot encode, which a Bundle has none of
		panic(fmt.Sprintf("bundle: encoding a manifest: %v", err))
	}
	return data
}

// MaxEncoded is the most bytes the encoding of a manifest within limits can take: what a
// coordinator reads of an upload before it refuses it.
// It is at most maxManifest whatever the limits: a manifest is read whole, and a million files
// of paths of realistic length fit in it.
func (l Limits) MaxEncoded() int64 {
	const perFile = 2*maxPath + 200 // name, share path, size, hash and punctuation
	return min(int64(maxScene)*4/3+1024+int64(l.Files)*perFile, maxManifest)
}

// Decode parses an encoded manifest and checks it against limits: every name a clean relative
// path, every hash 64 lowercase hex digits, every size possible, the scene document and the
// files within limits. The encoding is canonical: a manifest Decode accepts Encodes to exactly
// the bytes it was decoded from.
func Decode(data []byte, limits Limits) (*Bundle, error) {
	if int64(len(data)) > limits.MaxEncoded() {
		return nil, fmt.Errorf("%w: %d bytes exceed what a manifest of %d files can take", ErrInvalid, len(data), limits.Files)
	}
	var m manifest
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if m.Format != Format {
		return nil, fmt.Errorf("%w: format %q, want %q", ErrInvalid, m.Format, Format)
	}
	if len(m.Name) > 255 {
		return nil, fmt.Errorf("%w: a scene name of %d bytes", ErrInvalid, len(m.Name))
	}
	if len(m.Scene) > maxScene {
		return nil, fmt.Errorf("%w: a scene document of %d bytes exceeds %d MiB", ErrInvalid, len(m.Scene), maxScene>>20)
	}
	if len(m.Files) > limits.Files {
		return nil, fmt.Errorf("%w: %d files exceed this farm's limit of %d (coordinator serve --max-scene-files)", ErrInvalid, len(m.Files), limits.Files)
	}
	if len(m.SharedRoot) > maxPath || strings.ContainsRune(m.SharedRoot, 0) {
		return nil, fmt.Errorf("%w: a shared root of %d bytes", ErrInvalid, len(m.SharedRoot))
	}
	var total int64
	shared := false
	for n, f := range m.Files {
		shared = shared || f.Shared != ""
		if err := checkAssetName(n); err != nil {
			return nil, err
		}
		if err := checkFile(n, f); err != nil {
			return nil, err
		}
		total += f.Size
	}
	if shared != (m.SharedRoot != "") {
		return nil, fmt.Errorf("%w: files on a share need the share's root, and a root needs files on it", ErrInvalid)
	}
	if limits.Bytes > 0 && total > limits.Bytes {
		return nil, fmt.Errorf("%w: %d bytes of files exceed this farm's limit of %d (coordinator serve --max-scene-bytes)", ErrInvalid, total, limits.Bytes)
	}
	b := &Bundle{Name: m.Name, Scene: m.Scene, Files: m.Files, SharedRoot: m.SharedRoot}
	if b.Files == nil {
		b.Files = map[string]File{}
	}
	if !bytes.Equal(b.Encode(), data) {
		return nil, fmt.Errorf("%w: not in canonical form (re-encode it with Encode)", ErrInvalid)
	}
	return b, nil
}

// checkFile checks one entry's size, hash and share path.
func checkFile(name string, f File) error {
	if f.Size < 0 || f.Size > maxFileSize {
		return fmt.Errorf("%w: file %q has size %d", ErrInvalid, name, f.Size)
	}
	if !content.ValidSHA256(f.SHA256) {
		return fmt.Errorf("%w: file %q has hash %q, want 64 lowercase hex digits", ErrInvalid, name, f.SHA256)
	}
	if f.Shared != "" {
		if err := checkAssetName(f.Shared); err != nil {
			return fmt.Errorf("file %q: its path on the share: %w", name, err)
		}
	}
	return nil
}

// checkAssetName accepts the relative, slash-separated names scenes use, and nothing that could
// name a file outside the scene's directory.
func checkAssetName(n string) error {
	if n == "" || len(n) > maxPath || strings.HasPrefix(n, "/") || strings.ContainsAny(n, "\\\x00") || path.Clean(n) != n ||
		n == ".." || strings.HasPrefix(n, "../") {
		return fmt.Errorf("%w: asset name %q is not a clean relative path", ErrInvalid, n)
	}
	return nil
}

// CheckName reports whether n is a name a scene may give one of its files.
func CheckName(n string) error { return checkAssetName(n) }

// FromFiles makes the bundle of a scene document named name and the files it needs on this
// machine's disk: each of names, at path(name), hashed as it streams through SHA-256 (several
// files at a time), never read whole. The bundle reads them back from there (its Source is also
// a Pather), so an upload streams each file from the artist's disk.
func FromFiles(ctx context.Context, name string, scene []byte, names []string, path func(name string) string) (*Bundle, error) {
	paths := make([]string, len(names))
	for i, n := range names {
		paths[i] = path(n)
	}
	refs, err := content.HashFiles(ctx, paths, 0, nil)
	if err != nil {
		return nil, fmt.Errorf("reading the scene's files: %w", err)
	}
	b := &Bundle{Name: name, Scene: scene, Files: make(map[string]File, len(names))}
	src := make(local, len(names))
	for i, n := range names {
		b.Files[n] = File{Size: refs[i].Size, SHA256: refs[i].SHA256}
		src[n] = paths[i]
	}
	b.src = src
	return b, nil
}

// local is the Source of FromFiles: each file's path on this machine.
type local map[string]string

func (l local) Open(_ context.Context, name string, _ File) (io.ReadCloser, error) {
	p, ok := l[name]
	if !ok {
		return nil, fmt.Errorf("asset %q: %w", name, ErrMissing)
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("asset %q: %w", name, err)
	}
	return f, nil
}

func (l local) Path(_ context.Context, name string, _ File) (string, error) {
	p, ok := l[name]
	if !ok {
		return "", fmt.Errorf("asset %q: %w", name, ErrMissing)
	}
	return p, nil
}

// Share marks the files of a bundle read from this machine's disk (FromFiles) that lie under
// root, the studio's shared storage as this machine mounts it, as travelling by the share:
// their path under root is recorded and they are not uploaded; workers read them from their
// own mount of it (tileworker --shared) and verify each against its hash. It returns how many
// files it marked.
func (b *Bundle) Share(root string) (int, error) {
	src, ok := b.src.(local)
	if !ok {
		return 0, errors.New("only a scene read from this machine's disk can name files on a share")
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return 0, fmt.Errorf("shared root %q: %w", root, err)
	}
	if fi, err := os.Stat(abs); err != nil || !fi.IsDir() {
		return 0, fmt.Errorf("shared root %q is not a directory on this machine", root)
	}
	n := 0
	for name, p := range src {
		ap, err := filepath.Abs(p)
		if err != nil {
			return 0, fmt.Errorf("asset %q: %w", name, err)
		}
		rel, err := filepath.Rel(abs, ap)
		if err != nil || !filepath.IsLocal(rel) {
			continue
		}
		f := b.Files[name]
		f.Shared = filepath.ToSlash(rel)
		b.Files[name] = f
		n++
	}
	if n > 0 {
		b.SharedRoot = abs // as every submitter on this machine names it, whatever its directory
	}
	return n, nil
}
