package render

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
)

// objError is a syntax or reference error in an OBJ file, with its line.
type objError struct {
	line int
	msg  string
}

func (e *objError) Error() string { return fmt.Sprintf("line %d: %s", e.line, e.msg) }

// parseOBJ parses the subset of Wavefront OBJ a path tracer needs: v, vn and
// f (triangles and polygons, fan-triangulated; forms v, v/vt, v/vt/vn, v//vn;
// negative indices count back from the latest vertex). vt is counted but
// unused; other statements (o, g, s, usemtl, mtllib, l, p, ...) are ignored.
// maxTris bounds the number of triangles so a hostile file cannot exhaust
// memory.
func parseOBJ(data []byte, maxTris int) (*meshObject, error) {
	m := &meshObject{}
	if _, err := scanOBJ(data, maxTris, m); err != nil {
		return nil, err
	}
	return m, nil
}

// checkOBJ validates an OBJ file exactly as parseOBJ does, with the same errors, but keeps
// nothing: it returns the triangle count. A coordinator validating a submission uses it, so
// validating a big mesh costs no memory beyond the file itself.
func checkOBJ(data []byte, maxTris int) (int, error) { return scanOBJ(data, maxTris, nil) }

// scanOBJ reads data, appending to m when it is not nil, and returns the triangle count.
func scanOBJ(data []byte, maxTris int, m *meshObject) (int, error) {
	nv, nvn, nvt, ntris := 0, 0, 0, 0
	var idx []objCorner // reused per face
	line := 0
	for len(data) > 0 {
		line++
		var l []byte
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			l, data = data[:i], data[i+1:]
		} else {
			l, data = data, nil
		}
		if i := bytes.IndexByte(l, '#'); i >= 0 {
			l = l[:i]
		}
		f := bytes.Fields(l)
		if len(f) == 0 {
			continue
		}
		switch string(f[0]) {
		case "v":
			v, err := objVec(f, line, "v")
			if err != nil {
				return 0, err
			}
			nv++
			if m != nil {
				m.positions = append(m.positions, v)
			}
		case "vn":
			v, err := objVec(f, line, "vn")
			if err != nil {
				return 0, err
			}
			nvn++
			if m != nil {
				m.normals = append(m.normals, v.Normalize())
			}
		case "vt":
			nvt++
		case "f":
			if len(f) < 4 {
				return 0, &objError{line, fmt.Sprintf("face needs at least 3 vertices, got %d", len(f)-1)}
			}
			idx = idx[:0]
			for _, c := range f[1:] {
				cc, err := objParseCorner(c, line, nv, nvt, nvn)
				if err != nil {
					return 0, err
				}
				idx = append(idx, cc)
			}
			for i := 1; i+1 < len(idx); i++ {
				if ntris >= maxTris {
					return 0, &objError{line, fmt.Sprintf("more than %d triangles", maxTris)}
				}
				ntris++
				if m != nil {
					a, b, c := idx[0], idx[i], idx[i+1]
					m.tris = append(m.tris, objTri{v: [3]int32{a.v, b.v, c.v}, n: [3]int32{a.n, b.n, c.n}})
				}
			}
		}
	}
	if ntris == 0 {
		return 0, &objError{line, "no faces"}
	}
	return ntris, nil
}

// objCorner is one resolved face corner.
type objCorner struct{ v, n int32 }

// objVec parses the three coordinates of a v or vn statement.
func objVec(f [][]byte, line int, what string) (Vec, error) {
	if len(f) < 4 {
		return Vec{}, &objError{line, fmt.Sprintf("%s needs 3 coordinates, got %d", what, len(f)-1)}
	}
	var c [3]float64
	for i := range 3 {
		x, err := strconv.ParseFloat(string(f[i+1]), 64)
		if err != nil || math.IsNaN(x) || math.IsInf(x, 0) || math.Abs(x) > maxCoord {
			return Vec{}, &objError{line, fmt.Sprintf("%s: bad coordinate %q (need a finite number within ±%g)", what, f[i+1], maxCoord)}
		}
		c[i] = x
	}
	return Vec{c[0], c[1], c[2]}, nil
}

// objParseCorner parses "v", "v/vt", "v/vt/vn" or "v//vn".
func objParseCorner(c []byte, line, nv, nvt, nvn int) (objCorner, error) {
	parts := bytes.Split(c, []byte{'/'})
	if len(parts) > 3 || len(parts[0]) == 0 {
		return objCorner{}, &objError{line, fmt.Sprintf("bad face vertex %q", c)}
	}
	v, err := objIndex(parts[0], line, nv, "vertex")
	if err != nil {
		return objCorner{}, err
	}
	cc := objCorner{v: v, n: -1}
	if len(parts) >= 2 && len(parts[1]) > 0 {
		if _, err := objIndex(parts[1], line, nvt, "texture coordinate"); err != nil {
			return objCorner{}, err
		}
	}
	if len(parts) == 3 {
		if len(parts[2]) == 0 {
			return objCorner{}, &objError{line, fmt.Sprintf("bad face vertex %q: empty normal index", c)}
		}
		n, err := objIndex(parts[2], line, nvn, "normal")
		if err != nil {
			return objCorner{}, err
		}
		cc.n = n
	}
	return cc, nil
}

// objIndex resolves a 1-based (or negative, relative) OBJ index against n
// elements defined so far.
func objIndex(b []byte, line, n int, what string) (int32, error) {
	i, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return 0, &objError{line, fmt.Sprintf("bad %s index %q", what, b)}
	}
	switch {
	case i > 0 && i <= int64(n):
		return int32(i - 1), nil
	case i < 0 && -i <= int64(n):
		return int32(int64(n) + i), nil
	}
	return 0, &objError{line, fmt.Sprintf("%s index %d out of range (%d defined)", what, i, n)}
}

// computeVertexNormals fills m.vertexNormals with area-weighted averages of
// the face normals around each position (used for smooth shading when the
// file has no vn).
func (m *meshObject) computeVertexNormals() {
	if m.vertexNormals != nil {
		return
	}
	vn := make([]Vec, len(m.positions))
	for _, t := range m.tris {
		a, b, c := m.positions[t.v[0]], m.positions[t.v[1]], m.positions[t.v[2]]
		n := b.Sub(a).Cross(c.Sub(a)) // length = 2·area: area weighting
		for _, i := range t.v {
			vn[i] = vn[i].Add(n)
		}
	}
	for i := range vn {
		vn[i] = vn[i].Normalize()
	}
	m.vertexNormals = vn
}
