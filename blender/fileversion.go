package blender

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/klauspost/compress/zstd"
)

// Version is a Blender line, major.minor: what a .blend's header says saved it, and what a
// build renders. A file is rendered by a build of its own line, else of the nearest newer one
// (docs/design.md, "Blender lines").
type Version struct{ Major, Minor int }

func (v Version) String() string { return fmt.Sprintf("%d.%d", v.Major, v.Minor) }

// Less orders lines oldest first.
func (v Version) Less(w Version) bool {
	return v.Major < w.Major || v.Major == w.Major && v.Minor < w.Minor
}

// IsZero reports whether v is no version at all.
func (v Version) IsZero() bool { return v == Version{} }

// ParseVersion reads a line from a Blender version string: "4.5", "4.5.15", "4.5.15 LTS".
func ParseVersion(s string) (Version, error) {
	f := strings.Fields(s)
	if len(f) == 0 {
		return Version{}, fmt.Errorf("%w: empty Blender version", ErrBadDescription)
	}
	parts := strings.Split(f[0], ".")
	if len(parts) < 2 {
		return Version{}, fmt.Errorf("%w: Blender version %q: want major.minor", ErrBadDescription, s)
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil || major < 0 || minor < 0 || minor > 99 {
		return Version{}, fmt.Errorf("%w: Blender version %q: want major.minor", ErrBadDescription, s)
	}
	return Version{major, minor}, nil
}

// headerBytes is as much of a .blend's start as its header takes in any format.
const headerBytes = 17

// FileVersion reads the version of Blender that saved the .blend at path from its header,
// inside the gzip or zstd stream of a compressed file: "BLENDER-v304" (12 bytes, before 5.0:
// pointer size, endianness, three digits) or "BLENDER17-01v0500" (17 bytes from 5.0: header
// size, file format version, endianness, four digits). Anything else is an ErrScene.
func FileVersion(path string) (Version, error) {
	f, err := os.Open(path)
	if err != nil {
		return Version{}, sceneErr("reading %s: %v", filepath.Base(path), err)
	}
	defer f.Close()
	head, err := readHeader(f)
	if err == nil {
		var v Version
		if v, err = parseHeader(head); err == nil {
			return v, nil
		}
	}
	if errors.Is(err, errNotBlend) {
		return Version{}, sceneErr("%s is not a .blend file (no BLENDER header)", filepath.Base(path))
	}
	return Version{}, sceneErr("%s: %v", filepath.Base(path), err)
}

// errNotBlend is a header that is no .blend's.
var errNotBlend = errors.New("not a .blend file")

// readHeader returns the first headerBytes of the .blend r holds (fewer if it is shorter),
// decompressed.
func readHeader(r io.Reader) ([]byte, error) {
	var magic [4]byte
	n, err := io.ReadFull(r, magic[:])
	if err != nil && n == 0 {
		return nil, errNotBlend
	}
	src := io.MultiReader(bytes.NewReader(magic[:n]), r)
	switch {
	case bytes.HasPrefix(magic[:n], []byte{0x28, 0xb5, 0x2f, 0xfd}):
		d, err := zstd.NewReader(src, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(64<<20))
		if err != nil {
			return nil, fmt.Errorf("reading its zstd stream: %v", err)
		}
		defer d.Close()
		src = d
	case bytes.HasPrefix(magic[:n], []byte{0x1f, 0x8b}):
		g, err := gzip.NewReader(src)
		if err != nil {
			return nil, fmt.Errorf("reading its gzip stream: %v", err)
		}
		defer g.Close()
		src = g
	}
	head := make([]byte, headerBytes)
	n, err = io.ReadFull(src, head)
	if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		return nil, fmt.Errorf("reading its header: %v", err)
	}
	return head[:n], nil
}

