package render

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Size limits for scene input, checked before anything is parsed.
const (
	MaxSceneBytes = 64 << 20  // scene JSON
	MaxOBJBytes   = 256 << 20 // one OBJ file
	MaxTriangles  = 10_000_000
	maxCoord      = 1e9           // largest accepted coordinate or scalar magnitude
	MaxFrame      = 1_000_000_000 // largest frame number magnitude; keyframes and frames are within ±MaxFrame
)

// AssetReader returns the bytes of an asset named in a scene file, by the
// relative path as written there (slash-separated, validated).
type AssetReader func(rel string) ([]byte, error)

// Scene is a parsed, validated scene. It is safe for concurrent use: tiles of
// the same frame share one world (BVH), built on first use.
type Scene struct {
	defaults    Settings
	first, last int
	bg          background
	cameras     []camera
	materials   []material
	objects     []object
	animated    bool // some object has keyframes: the world depends on the frame
	cache       worldCache
}

// objectKind is the kind of a scene object.
type objectKind uint8

const (
	objSphere objectKind = iota
	objQuad
	objPlane
	objMesh
)

// object is a parsed object in object space with its animation.
type object struct {
	kind  objectKind
	field string // "objects[3]", for errors at world-build time
	mat   int32

	center Vec // sphere
	radius float64

	corner, u, v Vec // quad

	point, normal Vec // plane

	file   string // mesh
	mesh   *meshObject
	smooth bool

	translate, rotate, scale Vec
	tTrack, rTrack, sTrack   track
	easing                   easing
}

// transformAt evaluates the object's transform at frame f.
func (o *object) transformAt(f int) transform {
	return newTransform(
		o.tTrack.eval(f, o.easing, o.translate),
		o.rTrack.eval(f, o.easing, o.rotate),
		o.sTrack.eval(f, o.easing, o.scale),
	)
}

// ParseScene parses and validates scene JSON; OBJ meshes are read through
// read. Problems with the scene (syntax, unknown fields, bad values, missing
// or malformed assets) are *SceneError. An error from read other than
// fs.ErrNotExist is wrapped with %w and is not a *SceneError, so the caller
// decides whether, for example, a storage outage is worth a retry.
func ParseScene(data []byte, read AssetReader) (*Scene, error) {
	s, err := decodeScene(data)
	if err != nil {
		return nil, err
	}
	if err := s.loadMeshes(read, true); err != nil {
		return nil, err
	}
	return s, nil
}

// ValidateScene checks scene JSON and every asset it references exactly as ParseScene does,
// with the same errors, but builds no meshes: validating a submission costs no memory beyond
// its files.
func ValidateScene(data []byte, read AssetReader) error {
	s, err := decodeScene(data)
	if err != nil {
		return err
	}
	return s.loadMeshes(read, false)
}

// SceneInfo is what a scene file says about its settings, cameras and frames, read without
// loading its assets: enough to resolve a job's settings where nothing is rendered, at the
// cost of parsing the scene file alone.
type SceneInfo struct{ s *Scene }

// ParseSceneInfo parses and validates scene JSON like ParseScene, but reads none of its assets.
func ParseSceneInfo(data []byte) (*SceneInfo, error) {
	s, err := decodeScene(data)
	if err != nil {
		return nil, err
	}
	return &SceneInfo{s: s}, nil
}

// Resolve is Scene.Resolve.
func (i *SceneInfo) Resolve(o Overrides) (Settings, error) { return i.s.Resolve(o) }

// Frames is Scene.Frames.
func (i *SceneInfo) Frames() (first, last int) { return i.s.Frames() }

// Assets are the relative asset paths the scene references (AssetPaths).
func (i *SceneInfo) Assets() []string { return i.s.assetPaths() }

