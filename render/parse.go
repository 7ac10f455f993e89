package render

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
)

// The scene file is decoded in two levels: the top level keeps each section
// and each array element as raw JSON, and every element is then decoded
// strictly on its own, so an error can name "objects[3].radius" rather than
// just "radius". docs/scene-format.md documents every field.

type rawScene struct {
	Settings   json.RawMessage   `json:"settings"`
	Frames     json.RawMessage   `json:"frames"`
	Background []float64         `json:"background"`
	Sky        json.RawMessage   `json:"sky"`
	Cameras    []json.RawMessage `json:"cameras"`
	Materials  []json.RawMessage `json:"materials"`
	Objects    []json.RawMessage `json:"objects"`
}

type rawSettings struct {
	Camera   *string  `json:"camera"`
	Width    *int     `json:"width"`
	Height   *int     `json:"height"`
	SPP      *int     `json:"spp"`
	MaxDepth *int     `json:"max_depth"`
	Seed     *uint64  `json:"seed"`
	Exposure *float64 `json:"exposure"`
}

type rawFrames struct {
	First *int `json:"first"`
	Last  *int `json:"last"`
}

type rawSky struct {
	Top    []float64 `json:"top"`
	Bottom []float64 `json:"bottom"`
}

type rawCamera struct {
	Name          string            `json:"name"`
	Position      []float64         `json:"position"`
	LookAt        []float64         `json:"look_at"`
	Up            []float64         `json:"up"`
	FOV           *float64          `json:"fov"`
	Aperture      *float64          `json:"aperture"`
	FocusDistance *float64          `json:"focus_distance"`
	Easing        *string           `json:"easing"`
	Keyframes     []json.RawMessage `json:"keyframes"`
}

type rawCameraKey struct {
	Frame         *int      `json:"frame"`
	Position      []float64 `json:"position"`
	LookAt        []float64 `json:"look_at"`
	Up            []float64 `json:"up"`
	FOV           *float64  `json:"fov"`
	Aperture      *float64  `json:"aperture"`
	FocusDistance *float64  `json:"focus_distance"`
}

type rawMaterial struct {
	Name      string    `json:"name"`
	Type      string    `json:"type"`
	Color     []float64 `json:"color"`
	Roughness *float64  `json:"roughness"`
	IOR       *float64  `json:"ior"`
	Emission  []float64 `json:"emission"`
	Strength  *float64  `json:"strength"`
}

type rawObject struct {
	Type      string            `json:"type"`
	Material  string            `json:"material"`
	Center    []float64         `json:"center"`
	Radius    *float64          `json:"radius"`
	Corner    []float64         `json:"corner"`
	U         []float64         `json:"u"`
	V         []float64         `json:"v"`
	Point     []float64         `json:"point"`
	Normal    []float64         `json:"normal"`
	File      *string           `json:"file"`
	Smooth    *bool             `json:"smooth"`
	Transform json.RawMessage   `json:"transform"`
	Easing    *string           `json:"easing"`
	Keyframes []json.RawMessage `json:"keyframes"`
}

type rawTransform struct {
	Translate []float64       `json:"translate"`
	Rotate    []float64       `json:"rotate"`
	Scale     json.RawMessage `json:"scale"`
}

type rawObjectKey struct {
	Frame     *int            `json:"frame"`
	Translate []float64       `json:"translate"`
	Rotate    []float64       `json:"rotate"`
	Scale     json.RawMessage `json:"scale"`
}

// decodeScene parses and validates everything except the content of assets.
func decodeScene(data []byte) (*Scene, error) {
	if len(data) > MaxSceneBytes {
		return nil, sceneErr("", "scene JSON is %d bytes, limit is %d", len(data), MaxSceneBytes)
	}
	var raw rawScene
	if err := decodeStrict(data, &raw, ""); err != nil {
		return nil, err
	}
	s := &Scene{}
	var err error
	if s.first, s.last, err = parseFrames(raw.Frames); err != nil {
		return nil, err
	}
	if s.bg, err = parseBackground(raw.Background, raw.Sky); err != nil {
		return nil, err
	}
	if err := s.parseMaterials(raw.Materials); err != nil {
		return nil, err
	}
	if err := s.parseCameras(raw.Cameras); err != nil {
		return nil, err
	}
	if err := s.parseObjects(raw.Objects); err != nil {
		return nil, err
	}
	if s.defaults, err = s.parseSettings(raw.Settings); err != nil {
		return nil, err
	}
	return s, nil
}

