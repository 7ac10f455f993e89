// Package addon is tilefarm's Blender add-on: the Python package in tilefarm/ (a panel in
// Render Properties that submits the saved .blend through `coordinator submit` and follows the
// job over the HTTP API; docs/artists.md), and the zip Blender's preferences install it from.
// It imports nothing of the farm.
package addon

import (
	"archive/zip"
	"embed"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"
	"time"
)

// Name is the add-on's module: the directory at the root of its zip, and what
// addon_enable(module=...) takes.
const Name = "tilefarm"

//go:embed all:tilefarm
var files embed.FS

// zipTime is every entry's modification time, so the same sources make the same bytes.
var zipTime = time.Date(2023, 1, 1, 0, 0, 0, 0, time.UTC)

// Files lists the add-on's files as the zip holds them (tilefarm/__init__.py, ...), sorted:
// every file of the package directory as it is, without Python's caches and hidden files.
func Files() ([]string, error) {
	var out []string
	err := fs.WalkDir(files, Name, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		base := path.Base(p)
		if d.IsDir() {
			if p != Name && (base == "__pycache__" || strings.HasPrefix(base, ".")) {
				return fs.SkipDir
			}
			return nil
		}
		if strings.HasPrefix(base, ".") || strings.HasSuffix(base, ".pyc") {
			return nil
		}
		out = append(out, p)
		return nil
	})
	return out, err
}

// WriteZip writes the add-on as Blender installs it (Preferences > Add-ons > Install, or
// bpy.ops.preferences.addon_install): the package directory tilefarm/ at the zip's root.
func WriteZip(w io.Writer) error {
	names, err := Files()
	if err != nil {
		return err
	}
	zw := zip.NewWriter(w)
	for _, name := range names {
		data, err := files.ReadFile(name)
		if err != nil {
			return err
		}
		h := &zip.FileHeader{Name: name, Method: zip.Deflate, Modified: zipTime}
		h.SetMode(0o644)
		f, err := zw.CreateHeader(h)
		if err != nil {
			return fmt.Errorf("zipping %s: %w", name, err)
		}
		if _, err := f.Write(data); err != nil {
			return fmt.Errorf("zipping %s: %w", name, err)
		}
	}
	return zw.Close()
}