// parseHeader reads the version from a .blend header.
func parseHeader(h []byte) (Version, error) {
	s := string(h)
	if !strings.HasPrefix(s, "BLENDER") {
		return Version{}, errNotBlend
	}
	rest := s[len("BLENDER"):]
	var digits string
	switch {
	case len(rest) >= 5 && (rest[0] == '_' || rest[0] == '-') && (rest[1] == 'v' || rest[1] == 'V'):
		digits = rest[2:5] // BLENDER-v304
	case len(rest) >= 10 && rest[:2] == "17" && rest[2] == '-' && (rest[5] == 'v' || rest[5] == 'V'):
		digits = rest[6:10] // BLENDER17-01v0500
	default:
		return Version{}, fmt.Errorf("unreadable .blend header %q", strings.ToValidUTF8(s, "?"))
	}
	n, err := strconv.Atoi(digits)
	if err != nil || n <= 0 {
		return Version{}, fmt.Errorf("unreadable version %q in the .blend header", strings.ToValidUTF8(digits, "?"))
	}
	return Version{n / 100, n % 100}, nil
}

func validVersion(s string) bool {
	v, err := ParseVersion(s)
	return err == nil && v.String() == s
}

// BuildLine is the Blender line of a build fingerprint ("blender/4.5.15 (...) ..." is 4.5);
// false for a fingerprint that is not a Blender's.
func BuildLine(build string) (Version, bool) {
	rest, ok := strings.CutPrefix(build, "blender/")
	if !ok {
		return Version{}, false
	}
	v, err := ParseVersion(rest)
	return v, err == nil
}

// RenderingLine is the line of builds (Blender fingerprints) that renders a file saved by line
// file: file's own if a build runs it, else the nearest newer; false if every build is older.
// Submit's inspection and the farm's choice both follow it.
func RenderingLine(file Version, builds []string) (Version, bool) {
	var best Version
	found := false
	for _, b := range builds {
		v, ok := BuildLine(b)
		if ok && !v.Less(file) && (!found || v.Less(best)) {
			best, found = v, true
		}
	}
	return best, found
}

// FitBuilds returns which of builds (the live Blender builds a job may use, in the order the
// farm prefers them) render the scene: those of the line that saved the .blend, else those of
// the nearest newer line, with a note saying so; Blender reads files of older lines, and a
// file of a newer line than every build is refused (an ErrScene naming the file's line and the
// builds). The chosen line must also be the line of the build that inspected the .blend: the
// channels its tiles render, the passes and what renders whole were read there, and lines
// differ in them (5.0 renamed passes), so a scene inspected by one line never renders on
// another (docs/design.md, "Blender lines"). A description without a file version fits every
// build.
func (d *Description) FitBuilds(builds []string) ([]string, string, error) {
	if d.FileVersion == "" || len(builds) == 0 {
		return builds, "", nil
	}
	file, err := ParseVersion(d.FileVersion)
	if err != nil {
		return nil, "", sceneErr("%v", err)
	}
	best, found := RenderingLine(file, builds)
	if !found {
		return nil, "", sceneErr("%s was saved by Blender %s, newer than every live build, which cannot read it: %s",
			d.Blend, file, strings.Join(lineNames(builds), ", "))
	}
	var fit []string
	for _, b := range builds {
		if v, _ := BuildLine(b); v == best {
			fit = append(fit, b)
		}
	}
	if own, ok := BuildLine(d.Build); ok && own != best {
		return nil, "", sceneErr("%s was inspected by Blender %s, but the farm renders it on %s (%s): lines differ in the passes they render; submit it with --blender naming a %s build, or --build a live build of %s",
			d.Blend, releaseOf(d.Build), best, lineWhy(file, best), best, own)
	}
	note := ""
	if best != file {
		note = fmt.Sprintf("saved by Blender %s, and no live build it may use is of %s: renders on Blender %s, the nearest newer line", file, file, releaseOf(fit[0]))
	}
	return fit, note, nil
}

// lineWhy says why a file of line file renders on line v.
func lineWhy(file, v Version) string {
	if file == v {
		return "the line that saved it"
	}
	return "the nearest newer live line to " + file.String() + ", which saved it"
}

// releaseOf is the release a Blender fingerprint names, "4.5.15".
func releaseOf(build string) string {
	rest := strings.TrimPrefix(build, "blender/")
	if f := strings.Fields(rest); len(f) > 0 {
		return f[0]
	}
	return build
}

// lineNames are the releases of builds, sorted and without repeats ("3.4.1, 4.2.23").
func lineNames(builds []string) []string {
	var out []string
	for _, b := range builds {
		if r := releaseOf(b); !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	slices.Sort(out)
	return out
}