func parseFrames(data json.RawMessage) (int, int, error) {
	var rf rawFrames
	if data != nil {
		if err := decodeStrict(data, &rf, "frames"); err != nil {
			return 0, 0, err
		}
	}
	first, last := 1, 0
	if rf.First != nil {
		first = *rf.First
	}
	if err := checkRange("frames.first", first, -MaxFrame, MaxFrame); err != nil {
		return 0, 0, err
	}
	last = first
	if rf.Last != nil {
		last = *rf.Last
	}
	if err := checkRange("frames.last", last, -MaxFrame, MaxFrame); err != nil {
		return 0, 0, err
	}
	if last < first {
		return 0, 0, sceneErr("frames.last", "%d is before frames.first %d", last, first)
	}
	return first, last, nil
}

func parseBackground(bg []float64, sky json.RawMessage) (background, error) {
	if bg != nil && sky != nil {
		return background{}, sceneErr("sky", "give either background or sky, not both")
	}
	if sky != nil {
		var rs rawSky
		if err := decodeStrict(sky, &rs, "sky"); err != nil {
			return background{}, err
		}
		top, err := colorVec("sky.top", rs.Top, true, nil)
		if err != nil {
			return background{}, err
		}
		bottom, err := colorVec("sky.bottom", rs.Bottom, true, nil)
		if err != nil {
			return background{}, err
		}
		return background{top: top, bottom: bottom}, nil
	}
	if bg == nil {
		return background{}, nil
	}
	c, err := colorVec("background", bg, true, nil)
	return background{top: c, bottom: c}, err
}

func (s *Scene) parseSettings(data json.RawMessage) (Settings, error) {
	var rs rawSettings
	if data != nil {
		if err := decodeStrict(data, &rs, "settings"); err != nil {
			return Settings{}, err
		}
	}
	st := Settings{
		Camera:   s.cameras[0].name,
		Width:    defaultWidth,
		Height:   defaultHeight,
		SPP:      defaultSPP,
		MaxDepth: defaultMaxDepth,
	}
	if rs.Camera != nil {
		st.Camera = *rs.Camera
	}
	setInt := func(dst *int, src *int) {
		if src != nil {
			*dst = *src
		}
	}
	setInt(&st.Width, rs.Width)
	setInt(&st.Height, rs.Height)
	setInt(&st.SPP, rs.SPP)
	setInt(&st.MaxDepth, rs.MaxDepth)
	if rs.Seed != nil {
		st.Seed = *rs.Seed
	}
	if rs.Exposure != nil {
		st.Exposure = *rs.Exposure
	}
	if err := s.Validate(st); err != nil {
		return Settings{}, err
	}
	return st, nil
}

func (s *Scene) parseMaterials(raws []json.RawMessage) error {
	if len(raws) == 0 {
		return sceneErr("materials", "at least one material is required")
	}
	for i, data := range raws {
		field := fmt.Sprintf("materials[%d]", i)
		var rm rawMaterial
		if err := decodeStrict(data, &rm, field); err != nil {
			return err
		}
		m, err := parseMaterial(field, &rm)
		if err != nil {
			return err
		}
		if slices.ContainsFunc(s.materials, func(o material) bool { return o.name == m.name }) {
			return sceneErr(field+".name", "duplicate material name %q", m.name)
		}
		s.materials = append(s.materials, m)
	}
	return nil
}

