package raster

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
)

// EXRCompression selects how EncodeEXR stores scanlines.
type EXRCompression uint8

// Supported OpenEXR compressions (the values are the format's codes).
const (
	EXRNone EXRCompression = 0 // NO_COMPRESSION, one scanline per chunk
	EXRZip  EXRCompression = 3 // ZIP_COMPRESSION: zlib, 16 scanlines per chunk
)

// exrZips is ZIPS_COMPRESSION (zlib, one scanline per chunk); DecodeEXR reads
// it because other tools write it, EncodeEXR does not.
const exrZips EXRCompression = 2

func (c EXRCompression) String() string {
	switch c {
	case EXRNone:
		return "none"
	case EXRZip:
		return "zip"
	case exrZips:
		return "zips"
	}
	return fmt.Sprintf("compression(%d)", uint8(c))
}

// linesPerChunk is how many scanlines one chunk of c holds.
func (c EXRCompression) linesPerChunk() int {
	if c == EXRZip {
		return 16
	}
	return 1
}

const (
	exrMagic   = 20000630
	exrVersion = 2
	exrFloat   = 2 // pixel type FLOAT (32-bit IEEE)
	exrHalf    = 1
	exrUint    = 0

	// exrLongNames is the version flag that allows names of up to 255 bytes.
	exrLongNames = 0x400

	maxDeflateRatio = 1100
)

// exrOrder returns the frame's channels in the order the format requires (sorted by name),
// each with its index within a pixel of the frame.
func exrOrder(f *Frame) []exrSlot {
	names := f.ChannelNames()
	out := make([]exrSlot, len(names))
	for i, n := range names {
		out[i] = exrSlot{n, i}
	}
	slices.SortFunc(out, func(a, b exrSlot) int { return strings.Compare(a.name, b.name) })
	return out
}

type exrSlot struct {
	name   string
	offset int // index within a pixel of the frame
}

// EncodeEXR writes f as a single-part scanline OpenEXR file with a 32-bit float channel per
// channel of the frame (R, G and B for an RGB frame) holding the linear, untonemapped values
// bit for bit. EXRZip applies the format's byte interleave and delta predictor before zlib,
// as OpenEXR does, and stores a chunk raw when compression would not shrink it. attrs are
// extra string attributes of the header (a Blender frame's Cryptomatte manifests), written
// sorted by name.
func EncodeEXR(f *Frame, compression EXRCompression, attrs ...map[string]string) ([]byte, error) {
	if err := f.check(); err != nil {
		return nil, fmt.Errorf("encoding EXR: %w", err)
	}
	if compression != EXRNone && compression != EXRZip {
		return nil, fmt.Errorf("encoding EXR: unsupported compression %s", compression)
	}
	order := exrOrder(f)
	version := uint32(exrVersion)
	for _, ch := range order {
		if len(ch.name) > 31 {
			version |= exrLongNames
		}
		if len(ch.name) > 255 || ch.name == "" || strings.IndexByte(ch.name, 0) >= 0 {
			return nil, fmt.Errorf("encoding EXR: bad channel name %q", ch.name)
		}
	}
	var h bytes.Buffer
	le := binary.LittleEndian
	h.Write(le.AppendUint32(nil, exrMagic))
	h.Write(le.AppendUint32(nil, version)) // single-part scanline

	var chlist bytes.Buffer
	for _, ch := range order {
		chlist.WriteString(ch.name)
		chlist.WriteByte(0)
		chlist.Write(le.AppendUint32(nil, exrFloat))
		chlist.Write([]byte{0, 0, 0, 0})      // pLinear, reserved
		chlist.Write(le.AppendUint32(nil, 1)) // xSampling
		chlist.Write(le.AppendUint32(nil, 1)) // ySampling
	}
	chlist.WriteByte(0)
	box := func(x0, y0, x1, y1 int) []byte {
		b := le.AppendUint32(nil, uint32(int32(x0)))
		b = le.AppendUint32(b, uint32(int32(y0)))
		b = le.AppendUint32(b, uint32(int32(x1)))
		return le.AppendUint32(b, uint32(int32(y1)))
	}
	f32 := func(vs ...float32) []byte {
		var b []byte
		for _, v := range vs {
			b = le.AppendUint32(b, math.Float32bits(v))
		}
		return b
	}
	writeAttr(&h, "channels", "chlist", chlist.Bytes())
	writeAttr(&h, "compression", "compression", []byte{byte(compression)})
	writeAttr(&h, "dataWindow", "box2i", box(0, 0, f.Width-1, f.Height-1))
	writeAttr(&h, "displayWindow", "box2i", box(0, 0, f.Width-1, f.Height-1))
	writeAttr(&h, "lineOrder", "lineOrder", []byte{0}) // INCREASING_Y
	writeAttr(&h, "pixelAspectRatio", "float", f32(1))
	writeAttr(&h, "screenWindowCenter", "v2f", f32(0, 0))
	writeAttr(&h, "screenWindowWidth", "float", f32(1))
	for _, m := range attrs {
		for _, k := range slices.Sorted(maps.Keys(m)) {
			if k == "" || len(k) > 255 || strings.IndexByte(k, 0) >= 0 {
				return nil, fmt.Errorf("encoding EXR: bad attribute name %q", k)
			}
			writeAttr(&h, k, "string", []byte(m[k]))
		}
	}
	h.WriteByte(0) // end of header

	c := f.Chans()
	lines := compression.linesPerChunk()
	chunks := (f.Height + lines - 1) / lines
	tableAt := h.Len()
	out := make([]byte, tableAt+8*chunks, tableAt+8*chunks+len(f.Pix)*4+chunks*8)
	copy(out, h.Bytes())
	raw := make([]byte, 0, f.Width*c*4*lines)
	for k := 0; k < chunks; k++ {
		y0 := k * lines
		y1 := min(y0+lines, f.Height)
		raw = raw[:0]
		for y := y0; y < y1; y++ {
			row := f.Pix[y*f.Width*c : (y+1)*f.Width*c]
			for _, ch := range order {
				for x := 0; x < f.Width; x++ {
					raw = le.AppendUint32(raw, math.Float32bits(row[x*c+ch.offset]))
				}
			}
		}
		data := raw
		if compression == EXRZip {
			z, err := zipChunk(raw)
			if err != nil {
				return nil, fmt.Errorf("encoding EXR: %w", err)
			}
			if len(z) < len(raw) {
				data = z
			}
		}
		le.PutUint64(out[tableAt+8*k:], uint64(len(out)))
		out = le.AppendUint32(out, uint32(int32(y0)))
		out = le.AppendUint32(out, uint32(len(data)))
		out = append(out, data...)
	}
	return out, nil
}

