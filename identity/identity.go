package identity

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"sort"

	"github.com/tilefarm/tilefarm/render"
)

// Domain tags keep the hashes of different identities apart: the same bytes
// hashed as a frame key and as a tile key never give the same value. Bumping a
// tag's version deliberately changes every identity of that kind.
const (
	tagSceneVersion   = "tilefarm/scene_version/v2"
	tagSettingsHash   = "tilefarm/settings_hash/v1"
	tagSettingsRaw    = "tilefarm/settings_hash_unmarshalable/v1"
	tagFrameKey       = "tilefarm/frame_key/v1"
	tagTileKey        = "tilefarm/tile_key/v1"
	tagInputHash      = "tilefarm/input_hash/v1"
	tagJobID          = "tilefarm/job_id/v1"
	tagDerivedIdemKey = "tilefarm/derived_idempotency_key/v1"
	tagPayloadHash    = "tilefarm/payload_hash/v1"
)

// fieldHasher builds a sha256 over a domain tag followed by length-prefixed
// fields, so that no two different field lists hash the same bytes (for
// example ("ab","c") and ("a","bc")).
type fieldHasher struct {
	h   hash.Hash
	buf [8]byte
}

// newFieldHasher starts a hash with tag followed by a NUL byte. Tags contain
// no NUL, so one tag is never a prefix of another's input.
func newFieldHasher(tag string) *fieldHasher {
	f := &fieldHasher{h: sha256.New()}
	f.h.Write([]byte(tag))
	f.h.Write([]byte{0})
	return f
}

// bytes writes an 8-byte big-endian length and then b.
func (f *fieldHasher) bytes(b []byte) {
	binary.BigEndian.PutUint64(f.buf[:], uint64(len(b)))
	f.h.Write(f.buf[:])
	f.h.Write(b)
}

// str writes s as a length-prefixed field.
func (f *fieldHasher) str(s string) { f.bytes([]byte(s)) }

// int writes i as a fixed 8-byte big-endian two's complement field.
func (f *fieldHasher) int(i int) {
	binary.BigEndian.PutUint64(f.buf[:], uint64(int64(i)))
	f.h.Write(f.buf[:])
}

// rect writes the four corners of r in X0, Y0, X1, Y1 order.
func (f *fieldHasher) rect(r render.Rect) {
	f.int(r.X0)
	f.int(r.Y0)
	f.int(r.X1)
	f.int(r.Y1)
}

// hex returns the lowercase hex of the full sha256.
func (f *fieldHasher) hex() string { return hex.EncodeToString(f.h.Sum(nil)) }

// SceneFile is one file of a scene as its manifest names it: by content (size and SHA-256),
// and where it travels from when that is the studio's shared storage.
type SceneFile struct {
	Size   int64
	SHA256 string
	Shared string
}

// SceneVersion hashes a scene's manifest: the scene file, and every file it references by the
// relative name the scene uses for it, its size and its SHA-256, never by local path or
// modification time: the same scene on two machines gets the same version, and changing one
// byte of one file gets a new one, since its hash changes. Map iteration order does not
// matter; names are hashed exactly as given (callers pass the slash-separated relative names
// the scene refers to). sharedRoot is the studio share its shared files lie under, as the
// submitter named it ("" for none).
func SceneVersion(scene []byte, sharedRoot string, files map[string]SceneFile) string {
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)

	f := newFieldHasher(tagSceneVersion)
	f.bytes(scene)
	f.str(sharedRoot)
	f.int(len(names))
	for _, name := range names {
		sf := files[name]
		f.str(name)
		f.int(int(sf.Size))
		f.str(sf.SHA256)
		f.str(sf.Shared)
	}
	return f.hex()
}

