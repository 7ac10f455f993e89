package checkpoint

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/tilefarm/tilefarm/tiles"
)

// Checkpoint is the resumable state of one tile: the float64 accumulators of
// its pixels after samples [0, Next) and the identities that say which tile
// and which inputs they belong to. Sum is stored bit for bit, so a tile
// resumed from a checkpoint equals an uninterrupted one exactly.
type Checkpoint struct {
	TileKey   string
	FrameKey  string // the tile's frame (version 3), to find its manifest
	InputHash string
	Next      int // next sample index to render
	Sum       []float64
	Attempt   string // attempt that wrote it (for logs)
	// Build is the build fingerprint of the renderer that accumulated Sum: floats from another
	// build (another Go version, CPU kernel or renderer) must never be resumed.
	Build   string
	SavedAt time.Time
}

// Matches reports whether c belongs to the given tile and was made from the
// same inputs. A worker resumes only from a matching checkpoint; anything
// else (older renderer, other settings, another tile) must be discarded.
func (c Checkpoint) Matches(tileKey, inputHash string) bool {
	return c.TileKey == tileKey && c.InputHash == inputHash
}

// ErrCorruptCheckpoint is wrapped by every decoding error: whatever the
// damage, the checkpoint is unusable and the tile restarts from sample 0.
var ErrCorrupt = errors.New("corrupt checkpoint")

// Limits of the checkpoint format. Anything larger is treated as corruption
// rather than trusted, so a damaged header cannot make a decoder allocate
// gigabytes.
const (
	// MaxCheckpointFloats is the largest Sum a checkpoint may hold: a
	// MaxTileSize x MaxTileSize tile with four float64 channels (512 MiB).
	MaxFloats = tiles.MaxTileSize * tiles.MaxTileSize * 4
	// MaxCheckpointString is the longest key or attempt id stored.
	MaxString = 1024
	// MaxCheckpointNext is the largest sample index stored.
	MaxNext = math.MaxInt32
)

// Layout of an encoded checkpoint (all integers little endian):
//
//	"TFCK" | version u8 | len u16 + TileKey | len u16 + InputHash |
//	len u16 + Attempt | [version 3: len u16 + Build | len u16 + FrameKey] | Next u64 |
//	SavedAt unix seconds i64 | SavedAt nanos u32 |
//	float count u64 | payload length u32 | zstd(payload bytes) |
//	CRC-32C (Castagnoli) u32 of everything before it
//
// The versions differ in the bytes fed to zstd, always 8 per float, and in the
// build fingerprint:
//
//   - version 1: the float64 bits of Sum, each little endian, one value after
//     the other. Raw sums are noise to zstd (it saves nothing), so Encode no
//     longer writes it; Decode still reads it.
//   - version 2: the same bytes byte-shuffled: byte 0 (least significant) of
//     every value, then byte 1 of every value, ..., then byte 7. Grouping the
//     slowly varying sign, exponent and high mantissa bytes is what makes the
//     payload compress (see shuffleFloat64s).
//   - version 3: version 2 with the Build and FrameKey strings. Encode always
//     writes it; older versions decode with an empty Build, which no build matches.
const (
	checkpointMagic = "TFCK"
	// checkpointV1 is the original, unshuffled payload; decoded only.
	checkpointV1 = 1
	// checkpointV2 is the byte-shuffled payload; decoded only.
	checkpointV2 = 2
	// checkpointV3 is version 2 with the build fingerprint; encoded and decoded.
	checkpointV3 = 3
	crcSize      = 4
	// minCheckpointSize is the encoding with empty strings and no payload.
	minCheckpointSize = len(checkpointMagic) + 1 + 3*2 + 8 + 8 + 4 + 8 + 4 + crcSize
)

// Codec encodes and decodes checkpoints, reusing one zstd encoder and decoder.
// It is safe for concurrent use. Hot paths (a worker checkpointing after every
// pass) should hold one Codec rather than call the free functions.
type Codec struct {
	enc *zstd.Encoder
	dec *zstd.Decoder
}

