package finalize

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/tilefarm/tilefarm/objstore"
	"sort"
	"strings"
)

// Key prefixes of the finalization protocol.
const (
	ManifestPrefix = "manifests/"
	AttemptPrefix  = "attempts/"
)

// Manifest makes a set of uploaded objects visible under a logical key. It is
// created once with create-if-absent; readers trust only objects it names.
type Manifest struct {
	Key     string            `json:"key"`     // logical key, e.g. "tiles/<tile_key>" or "frames/<frame_key>"
	Objects []ManifestObject  `json:"objects"` // what the manifest makes visible
	Build   string            `json:"build"`   // build fingerprint supplied by the caller
	Attempt string            `json:"attempt"` // attempt that won the promotion
	Meta    map[string]string `json:"meta,omitempty"`
}

// ManifestObject is one object a manifest names, with what it must contain.
type ManifestObject struct {
	Name   string `json:"name"`
	Key    string `json:"key"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Checksum summarises the manifest's content (object names and checksums, not
// attempt, build or meta), so two promotions of the same result compare equal.
func (m Manifest) Checksum() string {
	entries := make([]string, len(m.Objects))
	for i, o := range m.Objects {
		entries[i] = o.Name + "\x00" + o.SHA256 + "\n"
	}
	sort.Strings(entries)
	sum := sha256.Sum256([]byte(strings.Join(entries, "")))
	return hex.EncodeToString(sum[:])
}

// Object returns the manifest entry called name.
func (m Manifest) Object(name string) (ManifestObject, bool) {
	for _, o := range m.Objects {
		if o.Name == name {
			return o, true
		}
	}
	return ManifestObject{}, false
}

// sameContent reports whether a and b name the same objects with the same
// checksums, compared by name and sha256.
func sameContent(a, b Manifest) bool {
	if len(a.Objects) != len(b.Objects) {
		return false
	}
	for _, o := range a.Objects {
		p, ok := b.Object(o.Name)
		if !ok || p.SHA256 != o.SHA256 {
			return false
		}
	}
	return true
}

// Output is one named result of a render attempt, e.g. "rgb" or "frame.png".
type Output struct {
	Name string
	Data []byte
}

// Promotion is the outcome of a successful Promote.
type Promotion struct {
	Manifest Manifest
	// Existing is true when identical content had already been promoted
	// (idempotent success); Manifest is then the stored one.
	Existing bool
}

// ManifestKey returns the store key of the manifest for a logical key.
func ManifestKey(key string) string { return ManifestPrefix + key + ".json" }

// AttemptKey returns the store key an attempt uploads an output to.
func AttemptKey(key, attempt, name string) string {
	return AttemptPrefix + key + "/" + attempt + "/" + name
}

// Promote makes outputs visible under key: it uploads each output to
// "attempts/<key>/<attempt>/<name>", which the store verifies as it receives it
// (objstore.Store: an S3 server checks each PUT's Content-MD5 and payload hash,
// the file store fsyncs before it renames), then creates "manifests/<key>.json"
// with create-if-absent: two requests per output and one, no read-back. Nothing
// is visible before the manifest exists.
//
// If a manifest already exists with the same checksums, Promote succeeds with
// Existing set (a retry or a duplicate delivery); with different checksums it
// fails with ErrConflict, which is terminal. Attempt ids must be unique per
// delivery: an attempt object that exists with different bytes is a conflict too.
func Promote(ctx context.Context, s objstore.Store, key, attempt, build string, outputs []Output, meta map[string]string, opts ...PromoteOption) (Promotion, error) {
	var po promoteOptions
	for _, o := range opts {
		o(&po)
	}
	want, err := newManifest(key, attempt, build, outputs, meta)
	if err != nil {
		return Promotion{}, fmt.Errorf("promoting %q: %w", key, err)
	}
	// A retry of a tile that was promoted already needs no upload at all.
	if !po.absent {
		if stored, err := ReadManifest(ctx, s, key); err == nil {
			return settle(ctx, s, stored, want)
		} else if !errors.Is(err, objstore.ErrNotFound) {
			return Promotion{}, fmt.Errorf("promoting %q: %w", key, err)
		}
	}
	for i, o := range outputs {
		if err := upload(ctx, s, want.Objects[i], o.Data); err != nil {
			return Promotion{}, fmt.Errorf("promoting %q: %w", key, err)
		}
	}
	body, err := json.MarshalIndent(want, "", "  ")
	if err != nil {
		return Promotion{}, fmt.Errorf("promoting %q: encoding manifest: %w", key, err)
	}
	err = s.PutIfAbsent(ctx, ManifestKey(key), append(body, '\n'))
	if err == nil {
		return Promotion{Manifest: want}, nil
	}
	if !errors.Is(err, objstore.ErrExists) {
		return Promotion{}, fmt.Errorf("promoting %q: %w", key, err)
	}
	stored, err := ReadManifest(ctx, s, key)
	if err != nil {
		return Promotion{}, fmt.Errorf("promoting %q: reading the manifest that won: %w", key, err)
	}
	p, err := settle(ctx, s, stored, want)
	if err == nil {
		// Our attempt objects lost the race; drop them now rather than
		// waiting for garbage collection. Never touch what the winner names.
		for _, o := range want.Objects {
			if so, ok := stored.Object(o.Name); ok && so.Key == o.Key {
				continue
			}
			_ = s.Delete(ctx, o.Key) // best effort: GC catches leftovers
		}
	}
	return p, err
}

// PromoteOption configures Promote.
type PromoteOption func(*promoteOptions)

type promoteOptions struct {
	absent bool
}

// Absent tells Promote the caller found no manifest for the key just before, so it skips
// reading it first: a store request less per promotion. It changes no outcome, only its cost:
// a manifest created in between still makes the create-if-absent fail, and Promote then
// settles with it as it would have.
func Absent() PromoteOption {
	return func(o *promoteOptions) { o.absent = true }
}

// settle compares a stored manifest with the one we wanted to promote.
func settle(ctx context.Context, s objstore.Store, stored, want Manifest) (Promotion, error) {
	if !sameContent(stored, want) {
		return Promotion{}, fmt.Errorf("promoting %q: %w: stored checksum %s (attempt %s, build %s), new checksum %s (attempt %s, build %s)",
			want.Key, ErrConflict, stored.Checksum(), stored.Attempt, stored.Build, want.Checksum(), want.Attempt, want.Build)
	}
	return Promotion{Manifest: stored, Existing: true}, nil
}

// newManifest validates the inputs and describes the objects to upload.
func newManifest(key, attempt, build string, outputs []Output, meta map[string]string) (Manifest, error) {
	if err := objstore.ValidateKey(key); err != nil {
		return Manifest{}, err
	}
	if err := validateSegment("attempt", attempt); err != nil {
		return Manifest{}, err
	}
	if len(outputs) == 0 {
		return Manifest{}, errors.New("no outputs to promote")
	}
	m := Manifest{Key: key, Build: build, Attempt: attempt, Meta: meta}
	seen := make(map[string]bool, len(outputs))
	for _, o := range outputs {
		if err := validateSegment("output name", o.Name); err != nil {
			return Manifest{}, err
		}
		if seen[o.Name] {
			return Manifest{}, fmt.Errorf("duplicate output name %q", o.Name)
		}
		seen[o.Name] = true
		sum := sha256.Sum256(o.Data)
		m.Objects = append(m.Objects, ManifestObject{
			Name:   o.Name,
			Key:    AttemptKey(key, attempt, o.Name),
			Size:   int64(len(o.Data)),
			SHA256: hex.EncodeToString(sum[:]),
		})
	}
	return m, nil
}

// validateSegment checks a value that becomes one key segment.
func validateSegment(what, v string) error {
	if strings.Contains(v, "/") {
		return fmt.Errorf("%w: %s %q contains a slash", objstore.ErrBadKey, what, v)
	}
	if err := objstore.ValidateKey(v); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// upload creates an attempt object with create-if-absent, so that a reused attempt id can
// never change bytes a manifest may already name. Identical bytes already there, from a
// retry of the same attempt, are accepted: only then is the object read.
func upload(ctx context.Context, s objstore.Store, o ManifestObject, data []byte) error {
	err := s.PutIfAbsent(ctx, o.Key, data)
	if err == nil {
		return nil
	}
	if !errors.Is(err, objstore.ErrExists) {
		return fmt.Errorf("uploading %q: %w", o.Key, err)
	}
	back, err := s.Get(ctx, o.Key)
	if err != nil {
		return fmt.Errorf("uploading %q: reading the object already there: %w", o.Key, err)
	}
	if !bytes.Equal(back, data) {
		return fmt.Errorf("uploading %q: %w: attempt object exists with different content (sha256 %s, want %s)",
			o.Key, ErrConflict, sha256Hex(back), o.SHA256)
	}
	return nil
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// ReadManifest returns the manifest promoted for key, or an error wrapping
// ErrNotFound if there is none.
func ReadManifest(ctx context.Context, s objstore.Store, key string) (Manifest, error) {
	if err := objstore.ValidateKey(key); err != nil {
		return Manifest{}, fmt.Errorf("reading manifest %q: %w", key, err)
	}
	data, err := s.Get(ctx, ManifestKey(key))
	if err != nil {
		return Manifest{}, fmt.Errorf("reading manifest %q: %w", key, err)
	}
	m, err := parseManifest(data)
	if err != nil {
		return Manifest{}, fmt.Errorf("reading manifest %q: %w", key, err)
	}
	if m.Key != key {
		return Manifest{}, fmt.Errorf("reading manifest %q: %w: it names key %q", key, objstore.ErrCorrupt, m.Key)
	}
	return m, nil
}

// parseManifest decodes and sanity-checks a manifest.
func parseManifest(data []byte) (Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return Manifest{}, fmt.Errorf("%w: manifest is not valid JSON: %v", objstore.ErrCorrupt, err)
	}
	if len(m.Objects) == 0 {
		return Manifest{}, fmt.Errorf("%w: manifest names no objects", objstore.ErrCorrupt)
	}
	// Names are unique, as newManifest makes them: Object and sameContent look objects up by
	// name, so a repeated name would be ambiguous and sameContent no longer an equality.
	seen := make(map[string]bool, len(m.Objects))
	for _, o := range m.Objects {
		if err := objstore.ValidateKey(o.Key); err != nil {
			return Manifest{}, fmt.Errorf("%w: manifest object %q: %v", objstore.ErrCorrupt, o.Name, err)
		}
		if _, err := hex.DecodeString(o.SHA256); len(o.SHA256) != 64 || err != nil || o.Size < 0 {
			return Manifest{}, fmt.Errorf("%w: manifest object %q has no valid size and sha256", objstore.ErrCorrupt, o.Name)
		}
		if seen[o.Name] {
			return Manifest{}, fmt.Errorf("%w: manifest names object %q twice", objstore.ErrCorrupt, o.Name)
		}
		seen[o.Name] = true
	}
	return m, nil
}

// ManifestExists reports whether key has been promoted. Workers call it before
// rendering so that a redelivered, already finished tile is only acked.
func ManifestExists(ctx context.Context, s objstore.Store, key string) (bool, error) {
	if err := objstore.ValidateKey(key); err != nil {
		return false, fmt.Errorf("checking manifest %q: %w", key, err)
	}
	_, err := s.Stat(ctx, ManifestKey(key))
	if err == nil {
		return true, nil
	}
	if errors.Is(err, objstore.ErrNotFound) {
		return false, nil
	}
	return false, fmt.Errorf("checking manifest %q: %w", key, err)
}

// ReadObject reads the object called name in m and verifies its size and
// sha256; a mismatch is an error wrapping ErrCorrupt.
func ReadObject(ctx context.Context, s objstore.Store, m Manifest, name string) ([]byte, error) {
	o, ok := m.Object(name)
	if !ok {
		return nil, fmt.Errorf("reading %q of %q: %w: manifest has no such object", name, m.Key, objstore.ErrNotFound)
	}
	data, err := s.Get(ctx, o.Key)
	if err != nil {
		return nil, fmt.Errorf("reading %q of %q: %w", name, m.Key, err)
	}
	if int64(len(data)) != o.Size {
		return nil, fmt.Errorf("reading %q of %q: %w: %d bytes, manifest says %d", name, m.Key, objstore.ErrCorrupt, len(data), o.Size)
	}
	if got := sha256Hex(data); got != o.SHA256 {
		return nil, fmt.Errorf("reading %q of %q: %w: sha256 %s, manifest says %s", name, m.Key, objstore.ErrCorrupt, got, o.SHA256)
	}
	return data, nil
}