// canonicalSettingsJSON returns st as JSON with object keys sorted and
// numbers kept exactly as encoding/json wrote them, so the hash does not
// depend on the order of struct fields in the Go source.
func canonicalSettingsJSON(st render.Settings) ([]byte, error) {
	raw, err := json.Marshal(st)
	if err != nil {
		return nil, fmt.Errorf("encoding settings: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("re-reading settings json: %w", err)
	}
	out, err := json.Marshal(v) // maps marshal with sorted keys
	if err != nil {
		return nil, fmt.Errorf("canonicalizing settings json: %w", err)
	}
	return out, nil
}

// SettingsHash is the sha256 of the canonical JSON of the resolved render
// settings together with render.Version, so a renderer change that alters
// pixels (and bumps render.Version) changes every frame key.
//
// Settings should be validated before hashing; settings that JSON cannot
// encode (NaN or Inf) still hash deterministically, under a separate domain
// tag, rather than panicking.
func SettingsHash(st render.Settings) string {
	canon, err := canonicalSettingsJSON(st)
	if err != nil {
		f := newFieldHasher(tagSettingsRaw)
		f.str(render.Version)
		f.str(fmt.Sprintf("%#v", st))
		return f.hex()
	}
	f := newFieldHasher(tagSettingsHash)
	f.str(render.Version)
	f.bytes(canon)
	return f.hex()
}

// FrameKey identifies one rendered frame: the same scene version, camera,
// frame number and settings always give the same key, whichever job asks for
// it. Tile size is deliberately absent: pixels do not depend on tiling.
func FrameKey(sceneVersion, camera string, frame int, settingsHash string) string {
	f := newFieldHasher(tagFrameKey)
	f.str(sceneVersion)
	f.str(camera)
	f.int(frame)
	f.str(settingsHash)
	return f.hex()
}

// TileKey identifies one pixel rectangle of one frame. It is used as the
// Nats-Msg-Id, the KV lease key, the checkpoint key and the object key, so it
// is plain lowercase hex with no user-controlled characters.
func TileKey(frameKey string, r render.Rect) string {
	f := newFieldHasher(tagTileKey)
	f.str(frameKey)
	f.rect(r)
	return f.hex()
}

// InputHash covers everything that determines a tile's pixels (scene
// version, resolved settings, render.Version, frame and rectangle). A
// checkpoint is resumed only when its input hash matches, so a checkpoint
// written by an older renderer or for other settings is never reused.
func InputHash(sceneVersion string, st render.Settings, frame int, r render.Rect) string {
	return InputHashFor(sceneVersion, SettingsHash(st), frame, r)
}

// InputHashFor is InputHash with the settings already hashed by SettingsHash, for callers
// deriving many tiles of one frame.
func InputHashFor(sceneVersion, settingsHash string, frame int, r render.Rect) string {
	f := newFieldHasher(tagInputHash)
	f.str(render.Version)
	f.str(sceneVersion)
	f.str(settingsHash)
	f.int(frame)
	f.rect(r)
	return f.hex()
}

// JobID derives the job id the artist holds from the submission's
// idempotency key, so resubmitting with the same key returns the same job.
func JobID(idempotencyKey string) string {
	f := newFieldHasher(tagJobID)
	f.str(idempotencyKey)
	return "job-" + f.hex()[:24]
}

// DerivedIdempotencyKey is the idempotency key used when the artist gives
// none: two submissions of the same project, scene, camera, frame range,
// settings and output formats are the same request. Formats are in it because
// the payload hash covers them: asking for EXR after PNG is a new request, not
// a conflict. formats must be sorted.
func DerivedIdempotencyKey(project, sceneVersion, camera string, first, last, step int, settingsHash string, formats []string) string {
	f := newFieldHasher(tagDerivedIdemKey)
	f.str(project)
	f.str(sceneVersion)
	f.str(camera)
	f.int(first)
	f.int(last)
	if step > 1 { // a job of every frame keeps the key it had before frame steps
		f.str("step")
		f.int(step)
	}
	f.str(settingsHash)
	f.int(len(formats))
	for _, fm := range formats {
		f.str(fm)
	}
	return f.hex()
}

// PayloadHash hashes the canonical submission, so the same idempotency key
// with a different payload is detected as a conflict instead of silently
// returning the earlier job.
func PayloadHash(canonicalSubmission []byte) string {
	f := newFieldHasher(tagPayloadHash)
	f.bytes(canonicalSubmission)
	return f.hex()
}

// NewAttemptID returns 16 random lowercase hex characters from crypto/rand,
// fresh for every delivery of a tile, used in logs, as lease owner and in
// temporary object names.
func NewAttemptID() string {
	var b [8]byte
	// crypto/rand.Read never returns an error (it aborts the program if the
	// system's random source fails), so the error is not checked.
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