func parseMaterial(field string, rm *rawMaterial) (material, error) {
	if rm.Name == "" {
		return material{}, sceneErr(field+".name", "missing material name")
	}
	typ, ok := materialTypes[rm.Type]
	if !ok {
		if rm.Type == "" {
			return material{}, sceneErr(field+".type", "missing material type (want diffuse, metal, dielectric or emissive)")
		}
		return material{}, sceneErr(field+".type", "unknown material %q (want diffuse, metal, dielectric or emissive)", rm.Type)
	}
	m := material{name: rm.Name, typ: typ}
	set := map[string]bool{
		"color": rm.Color != nil, "roughness": rm.Roughness != nil, "ior": rm.IOR != nil,
		"emission": rm.Emission != nil, "strength": rm.Strength != nil,
	}
	allowed := map[materialType][]string{
		matDiffuse:    {"color"},
		matMetal:      {"color", "roughness"},
		matDielectric: {"color", "ior"},
		matEmissive:   {"emission", "strength"},
	}[typ]
	if err := onlyFields(field, rm.Type+" material", set, allowed); err != nil {
		return material{}, err
	}
	var err error
	switch typ {
	case matDiffuse:
		m.color, err = colorVec(field+".color", rm.Color, false, &Vec{0.8, 0.8, 0.8})
	case matMetal:
		m.color, err = colorVec(field+".color", rm.Color, false, &Vec{0.9, 0.9, 0.9})
		if err == nil {
			var r float64
			r, err = scalar(field+".roughness", rm.Roughness, 0, 0, 1)
			m.alpha = r * r
		}
	case matDielectric:
		m.color, err = colorVec(field+".color", rm.Color, false, &Vec{1, 1, 1})
		if err == nil {
			m.ior, err = scalar(field+".ior", rm.IOR, 1.5, 1, 10)
		}
	case matEmissive:
		var e Vec
		var k float64
		e, err = colorVec(field+".emission", rm.Emission, true, &Vec{1, 1, 1})
		if err == nil {
			k, err = scalar(field+".strength", rm.Strength, 1, 0, maxCoord)
		}
		m.emission = e.MulScalar(k)
	}
	return m, err
}

func (s *Scene) parseCameras(raws []json.RawMessage) error {
	if len(raws) == 0 {
		return sceneErr("cameras", "at least one camera is required")
	}
	for i, data := range raws {
		field := fmt.Sprintf("cameras[%d]", i)
		var rc rawCamera
		if err := decodeStrict(data, &rc, field); err != nil {
			return err
		}
		c, err := s.parseCamera(field, &rc)
		if err != nil {
			return err
		}
		if s.cameraIndex(c.name) >= 0 {
			return sceneErr(field+".name", "duplicate camera name %q", c.name)
		}
		s.cameras = append(s.cameras, c)
	}
	return nil
}

func (s *Scene) parseCamera(field string, rc *rawCamera) (camera, error) {
	c := camera{name: rc.Name}
	if c.name == "" {
		return c, sceneErr(field+".name", "missing camera name")
	}
	var err error
	if c.position, err = vec3(field+".position", rc.Position, nil); err != nil {
		return c, err
	}
	if c.lookAt, err = vec3(field+".look_at", rc.LookAt, nil); err != nil {
		return c, err
	}
	if c.up, err = vec3(field+".up", rc.Up, &Vec{0, 1, 0}); err != nil {
		return c, err
	}
	if c.fov, err = scalar(field+".fov", rc.FOV, 40, 1e-3, 179); err != nil {
		return c, err
	}
	if c.aperture, err = scalar(field+".aperture", rc.Aperture, 0, 0, maxCoord); err != nil {
		return c, err
	}
	if c.focusDistance, err = scalar(field+".focus_distance", rc.FocusDistance, 0, 0, maxCoord); err != nil {
		return c, err
	}
	if rc.FocusDistance != nil && c.focusDistance == 0 {
		return c, sceneErr(field+".focus_distance", "must be positive (leave it out to focus on look_at)")
	}
	if c.easing, err = parseEasing(field+".easing", rc.Easing); err != nil {
		return c, err
	}
	frames := []int{s.first, s.last}
	for i, data := range rc.Keyframes {
		kf := fmt.Sprintf("%s.keyframes[%d]", field, i)
		k := &rawCameraKey{}
		if err := decodeStrict(data, k, kf); err != nil {
			return c, err
		}
		if k.Frame == nil {
			return c, sceneErr(kf+".frame", "missing keyframe frame number")
		}
		f := *k.Frame
		if err := checkRange(kf+".frame", f, -MaxFrame, MaxFrame); err != nil {
			return c, err
		}
		frames = append(frames, f)
		if err := addVecKey(&c.posTrack, kf+".position", f, k.Position); err != nil {
			return c, err
		}
		if err := addVecKey(&c.lookTrack, kf+".look_at", f, k.LookAt); err != nil {
			return c, err
		}
		if err := addVecKey(&c.upTrack, kf+".up", f, k.Up); err != nil {
			return c, err
		}
		if err := addScalarKey(&c.fovTrack, kf+".fov", f, k.FOV, 1e-3, 179); err != nil {
			return c, err
		}
		if err := addScalarKey(&c.apTrack, kf+".aperture", f, k.Aperture, 0, maxCoord); err != nil {
			return c, err
		}
		if k.FocusDistance != nil && *k.FocusDistance <= 0 {
			return c, sceneErr(kf+".focus_distance", "must be positive")
		}
		if err := addScalarKey(&c.focusTrack, kf+".focus_distance", f, k.FocusDistance, 0, maxCoord); err != nil {
			return c, err
		}
	}
	for _, t := range []*track{&c.posTrack, &c.lookTrack, &c.upTrack, &c.fovTrack, &c.apTrack, &c.focusTrack} {
		if dup, ok := sortTrack(*t); !ok {
			return c, sceneErr(field+".keyframes", "two keyframes for frame %d", dup)
		}
	}
	for _, f := range frames {
		if _, err := c.at(f); err != nil {
			return c, sceneErr(field, "%v", err)
		}
	}
	return c, nil
}