func writeAttr(h *bytes.Buffer, name, typ string, value []byte) {
	h.WriteString(name)
	h.WriteByte(0)
	h.WriteString(typ)
	h.WriteByte(0)
	h.Write(binary.LittleEndian.AppendUint32(nil, uint32(len(value))))
	h.Write(value)
}

// zipChunk applies OpenEXR's ZIP preprocessing (split even and odd bytes into
// two halves, then replace each byte by its delta to the previous one, biased
// by 128) and compresses the result with zlib.
func zipChunk(raw []byte) ([]byte, error) {
	n := len(raw)
	tmp := make([]byte, n)
	half := (n + 1) / 2
	for i := 0; i < n; i++ {
		if i%2 == 0 {
			tmp[i/2] = raw[i]
		} else {
			tmp[half+i/2] = raw[i]
		}
	}
	for i := n - 1; i > 0; i-- {
		tmp[i] = tmp[i] - tmp[i-1] + 128
	}
	var buf bytes.Buffer
	zw, err := zlib.NewWriterLevel(&buf, zlib.DefaultCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(tmp); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// unzipChunk reverses zipChunk into exactly want bytes.
func unzipChunk(data []byte, want int) ([]byte, error) {
	zr, err := zlib.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	defer zr.Close()
	tmp := make([]byte, want)
	if _, err := io.ReadFull(zr, tmp); err != nil {
		return nil, fmt.Errorf("inflating chunk: %w", err)
	}
	if n, err := zr.Read(make([]byte, 1)); n != 0 {
		return nil, errors.New("inflating chunk: more data than the chunk holds")
	} else if err != io.EOF {
		return nil, fmt.Errorf("inflating chunk: %w", err) // e.g. bad checksum
	}
	for i := 1; i < want; i++ {
		tmp[i] = tmp[i-1] + tmp[i] - 128
	}
	raw := make([]byte, want)
	half := (want + 1) / 2
	for i := 0; i < want; i++ {
		if i%2 == 0 {
			raw[i] = tmp[i/2]
		} else {
			raw[i] = tmp[half+i/2]
		}
	}
	return raw, nil
}

// exrReader walks a byte slice, remembering the first error.
type exrReader struct {
	b   []byte
	off int
	err error
}

func (r *exrReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf(format, args...)
	}
}

func (r *exrReader) bytes(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b)-r.off {
		r.fail("truncated at offset %d", r.off)
		return nil
	}
	b := r.b[r.off : r.off+n]
	r.off += n
	return b
}