// NewCodec creates a Codec. Close releases its zstd resources.
func NewCodec() (*Codec, error) {
	enc, err := zstd.NewWriter(nil,
		zstd.WithEncoderLevel(zstd.SpeedFastest),
		zstd.WithEncoderConcurrency(2),
	)
	if err != nil {
		return nil, fmt.Errorf("creating zstd encoder: %w", err)
	}
	// The decoder never produces more than MaxCheckpointFloats*8 bytes, and
	// with WithDecodeAllCapLimit each call is limited to the capacity of its
	// destination, which Decode sizes to what the header declares.
	dec, err := zstd.NewReader(nil,
		zstd.WithDecoderConcurrency(2),
		zstd.WithDecoderMaxMemory(MaxFloats*8),
		zstd.WithDecodeAllCapLimit(true),
	)
	if err != nil {
		enc.Close()
		return nil, fmt.Errorf("creating zstd decoder: %w", err)
	}
	return &Codec{enc: enc, dec: dec}, nil
}

// Close releases the codec's encoder and decoder. The codec must not be used
// afterwards.
func (c *Codec) Close() error {
	c.dec.Close()
	if err := c.enc.Close(); err != nil {
		return fmt.Errorf("closing zstd encoder: %w", err)
	}
	return nil
}

// EncodeCheckpoint encodes c with a one-off Codec. See Codec.Encode.
func Encode(c Checkpoint) ([]byte, error) {
	codec, err := NewCodec()
	if err != nil {
		return nil, err
	}
	defer codec.Close()
	return codec.Encode(c)
}

// DecodeCheckpoint decodes b with a one-off Codec. See Codec.Decode.
func Decode(b []byte) (Checkpoint, error) {
	codec, err := NewCodec()
	if err != nil {
		return Checkpoint{}, err
	}
	defer codec.Close()
	return codec.Decode(b)
}

// Encode serializes ck in format version 3: a small header, the
// zstd-compressed, byte-shuffled float64 bits of Sum and a CRC-32C over
// everything, so that any damage on disk or in object storage is detected by
// Decode. It refuses values the decoder would reject, so every encoded
// checkpoint decodes.
func (c *Codec) Encode(ck Checkpoint) ([]byte, error) {
	for _, f := range []struct{ name, s string }{
		{"tile key", ck.TileKey}, {"input hash", ck.InputHash}, {"attempt", ck.Attempt}, {"build", ck.Build}, {"frame key", ck.FrameKey},
	} {
		if len(f.s) > MaxString {
			return nil, fmt.Errorf("encoding checkpoint: %s is %d bytes, more than %d", f.name, len(f.s), MaxString)
		}
	}
	if ck.Next < 0 || ck.Next > MaxNext {
		return nil, fmt.Errorf("encoding checkpoint: next sample index %d out of range [0, %d]", ck.Next, MaxNext)
	}
	if len(ck.Sum) > MaxFloats {
		return nil, fmt.Errorf("encoding checkpoint: %d floats, more than %d", len(ck.Sum), MaxFloats)
	}

	var payload []byte
	if len(ck.Sum) > 0 {
		raw := make([]byte, 8*len(ck.Sum))
		shuffleFloat64s(raw, ck.Sum)
		payload = c.enc.EncodeAll(raw, nil)
	}
	if uint64(len(payload)) > math.MaxUint32 {
		return nil, fmt.Errorf("encoding checkpoint: compressed payload of %d bytes too large", len(payload))
	}

	size := minCheckpointSize + 4 + len(ck.TileKey) + len(ck.InputHash) + len(ck.Attempt) + len(ck.Build) + len(ck.FrameKey) + len(payload)
	b := make([]byte, 0, size)
	b = append(b, checkpointMagic...)
	b = append(b, checkpointV3)
	b = appendString16(b, ck.TileKey)
	b = appendString16(b, ck.InputHash)
	b = appendString16(b, ck.Attempt)
	b = appendString16(b, ck.Build)
	b = appendString16(b, ck.FrameKey)
	b = binary.LittleEndian.AppendUint64(b, uint64(ck.Next))
	b = binary.LittleEndian.AppendUint64(b, uint64(ck.SavedAt.Unix()))
	b = binary.LittleEndian.AppendUint32(b, uint32(ck.SavedAt.Nanosecond()))
	b = binary.LittleEndian.AppendUint64(b, uint64(len(ck.Sum)))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(payload)))
	b = append(b, payload...)
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli()))
	return b, nil
}