func (s *Scene) parseObjects(raws []json.RawMessage) error {
	tris := 0
	for i, data := range raws {
		field := fmt.Sprintf("objects[%d]", i)
		var ro rawObject
		if err := decodeStrict(data, &ro, field); err != nil {
			return err
		}
		o, err := s.parseObject(field, &ro)
		if err != nil {
			return err
		}
		if len(o.tTrack)+len(o.rTrack)+len(o.sTrack) > 0 {
			s.animated = true
		}
		s.objects = append(s.objects, o)
		if o.kind != objMesh {
			tris++ // every object costs a primitive: bound them like triangles
		}
		if tris > MaxTriangles {
			return sceneErr("objects", "more than %d objects", MaxTriangles)
		}
	}
	return nil
}

func (s *Scene) parseObject(field string, ro *rawObject) (object, error) {
	o := object{field: field}
	kinds := map[string]objectKind{"sphere": objSphere, "quad": objQuad, "plane": objPlane, "mesh": objMesh}
	kind, ok := kinds[ro.Type]
	if !ok {
		if ro.Type == "" {
			return o, sceneErr(field+".type", "missing object type (want sphere, quad, plane or mesh)")
		}
		return o, sceneErr(field+".type", "unknown object type %q (want sphere, quad, plane or mesh)", ro.Type)
	}
	o.kind = kind
	set := map[string]bool{
		"center": ro.Center != nil, "radius": ro.Radius != nil,
		"corner": ro.Corner != nil, "u": ro.U != nil, "v": ro.V != nil,
		"point": ro.Point != nil, "normal": ro.Normal != nil,
		"file": ro.File != nil, "smooth": ro.Smooth != nil,
	}
	allowed := map[objectKind][]string{
		objSphere: {"center", "radius"},
		objQuad:   {"corner", "u", "v"},
		objPlane:  {"point", "normal"},
		objMesh:   {"file", "smooth"},
	}[kind]
	if err := onlyFields(field, ro.Type, set, allowed); err != nil {
		return o, err
	}
	if ro.Material == "" {
		return o, sceneErr(field+".material", "missing material name")
	}
	o.mat = -1
	for i := range s.materials {
		if s.materials[i].name == ro.Material {
			o.mat = int32(i)
		}
	}
	if o.mat < 0 {
		names := make([]string, len(s.materials))
		for i := range s.materials {
			names[i] = s.materials[i].name
		}
		return o, sceneErr(field+".material", "unknown material %q (have %s)", ro.Material, quoteList(names))
	}
	var err error
	switch kind {
	case objSphere:
		if o.center, err = vec3(field+".center", ro.Center, nil); err != nil {
			return o, err
		}
		if ro.Radius == nil {
			return o, sceneErr(field+".radius", "missing")
		}
		if o.radius, err = scalar(field+".radius", ro.Radius, 0, 0, maxCoord); err != nil {
			return o, err
		}
		if o.radius <= 0 {
			return o, sceneErr(field+".radius", "must be positive, got %v", o.radius)
		}
	case objQuad:
		if o.corner, err = vec3(field+".corner", ro.Corner, nil); err != nil {
			return o, err
		}
		if o.u, err = vec3(field+".u", ro.U, nil); err != nil {
			return o, err
		}
		if o.v, err = vec3(field+".v", ro.V, nil); err != nil {
			return o, err
		}
		if _, ok := newQuad(o.corner, o.u, o.v, 0); !ok {
			return o, sceneErr(field, "quad is degenerate: u and v must be non-zero and not parallel")
		}
	case objPlane:
		if o.point, err = vec3(field+".point", ro.Point, &Vec{}); err != nil {
			return o, err
		}
		if o.normal, err = vec3(field+".normal", ro.Normal, nil); err != nil {
			return o, err
		}
		if o.normal.IsZero() {
			return o, sceneErr(field+".normal", "must be non-zero")
		}
	case objMesh:
		if ro.File == nil {
			return o, sceneErr(field+".file", "missing")
		}
		if err := validateAssetPath(*ro.File); err != nil {
			return o, sceneErr(field+".file", "%v", err)
		}
		o.file = *ro.File
		o.smooth = ro.Smooth != nil && *ro.Smooth
	}
	if err := parseObjectAnimation(field, ro, &o); err != nil {
		return o, err
	}
	return o, nil
}

