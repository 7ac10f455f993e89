package addon

import (
	"archive/zip"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The zip holds the package directory as it is, at the zip's root, as Blender's add-on install
// wants it, and the same sources always make the same bytes.
func TestZipHoldsThePackageAsItIs(t *testing.T) {
	var a, b bytes.Buffer
	if err := WriteZip(&a); err != nil {
		t.Fatal(err)
	}
	if err := WriteZip(&b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("two zips of the same sources differ")
	}
	zr, err := zip.NewReader(bytes.NewReader(a.Bytes()), int64(a.Len()))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range zr.File {
		names = append(names, f.Name)
		rc, err := f.Open()
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(filepath.FromSlash(f.Name))
		if err != nil {
			t.Fatalf("%s is in the zip but not in the package: %v", f.Name, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from the package's file", f.Name)
		}
	}
	var onDisk []string
	err = filepath.WalkDir(Name, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "__pycache__" {
			return filepath.SkipDir
		}
		if !d.IsDir() && !strings.HasPrefix(d.Name(), ".") && !strings.HasSuffix(d.Name(), ".pyc") {
			onDisk = append(onDisk, filepath.ToSlash(p))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(onDisk)
	if !slices.Equal(names, onDisk) {
		t.Fatalf("the zip holds %q, the package %q", names, onDisk)
	}
	if !slices.Contains(names, Name+"/__init__.py") {
		t.Fatalf("no %s/__init__.py in the zip: %q", Name, names)
	}
	init, _ := os.ReadFile(filepath.Join(Name, "__init__.py"))
	if !strings.Contains(string(init), `"blender": (3, 4, 0)`) {
		t.Fatal("bl_info does not ask for Blender 3.4.0, the farm's")
	}
}