func (r *exrReader) u32() uint32 {
	b := r.bytes(4)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint32(b)
}

func (r *exrReader) u64() uint64 {
	b := r.bytes(8)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint64(b)
}

// cstring reads a NUL-terminated string of at most 255 bytes.
func (r *exrReader) cstring() string {
	if r.err != nil {
		return ""
	}
	end := bytes.IndexByte(r.b[r.off:min(len(r.b), r.off+256)], 0)
	if end < 0 {
		r.fail("unterminated name at offset %d", r.off)
		return ""
	}
	s := string(r.b[r.off : r.off+end])
	r.off += end + 1
	return s
}

// DecodeEXR reads a single-part scanline OpenEXR file with 32-bit float R, G
// and B channels (and possibly others, which are ignored), uncompressed, ZIP
// or ZIPS compressed: enough to read back what EncodeEXR writes, for tests and
// tools. Untrusted input yields errors, never huge allocations or panics.
func DecodeEXR(data []byte) (*Frame, error) {
	f, _, err := decodeEXR(data, rgb)
	if err != nil {
		return nil, fmt.Errorf("decoding EXR: %w", err)
	}
	f.Names = nil
	return f, nil
}

// DecodeEXRChannels reads a single-part scanline OpenEXR file of 32-bit float channels whole:
// a frame of every channel, named and ordered as in the file (sorted by name), and the
// header's string attributes (a Blender render's Cryptomatte manifests among them).
func DecodeEXRChannels(data []byte) (*Frame, map[string]string, error) {
	f, attrs, err := decodeEXR(data, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("decoding EXR: %w", err)
	}
	return f, attrs, nil
}

type exrChannel struct {
	name      string
	pixelType uint32
}