// parseObjectAnimation reads the base transform and keyframes of an object.
func parseObjectAnimation(field string, ro *rawObject, o *object) error {
	o.scale = Vec{1, 1, 1}
	var err error
	if ro.Transform != nil {
		tf := field + ".transform"
		t := &rawTransform{}
		if err := decodeStrict(ro.Transform, t, tf); err != nil {
			return err
		}
		if o.translate, err = vec3(tf+".translate", t.Translate, &Vec{}); err != nil {
			return err
		}
		if o.rotate, err = vec3(tf+".rotate", t.Rotate, &Vec{}); err != nil {
			return err
		}
		if o.scale, err = parseScale(tf+".scale", t.Scale, o.kind); err != nil {
			return err
		}
	}
	if o.easing, err = parseEasing(field+".easing", ro.Easing); err != nil {
		return err
	}
	for i, data := range ro.Keyframes {
		kf := fmt.Sprintf("%s.keyframes[%d]", field, i)
		k := &rawObjectKey{}
		if err := decodeStrict(data, k, kf); err != nil {
			return err
		}
		if k.Frame == nil {
			return sceneErr(kf+".frame", "missing keyframe frame number")
		}
		f := *k.Frame
		if err := checkRange(kf+".frame", f, -MaxFrame, MaxFrame); err != nil {
			return err
		}
		if err := addVecKey(&o.tTrack, kf+".translate", f, k.Translate); err != nil {
			return err
		}
		if err := addVecKey(&o.rTrack, kf+".rotate", f, k.Rotate); err != nil {
			return err
		}
		if k.Scale != nil {
			sc, err := parseScale(kf+".scale", k.Scale, o.kind)
			if err != nil {
				return err
			}
			o.sTrack = append(o.sTrack, key{f, sc})
		}
	}
	for _, t := range []*track{&o.tTrack, &o.rTrack, &o.sTrack} {
		if dup, ok := sortTrack(*t); !ok {
			return sceneErr(field+".keyframes", "two keyframes for frame %d", dup)
		}
	}
	return nil
}