// LoadSceneFile reads a scene file and its assets from the file's directory.
func LoadSceneFile(path string) (*Scene, error) {
	data, err := readLimited(path, MaxSceneBytes)
	if err != nil {
		return nil, fmt.Errorf("loading scene %q: %w", path, err)
	}
	dir := filepath.Dir(path)
	s, err := ParseScene(data, func(rel string) ([]byte, error) {
		return readLimited(filepath.Join(dir, filepath.FromSlash(rel)), MaxOBJBytes)
	})
	if err != nil {
		return nil, fmt.Errorf("loading scene %q: %w", path, err)
	}
	return s, nil
}

// readLimited reads a regular file of at most limit bytes.
func readLimited(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, &SceneError{Field: filepath.Base(path), Msg: "not a regular file"}
	}
	if fi.Size() > limit {
		return nil, &SceneError{Field: filepath.Base(path), Msg: fmt.Sprintf("file is %d bytes, limit is %d", fi.Size(), limit)}
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, &SceneError{Field: filepath.Base(path), Msg: fmt.Sprintf("file exceeds the limit of %d bytes", limit)}
	}
	return data, nil
}

// loadMeshes reads and parses every referenced OBJ once; without keep it only validates them.
func (s *Scene) loadMeshes(read AssetReader, keep bool) error {
	loaded := map[string]*meshObject{} // kept meshes, by file
	tris := map[string]int{}           // triangles, by file
	total := 0
	for i := range s.objects {
		o := &s.objects[i]
		if o.kind != objMesh {
			continue
		}
		field := o.field + ".file"
		n, seen := tris[o.file]
		if !seen {
			var err error
			if n, err = s.loadMesh(read, o.file, field, MaxTriangles-total, keep, loaded); err != nil {
				return err
			}
			tris[o.file] = n
		}
		total += n
		if total > MaxTriangles {
			return sceneErr(field, "scene has more than %d triangles", MaxTriangles)
		}
		if !keep {
			continue
		}
		m := loaded[o.file]
		if o.smooth {
			m.computeVertexNormals()
		}
		o.mesh = m
	}
	return nil
}

// loadMesh reads one OBJ and parses it into loaded (keep) or only checks it, returning its
// triangle count.
func (s *Scene) loadMesh(read AssetReader, file, field string, maxTris int, keep bool, loaded map[string]*meshObject) (int, error) {
	if read == nil {
		return 0, sceneErr(field, "no asset reader to load %q", file)
	}
	data, err := read(file)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0, &SceneError{Field: field, Msg: fmt.Sprintf("asset %q not found", file), err: err}
		}
		var se *SceneError
		if errors.As(err, &se) {
			return 0, &SceneError{Field: field, Msg: fmt.Sprintf("reading %q: %s", file, se.Msg), err: err}
		}
		return 0, fmt.Errorf("scene: %s: reading %q: %w", field, file, err)
	}
	if len(data) > MaxOBJBytes {
		return 0, sceneErr(field, "%q is %d bytes, limit is %d", file, len(data), MaxOBJBytes)
	}
	n := 0
	if keep {
		var m *meshObject
		if m, err = parseOBJ(data, maxTris); err == nil {
			loaded[file], n = m, len(m.tris)
		}
	} else {
		n, err = checkOBJ(data, maxTris)
	}
	if err != nil {
		return 0, &SceneError{Field: field, Msg: fmt.Sprintf("%s: %v", file, err), err: err}
	}
	return n, nil
}

// Defaults returns the settings written in the scene file, with defaults for
// what it leaves out; the camera is the scene's default camera.
func (s *Scene) Defaults() Settings { return s.defaults }

// Cameras returns the camera names in file order.
func (s *Scene) Cameras() []string {
	names := make([]string, len(s.cameras))
	for i := range s.cameras {
		names[i] = s.cameras[i].name
	}
	return names
}

// Frames returns the animation's frame range from the file (default 1, 1).
func (s *Scene) Frames() (first, last int) { return s.first, s.last }

// cameraIndex returns the index of the named camera, or -1.
func (s *Scene) cameraIndex(name string) int {
	for i := range s.cameras {
		if s.cameras[i].name == name {
			return i
		}
	}
	return -1
}
