package layout

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/tilefarm/tilefarm/finalize"
)

// ScenePrefix is where scene manifests are stored.
const ScenePrefix = "scenes/"

// SceneKey is where a scene's manifest (internal/bundle) is stored, content-addressed by its
// scene version.
func SceneKey(sceneVersion string) string { return ScenePrefix + sceneVersion + ".json" }

// SceneOfKey returns the scene version of a manifest's key (SceneKey).
func SceneOfKey(key string) (string, bool) {
	v, ok := strings.CutPrefix(key, ScenePrefix)
	if !ok {
		return "", false
	}
	v, ok = strings.CutSuffix(v, ".json")
	return v, ok && v != "" && !strings.Contains(v, "/")
}

// ContentPrefix is where the files of every scene are stored, each once, by content.
const ContentPrefix = "content/"

// ContentKey is where the file of SHA-256 sha256hex is stored, whatever scene and job it came with.
func ContentKey(sha256hex string) string { return ContentPrefix + sha256hex }

// TileManifestKey is the logical key of a tile's manifest. A frame's tile manifests share the
// prefix TileManifestPrefix(frameKey), so the reconciler lists them in one call.
func TileManifestKey(frameKey, tileKey string) string { return TileManifestPrefix(frameKey) + tileKey }

// TileManifestPrefix is the logical key prefix of every tile manifest of a frame.
func TileManifestPrefix(frameKey string) string { return TileManifests + frameKey + "/" }

// TileManifests is the logical key prefix of every tile manifest.
const TileManifests = "tiles/"

// FrameManifestPrefix is the logical key prefix of every output manifest of a frame.
func FrameManifestPrefix(frameKey string) string { return "frames/" + frameKey + "/" }

// FrameManifestKey is the logical key of one output format of a frame. Each format has its own
// manifest, so a later job can ask for another format of a finished frame without touching the
// manifests readers already trust.
func FrameManifestKey(frameKey, format string) string { return FrameManifestPrefix(frameKey) + format }

// Formats are the frame output formats and their main object's name inside a frame manifest:
// the farm's 8- and 16-bit PNG and OpenEXR, and "blend", a Blender scene's own output (the file
// its Output Properties ask for, whatever its format, with its File Output nodes' files).
var formatNames = map[string]string{"png": "frame.png", "png16": "frame16.png", "exr": "frame.exr", "blend": "frame"}

// FrameIndexName is the object of a frame manifest that names its files when the renderer
// named them (FrameIndex): a Blender scene's own output.
const FrameIndexName = "index.json"

// FrameIndex names the files of a frame output: the main object's name as the renderer names
// it ("//render/plate_0001.exr", relative to the scene's directory, or absolute), and the other
// files by their path relative to the scene's directory, file i stored as FrameFileName(i).
type FrameIndex struct {
	Name  string   `json:"name"`
	Files []string `json:"files"`
}

// FrameFileName is the manifest object of a frame output's file i (FrameIndex.Files).
func FrameFileName(i int) string { return "file-" + strconv.Itoa(i) }

// FrameOutputName returns the manifest object name of a frame format, or false for an unknown one.
func FrameOutputName(format string) (string, bool) {
	n, ok := formatNames[format]
	return n, ok
}

// NormalizeFormats validates formats and returns them sorted, de-duplicated, with "png" always in.
func NormalizeFormats(formats []string) ([]string, error) {
	out := []string{"png"}
	for _, f := range formats {
		if _, ok := formatNames[f]; !ok {
			return nil, fmt.Errorf("unknown output format %q (want png, png16, exr or blend)", f)
		}
		out = append(out, f)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// CheckpointKey is where a worker uploads a tile's remote checkpoint.
func CheckpointKey(tileKey string) string { return "checkpoints/" + tileKey }

// TileOutputName is the name of a tile's float buffer inside its manifest.
const TileOutputName = "rgb.f32"

// CheckpointTile returns the tile key of a remote checkpoint's object key.
func CheckpointTile(objectKey string) (tileKey string, ok bool) {
	tileKey, ok = strings.CutPrefix(objectKey, CheckpointKey(""))
	return tileKey, ok && tileKey != ""
}

// TileManifestTile returns the tile key of a tile manifest's object key (finalize.ManifestKey
// of a TileManifestKey).
func TileManifestTile(objectKey string) (tileKey string, ok bool) {
	logical, ok := strings.CutPrefix(objectKey, finalize.ManifestPrefix)
	if !ok {
		return "", false
	}
	if logical, ok = strings.CutSuffix(logical, ".json"); !ok {
		return "", false
	}
	if logical, ok = strings.CutPrefix(logical, TileManifests); !ok {
		return "", false
	}
	_, tileKey, ok = strings.Cut(logical, "/")
	return tileKey, ok && tileKey != "" && !strings.Contains(tileKey, "/")
}

// MovieKey is the logical key of a job's preview movie (docs/design.md, "Preview movie"),
// promoted like a frame output: its manifest names one object, MovieName.
func MovieKey(jobID string) string { return "movies/" + jobID }

// The preview movie's object name in its manifest, its type on the wire and the extension of
// its files: VP9 in WebM, which Debian's Chromium plays, at any frame size.
const (
	MovieName        = "movie.webm"
	MovieContentType = "video/webm"
	MovieExt         = ".webm"
)
