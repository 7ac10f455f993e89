package render

import (
	"strings"
	"testing"
)

func TestParseOBJFaces(t *testing.T) {
	src := `# a comment
o thing
v 0 0 0
v 1 0 0
v 1 1 0
v 0 1 0
v 0.5 2 0   # trailing comment
vt 0 0
vt 1 0
vn 0 0 1
vn 0 0 2
s 1
usemtl whatever
f 1 2 3
f 1/1 2/2 3/1 4/2
f -5//-2 -4//-1 -3//-2 -2//-1 -1//-2
f 1/1/1 2/2/2 3/1/1
`
	m, err := parseOBJ([]byte(strings.ReplaceAll(src, "\n", "\r\n")), 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.positions) != 5 || len(m.normals) != 2 {
		t.Fatalf("%d positions, %d normals", len(m.positions), len(m.normals))
	}
	want := []objTri{
		{v: [3]int32{0, 1, 2}, n: [3]int32{-1, -1, -1}},
		{v: [3]int32{0, 1, 2}, n: [3]int32{-1, -1, -1}}, // quad fan
		{v: [3]int32{0, 2, 3}, n: [3]int32{-1, -1, -1}},
		{v: [3]int32{0, 1, 2}, n: [3]int32{0, 1, 0}}, // pentagon, negative indices
		{v: [3]int32{0, 2, 3}, n: [3]int32{0, 0, 1}},
		{v: [3]int32{0, 3, 4}, n: [3]int32{0, 1, 0}},
		{v: [3]int32{0, 1, 2}, n: [3]int32{0, 1, 0}},
	}
	if len(m.tris) != len(want) {
		t.Fatalf("%d triangles, want %d", len(m.tris), len(want))
	}
	for i := range want {
		if m.tris[i] != want[i] {
			t.Errorf("triangle %d = %+v, want %+v", i, m.tris[i], want[i])
		}
	}
	if n := m.normals[1]; n != (Vec{0, 0, 1}) {
		t.Errorf("vn not normalised: %v", n)
	}
}

func TestParseOBJErrors(t *testing.T) {
	cases := []struct{ src, want string }{
		{"v 0 0 0\nv 1 0 0\nf 1 2 3\n", "line 3: vertex index 3 out of range (2 defined)"},
		{"v 0 0 0\nv 1 0 0\nv 0 1 0\nf 0 1 2\n", "line 4: vertex index 0 out of range"},
		{"v 0 0 0\nv 1 0 0\nv 0 1 0\nf -4 1 2\n", "line 4: vertex index -4 out of range"},
		{"v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1 2\n", "line 4: face needs at least 3 vertices, got 2"},
		{"v 0 0\n", "line 1: v needs 3 coordinates, got 2"},
		{"v 0 0 x\n", `line 1: v: bad coordinate "x"`},
		{"v 0 0 nan\n", `line 1: v: bad coordinate "nan"`},
		{"v 0 0 1e999\n", `line 1: v: bad coordinate "1e999"`},
		{"v 0 0 0\nvn 0 inf 0\n", `line 2: vn: bad coordinate "inf"`},
		{"v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1//1 2//1 3//1\n", "line 4: normal index 1 out of range (0 defined)"},
		{"v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1/5 2 3\n", "line 4: texture coordinate index 5 out of range"},
		{"v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1/1/1/1 2 3\n", `line 4: bad face vertex "1/1/1/1"`},
		{"v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1// 2 3\n", "line 4: bad face vertex"},
		{"v 0 0 0\nv 1 0 0\nv 0 1 0\nf a 2 3\n", `line 4: bad vertex index "a"`},
		{"v 0 0 0\n# nothing else\n", "no faces"},
		{"", "no faces"},
		{"v 0 0 0\nv 1 0 0\nv 0 1 0\nv 1 1 0\nf 1 2 3 4\nf 1 2 3\n", "line 6: more than 2 triangles"},
	}
	for _, c := range cases {
		_, err := parseOBJ([]byte(c.src), 2)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parseOBJ(%q) = %v, want error containing %q", c.src, err, c.want)
		}
	}
}

// TestSmoothNormals checks that a smooth mesh interpolates its vertex
// normals and a flat one uses the geometric normal.
func TestSmoothNormals(t *testing.T) {
	obj := "v -1 -1 0\nv 1 -1 0\nv 0 1 0\nvn -1 0 1\nvn 1 0 1\nvn 0 1 1\nf 1//1 2//2 3//3\n"
	for _, smooth := range []bool{false, true} {
		js := `{"cameras": [{"name": "c", "position": [0, 0, 5], "look_at": [0, 0, 0]}],
			"materials": [{"name": "m", "type": "diffuse"}],
			"objects": [{"type": "mesh", "file": "t.obj", "material": "m", "smooth": ` + map[bool]string{false: "false", true: "true"}[smooth] + `}]}`
		s, err := ParseScene([]byte(js), mapReader(map[string]string{"t.obj": obj}))
		if err != nil {
			t.Fatal(err)
		}
		w, err := s.world(1)
		if err != nil {
			t.Fatal(err)
		}
		// Hit the triangle at (0.5, -0.5): barycentrics b0 = 0.125, b1 = 0.625, b2 = 0.25.
		r := ray{O: Vec{0.5, -0.5, 3}, D: Vec{0, 0, -1}}
		var h hit
		if !w.intersect(&r, &h) {
			t.Fatal("ray missed the triangle")
		}
		sp := w.surface(&r, &h)
		if d := sp.p.Sub(Vec{0.5, -0.5, 0}).Length(); d > 1e-12 {
			t.Errorf("hit point %v", sp.p)
		}
		want := Vec{0, 0, 1}
		if smooth {
			n0, n1, n2 := Vec{-1, 0, 1}.Normalize(), Vec{1, 0, 1}.Normalize(), Vec{0, 1, 1}.Normalize()
			want = n0.MulScalar(0.125).Add(n1.MulScalar(0.625)).Add(n2.MulScalar(0.25)).Normalize()
		}
		if d := sp.ns.Sub(want).Length(); d > 1e-9 {
			t.Errorf("smooth=%v: shading normal %v, want %v", smooth, sp.ns, want)
		}
		if sp.ng != (Vec{0, 0, 1}) {
			t.Errorf("geometric normal %v", sp.ng)
		}
	}
}

// TestComputedVertexNormals: smooth shading without vn averages face normals.
func TestComputedVertexNormals(t *testing.T) {
	// Two triangles folded 90° along the x axis.
	m, err := parseOBJ([]byte("v 0 0 0\nv 1 0 0\nv 0 1 0\nv 0 0 1\nf 1 2 3\nf 1 4 2\n"), 10)
	if err != nil {
		t.Fatal(err)
	}
	m.computeVertexNormals()
	want := Vec{0, 1, 1}.Normalize() // average of +z and +y
	if d := m.vertexNormals[0].Sub(want).Length(); d > 1e-12 {
		t.Errorf("shared vertex normal %v, want %v", m.vertexNormals[0], want)
	}
	if d := m.vertexNormals[2].Sub(Vec{0, 0, 1}).Length(); d > 1e-12 {
		t.Errorf("unshared vertex normal %v", m.vertexNormals[2])
	}
}