// Decode parses an encoded checkpoint of format version 1, 2 or 3. Every kind of
// damage (bad magic, unknown version, truncation, CRC mismatch, zstd error,
// length mismatch, absurd sizes) returns an error wrapping
// ErrCorruptCheckpoint; it never panics. SavedAt is returned in UTC; an
// empty Sum decodes as nil.
func (c *Codec) Decode(b []byte) (Checkpoint, error) {
	if len(b) < minCheckpointSize {
		return Checkpoint{}, corruptf("%d bytes, shorter than the minimum %d", len(b), minCheckpointSize)
	}
	if string(b[:len(checkpointMagic)]) != checkpointMagic {
		return Checkpoint{}, corruptf("bad magic %q", b[:len(checkpointMagic)])
	}
	version := b[len(checkpointMagic)]
	if version < checkpointV1 || version > checkpointV3 {
		return Checkpoint{}, corruptf("unsupported version %d", version)
	}
	body := b[:len(b)-crcSize]
	want := binary.LittleEndian.Uint32(b[len(body):])
	if got := crc32.Checksum(body, castagnoli()); got != want {
		return Checkpoint{}, corruptf("crc32c mismatch: stored %08x, computed %08x", want, got)
	}

	r := reader{b: body[len(checkpointMagic)+1:]}
	var ck Checkpoint
	ck.TileKey = r.string16()
	ck.InputHash = r.string16()
	ck.Attempt = r.string16()
	if version >= checkpointV3 {
		ck.Build = r.string16()
		ck.FrameKey = r.string16()
	}
	next := r.uint64()
	secs := int64(r.uint64())
	nanos := r.uint32()
	count := r.uint64()
	payloadLen := r.uint32()
	if r.err != nil {
		return Checkpoint{}, corruptf("header: %w", r.err)
	}
	if next > MaxNext {
		return Checkpoint{}, corruptf("next sample index %d out of range", next)
	}
	if nanos >= uint32(time.Second) {
		return Checkpoint{}, corruptf("saved-at nanoseconds %d out of range", nanos)
	}
	if count > MaxFloats {
		return Checkpoint{}, corruptf("%d floats, more than %d", count, MaxFloats)
	}
	if uint64(len(r.b)) != uint64(payloadLen) {
		return Checkpoint{}, corruptf("payload length %d, header declares %d", len(r.b), payloadLen)
	}
	ck.Next = int(next)
	ck.SavedAt = time.Unix(secs, int64(nanos)).UTC()

	if count == 0 {
		if payloadLen != 0 {
			return Checkpoint{}, corruptf("%d payload bytes for zero floats", payloadLen)
		}
		return ck, nil
	}
	wantBytes := int(count) * 8
	raw, err := c.dec.DecodeAll(r.b, make([]byte, 0, wantBytes))
	if err != nil {
		return Checkpoint{}, corruptf("decompressing payload: %w", err)
	}
	if len(raw) != wantBytes {
		return Checkpoint{}, corruptf("payload decompresses to %d bytes, header declares %d", len(raw), wantBytes)
	}
	ck.Sum = make([]float64, count)
	if version == checkpointV1 {
		for i := range ck.Sum {
			ck.Sum[i] = math.Float64frombits(binary.LittleEndian.Uint64(raw[8*i:]))
		}
	} else {
		unshuffleFloat64s(ck.Sum, raw)
	}
	return ck, nil
}

// corruptf formats a decoding error that wraps ErrCorruptCheckpoint.
func corruptf(format string, args ...any) error {
	return fmt.Errorf("decoding checkpoint: %w: %w", ErrCorrupt, fmt.Errorf(format, args...))
}

// castagnoli returns the CRC-32C table; crc32 caches it internally.
func castagnoli() *crc32.Table { return crc32.MakeTable(crc32.Castagnoli) }

// appendString16 appends a u16 length and s. Callers have checked the length.
func appendString16(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// errShortHeader reports a header that ends before all its fields.
var errShortHeader = errors.New("truncated header")

// reader reads little-endian header fields and remembers the first error, so
// decoding stays a straight sequence of reads.
type reader struct {
	b   []byte
	err error
}

// take returns the next n bytes, or nil after setting r.err.
func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n > len(r.b) {
		r.err = errShortHeader
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) uint64() uint64 {
	if p := r.take(8); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}

func (r *reader) uint32() uint32 {
	if p := r.take(4); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

func (r *reader) string16() string {
	p := r.take(2)
	if p == nil {
		return ""
	}
	n := int(binary.LittleEndian.Uint16(p))
	if n > MaxString {
		r.err = fmt.Errorf("string of %d bytes, more than %d", n, MaxString)
		return ""
	}
	return string(r.take(n))
}
