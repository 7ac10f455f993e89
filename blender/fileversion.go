package blender

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
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
	if err != nil {
		return Version{}, sceneErr("%s: %v", filepath.Base(path), err)
	}
	v, err := parseHeader(head)
	if err != nil {
		return Version{}, sceneErr("%s: %v", filepath.Base(path), err)
	}
	return v, nil
}

// readHeader returns the first headerBytes of the .blend r holds (fewer if it is shorter),
// decompressed.
func readHeader(r io.Reader) ([]byte, error) {
	var magic [4]byte
	n, err := io.ReadFull(r, magic[:])
	if err != nil && n == 0 {
		return nil, fmt.Errorf("not a .blend file: %v", err)
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
		return Version{}, fmt.Errorf("not a .blend file (no BLENDER header)")
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
