package bundle_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/tilefarm/tilefarm/internal/bundle"
)

// A varint padded with a zero byte (0x80 0x00 for 0, 0x81 0x00 for 1) is the same number as
// its minimal encoding: Decode refuses it wherever it appears, naming where, so two different
// byte strings never decode to the same bundle.
func TestDecodeRefusesNonMinimalVarints(t *testing.T) {
	uv := func(v uint64) []byte { return binary.AppendUvarint(nil, v) }
	// pad re-encodes v one byte longer than it needs, with the same value.
	pad := func(v uint64) []byte {
		b := uv(v)
		b[len(b)-1] |= 0x80
		return append(b, 0)
	}
	// bundle is a bundle named "s" with scene "{}" and asset "a" of content "x"; each of its
	// five varints is padded when its index is in padded.
	encode := func(padded int) []byte {
		v := func(i int, n uint64) []byte {
			if i == padded {
				return pad(n)
			}
			return uv(n)
		}
		return bytes.Join([][]byte{[]byte(bundle.Magic), {bundle.FormatV1},
			v(0, 1), []byte("s"), v(1, 2), v(2, 1), v(3, 1), []byte("a"), v(4, 1), []byte("{}x")}, nil)
	}
	minimal := encode(-1)
	b, err := bundle.Decode(minimal)
	if err != nil {
		t.Fatalf("Decode of the minimal encoding: %v", err)
	}
	if b.Name != "s" || string(b.Scene) != "{}" || len(b.Assets) != 1 || string(b.Assets["a"]) != "x" {
		t.Fatalf("decoded %+v, want the bundle encoded", b)
	}
	if !bytes.Equal(b.Encode(), minimal) {
		t.Fatalf("Encode = %q, want the bytes decoded %q", b.Encode(), minimal)
	}
	for i, what := range []string{"scene name", "scene", "asset count", "asset name", "asset a"} {
		data := encode(i)
		b, err := bundle.Decode(data)
		if err == nil {
			t.Errorf("Decode(%q) with %s padded = %+v, want an error", data, what, b)
			continue
		}
		if !errors.Is(err, bundle.ErrInvalid) {
			t.Errorf("padded %s: error %v does not wrap ErrInvalid", what, err)
		}
		if want := "non-minimal varint at " + what; !strings.Contains(err.Error(), want) {
			t.Errorf("padded %s: error %q, want one saying %q", what, err, want)
		}
	}

	// Padding beyond one byte, and the longest padding binary.Uvarint reads (ten bytes).
	for _, size := range [][]byte{{0x80, 0x80, 0x00}, {0x82, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00}} {
		data := bytes.Join([][]byte{[]byte(bundle.Magic), {bundle.FormatV1}, uv(0), size, uv(0), []byte("{}")}, nil)
		if _, err := bundle.Decode(data); err == nil || !strings.Contains(err.Error(), "non-minimal varint at scene") {
			t.Errorf("Decode(%q) = %v, want a non-minimal varint at the scene size", data, err)
		}
	}
	// A multi-byte varint that is minimal still decodes: 200 bytes of scene.
	scene := bytes.Repeat([]byte(" "), 200)
	data := bytes.Join([][]byte{[]byte(bundle.Magic), {bundle.FormatV1}, uv(0), uv(200), uv(0), scene}, nil)
	if b, err := bundle.Decode(data); err != nil || !bytes.Equal(b.Scene, scene) {
		t.Errorf("Decode of a 200-byte scene: %v", err)
	}
}