// parseScale accepts a positive number or three positive numbers. Spheres
// need a uniform scale (they stay spheres).
func parseScale(field string, data json.RawMessage, kind objectKind) (Vec, error) {
	if data == nil || string(data) == "null" {
		return Vec{1, 1, 1}, nil
	}
	var v Vec
	var x float64
	if err := decodeStrict(data, &x, field); err == nil {
		v = Vec{x, x, x}
	} else {
		var xs []float64
		if err := decodeStrict(data, &xs, field); err != nil {
			return Vec{}, sceneErr(field, "want a number or [x, y, z]: %s", strings.TrimPrefix(err.Error(), "scene: "+field+": "))
		}
		if v, err = vec3(field, xs, nil); err != nil {
			return Vec{}, err
		}
	}
	if !(v.X > 0 && v.Y > 0 && v.Z > 0) || v.MaxAbs() > maxCoord {
		return Vec{}, sceneErr(field, "components must be positive and at most %g, got [%g, %g, %g]", maxCoord, v.X, v.Y, v.Z)
	}
	if kind == objSphere && !(v.X == v.Y && v.Y == v.Z) {
		return Vec{}, sceneErr(field, "a sphere needs a uniform scale, got [%g, %g, %g]", v.X, v.Y, v.Z)
	}
	return v, nil
}

func parseEasing(field string, e *string) (easing, error) {
	if e == nil {
		return easeLinear, nil
	}
	switch *e {
	case "linear":
		return easeLinear, nil
	case "smooth":
		return easeSmooth, nil
	}
	return 0, sceneErr(field, "unknown easing %q (want linear or smooth)", *e)
}

// onlyFields rejects fields that do not apply to the kind of thing parsed.
func onlyFields(field, what string, set map[string]bool, allowed []string) error {
	names := make([]string, 0, len(set))
	for name := range set {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if set[name] && !slices.Contains(allowed, name) {
			return sceneErr(joinField(field, name), "not used by a %s", what)
		}
	}
	return nil
}

// vec3 validates a 3-component vector; def is used when v is absent (nil
// def: required).
func vec3(field string, v []float64, def *Vec) (Vec, error) {
	if v == nil {
		if def == nil {
			return Vec{}, sceneErr(field, "missing (want [x, y, z])")
		}
		return *def, nil
	}
	if len(v) != 3 {
		return Vec{}, sceneErr(field, "want 3 numbers, got %d", len(v))
	}
	for i, x := range v {
		if math.IsNaN(x) || math.IsInf(x, 0) || math.Abs(x) > maxCoord {
			return Vec{}, sceneErr(fmt.Sprintf("%s[%d]", field, i), "must be finite and within ±%g, got %v", maxCoord, x)
		}
	}
	return Vec{v[0], v[1], v[2]}, nil
}

// colorVec validates a linear RGB colour: components >= 0, and <= 1 unless
// unbounded (emission, sky).
func colorVec(field string, v []float64, unbounded bool, def *Vec) (Vec, error) {
	c, err := vec3(field, v, def)
	if err != nil {
		return c, err
	}
	hi := 1.0
	if unbounded {
		hi = maxCoord
	}
	for i := range 3 {
		if x := c.Axis(i); x < 0 || x > hi {
			return Vec{}, sceneErr(fmt.Sprintf("%s[%d]", field, i), "must be between 0 and %g, got %v", hi, x)
		}
	}
	return c, nil
}

// scalar validates an optional number in [lo, hi].
func scalar(field string, v *float64, def, lo, hi float64) (float64, error) {
	if v == nil {
		return def, nil
	}
	x := *v
	if math.IsNaN(x) || x < lo || x > hi {
		return 0, sceneErr(field, "must be between %g and %g, got %v", lo, hi, x)
	}
	return x, nil
}

func addVecKey(t *track, field string, f int, v []float64) error {
	if v == nil {
		return nil
	}
	x, err := vec3(field, v, nil)
	if err != nil {
		return err
	}
	*t = append(*t, key{f, x})
	return nil
}

func addScalarKey(t *track, field string, f int, v *float64, lo, hi float64) error {
	if v == nil {
		return nil
	}
	x, err := scalar(field, v, 0, lo, hi)
	if err != nil {
		return err
	}
	*t = append(*t, key{f, Vec{X: x}})
	return nil
}