// decodeEXR decodes the channels names (nil: every channel, in the file's order) into a frame
// named by them, with the header's string attributes.
func decodeEXR(data []byte, names []string) (*Frame, map[string]string, error) {
	r := &exrReader{b: data}
	if r.u32() != exrMagic {
		return nil, nil, errors.New("not an OpenEXR file")
	}
	version := r.u32()
	if r.err != nil {
		return nil, nil, r.err
	}
	// Bit 10 says names may be up to 255 bytes long (Blender sets it); cstring reads those.
	if version&0xff != exrVersion || version&^(0xff|exrLongNames) != 0 {
		return nil, nil, fmt.Errorf("unsupported version/flags %#x (only single-part scanline files)", version)
	}
	attrs := map[string]string{}
	var (
		channels            []exrChannel
		compression         = -1
		haveWindow, haveOrd bool
		x0, y0, x1, y1      int32
	)
	for {
		name := r.cstring()
		if r.err != nil {
			return nil, nil, r.err
		}
		if name == "" {
			break
		}
		typ := r.cstring()
		size := int(int32(r.u32()))
		val := r.bytes(size)
		if r.err != nil {
			return nil, nil, fmt.Errorf("attribute %q: %w", name, r.err)
		}
		switch {
		case typ == "string":
			attrs[name] = string(val)
		case name == "channels":
			if typ != "chlist" {
				return nil, nil, fmt.Errorf("channels attribute has type %q", typ)
			}
			cl := &exrReader{b: val}
			for {
				cname := cl.cstring()
				if cl.err != nil || cname == "" {
					break
				}
				ptype := cl.u32()
				cl.bytes(4)
				xs, ys := cl.u32(), cl.u32()
				if cl.err == nil && (xs != 1 || ys != 1) {
					return nil, nil, fmt.Errorf("channel %q is subsampled", cname)
				}
				if ptype > exrFloat {
					return nil, nil, fmt.Errorf("channel %q has unknown pixel type %d", cname, ptype)
				}
				channels = append(channels, exrChannel{cname, ptype})
			}
			if cl.err != nil {
				return nil, nil, fmt.Errorf("channels attribute: %w", cl.err)
			}
		case name == "compression":
			if len(val) != 1 {
				return nil, nil, errors.New("bad compression attribute")
			}
			compression = int(val[0])
		case name == "dataWindow":
			if len(val) != 16 {
				return nil, nil, errors.New("bad dataWindow attribute")
			}
			le := binary.LittleEndian
			x0, y0 = int32(le.Uint32(val)), int32(le.Uint32(val[4:]))
			x1, y1 = int32(le.Uint32(val[8:])), int32(le.Uint32(val[12:]))
			haveWindow = true
		case name == "lineOrder":
			if len(val) != 1 || val[0] > 2 {
				return nil, nil, errors.New("bad lineOrder attribute")
			}
			haveOrd = true
		}
	}
	if channels == nil || compression < 0 || !haveWindow || !haveOrd {
		return nil, nil, errors.New("header lacks channels, compression, dataWindow or lineOrder")
	}
	comp := EXRCompression(compression)
	if comp != EXRNone && comp != EXRZip && comp != exrZips {
		return nil, nil, fmt.Errorf("unsupported compression %d", compression)
	}
	w, h := int64(x1)-int64(x0)+1, int64(y1)-int64(y0)+1
	if w <= 0 || h <= 0 || w*h > maxFramePixels {
		return nil, nil, fmt.Errorf("bad data window (%d,%d)-(%d,%d)", x0, y0, x1, y1)
	}
	width, height := int(w), int(h)
	// Byte offset of each channel within one scanline, and where R, G, B live.
	rowBytes := 0
	chanAt := map[string]int{}
	chanType := map[string]uint32{}
	for _, ch := range channels {
		chanAt[ch.name] = rowBytes
		chanType[ch.name] = ch.pixelType
		if ch.pixelType == exrHalf {
			rowBytes += 2 * width
		} else {
			rowBytes += 4 * width
		}
	}
	if names == nil {
		names = make([]string, len(channels))
		for i, ch := range channels {
			names[i] = ch.name
		}
	}
	for _, name := range names {
		t, ok := chanType[name]
		if !ok {
			return nil, nil, fmt.Errorf("no %s channel", name)
		}
		if t != exrFloat {
			return nil, nil, fmt.Errorf("channel %s is not 32-bit float", name)
		}
	}
	nc := len(names)
	lines := comp.linesPerChunk()
	chunks := (height + lines - 1) / lines
	if int64(chunks)*8 > int64(len(data)-r.off) {
		return nil, nil, errors.New("truncated offset table")
	}
	offsets := make([]uint64, chunks)
	for i := range offsets {
		offsets[i] = r.u64()
	}
	// Deflate cannot shrink data by more than about 1032:1, so a file too
	// small to hold its window is rejected before allocating the frame.
	if int64(rowBytes)*h > int64(len(data))*maxDeflateRatio {
		return nil, nil, fmt.Errorf("data window %dx%d too large for a %d-byte file", width, height, len(data))
	}
	fr := &Frame{Width: width, Height: height, Names: names, Pix: make([]float32, width*height*nc)}
	done := make([]bool, chunks)
	for i, off := range offsets {
		if off > uint64(len(data)) {
			return nil, nil, fmt.Errorf("chunk %d offset %d beyond end of file", i, off)
		}
		cr := &exrReader{b: data, off: int(off)}
		ly := int64(int32(cr.u32()))
		size := int(cr.u32())
		payload := cr.bytes(size)
		if cr.err != nil {
			return nil, nil, fmt.Errorf("chunk %d: %w", i, cr.err)
		}
		rel := ly - int64(y0)
		if rel < 0 || rel >= h || rel%int64(lines) != 0 {
			return nil, nil, fmt.Errorf("chunk %d: bad y %d", i, ly)
		}
		c := int(rel) / lines
		if done[c] {
			return nil, nil, fmt.Errorf("chunk %d: y %d appears twice", i, ly)
		}
		done[c] = true
		first := int(rel)
		n := min(lines, height-first)
		want := n * rowBytes
		var raw []byte
		switch {
		case size == want:
			raw = payload
		case comp == EXRNone || size > want:
			return nil, nil, fmt.Errorf("chunk %d: %d bytes, want %d", i, size, want)
		default:
			var err error
			if raw, err = unzipChunk(payload, want); err != nil {
				return nil, nil, fmt.Errorf("chunk %d: %w", i, err)
			}
		}
		for k := 0; k < n; k++ {
			row := raw[k*rowBytes : (k+1)*rowBytes]
			dst := fr.Pix[(first+k)*width*nc:]
			for ci, name := range names {
				src := row[chanAt[name]:]
				for x := 0; x < width; x++ {
					dst[x*nc+ci] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*x:]))
				}
			}
		}
	}
	return fr, attrs, nil
}
