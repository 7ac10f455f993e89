package blendertest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Line is a Blender line the farm supports, with the build of it the tests run: Debian's
// Blender 3.4 executable ($TILEFARM_BLENDER), and Blender's own builds of 4.2 LTS, 4.5 LTS and
// 5.0 as bpy modules, each a Python of its own virtual environment that the test command
// installs ($TILEFARM_BLENDER_4_2 and so on).
type Line struct {
	Name   string // "4.5"
	Binary string // its executable, or its Python with bpy
}

// Env is the variable naming the line's build.
func (l Line) Env() string {
	if l.Name == "3.4" {
		return EnvBinary
	}
	return EnvBinary + "_" + strings.ReplaceAll(l.Name, ".", "_")
}

// LineNames are the lines the farm supports, oldest first.
var LineNames = []string{"3.4", "4.2", "4.5", "5.0"}

// Lines are every line the farm supports with its build. A line whose build is missing fails
// the test: the test command installs them all.
func Lines(t testing.TB) []Line {
	t.Helper()
	var out []Line
	for _, name := range LineNames {
		out = append(out, LineOf(t, name))
	}
	return out
}

// LineOf is the line name with its build, failing the test when it is missing.
func LineOf(t testing.TB, name string) Line {
	t.Helper()
	l := Line{Name: name}
	if name == "3.4" {
		l.Binary = Binary(t)
		return l
	}
	l.Binary = os.Getenv(l.Env())
	if l.Binary == "" {
		t.Fatalf("Blender %s is needed and %s is not set: run ./test.sh (it installs Blender %s's bpy) or point it at a Python with bpy %s", name, l.Env(), name, name)
	}
	if _, err := os.Stat(l.Binary); err != nil {
		t.Fatalf("Blender %s: %s=%s: %v", name, l.Env(), l.Binary, err)
	}
	return l
}

// Saved is the .blend at blend as this line saves it: a copy in a fresh directory, saved by
// the line's Blender (as an artist opening the file in that release and saving it does), or
// for 3.4, which made the bundled files, copied as it is. The .blend must depend on no file
// (the bundled plate packs its textures).
func (l Line) Saved(t testing.TB, blend string) string {
	t.Helper()
	return l.SavedWith(t, blend, "")
}

// SavedWith is Saved with the Python expr run on the opened file before it is saved (a
// setting the artist changed), on every line.
func (l Line) SavedWith(t testing.TB, blend, expr string) string {
	t.Helper()
	dir := t.TempDir()
	out := filepath.Join(dir, filepath.Base(blend))
	if l.Name == "3.4" && expr == "" {
		data, err := os.ReadFile(blend)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(out, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if expr != "" {
		expr += "; "
	}
	RunWith(t, l.Binary, blend, "--python-expr",
		"import bpy; "+expr+"bpy.ops.wm.save_as_mainfile(filepath="+PyString(out)+", copy=True, compress=True)")
	return out
}
