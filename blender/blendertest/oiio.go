package blendertest

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
)

// Plate is the bundled plate for compositing: two view layers, many passes, Cryptomatte,
// denoising data, a compositor tree with a File Output node, multilayer EXR output.
func Plate(t testing.TB) string {
	return filepath.Join(Root(t), "examples", "blender", "plate.blend")
}

// Python is the interpreter with OpenImageIO's module (Debian's python3-openimageio), the
// tests' reader of EXRs independent of the farm's own decoder.
const Python = "/usr/bin/python3"

// compareScript compares two images channel by channel with OpenImageIO: every channel of the
// first (Blender's own) must be in the second (the farm's), and the header's Cryptomatte
// attributes must be equal. It prints one JSON object.
const compareScript = `
import json, sys
import numpy as np
import OpenImageIO as oiio

def load(path):
    inp = oiio.ImageInput.open(path)
    if inp is None:
        raise SystemExit("cannot open %s: %s" % (path, oiio.geterror()))
    spec = inp.spec()
    px = inp.read_image(format="float")
    inp.close()
    crypto = {a.name: str(a.value) for a in spec.extra_attribs if a.name.startswith("cryptomatte/")}
    return spec, np.asarray(px, dtype=np.float64).reshape(spec.height, spec.width, spec.nchannels), crypto

def fmts(spec):
    # Each channel's pixel type, by name: a half-float EXR keeps its data passes float.
    per = spec.channelformats or [spec.format] * spec.nchannels
    return ", ".join("%s %s" % (n, f) for n, f in sorted(zip(spec.channelnames, map(str, per))))

want, a, ca = load(sys.argv[1])
got, b, cb = load(sys.argv[2])
wn, gn = list(want.channelnames), list(got.channelnames)
out = {"channels": len(wn), "missing": [n for n in wn if n not in gn], "extra": [n for n in gn if n not in wn],
       "size": [want.width, want.height, got.width, got.height], "worst": {}, "crypto_equal": ca == cb,
       "crypto_fields": len(ca), "format": [fmts(want), fmts(got)],
       "compression": [want.getattribute("compression"), got.getattribute("compression")]}
if out["size"][:2] == out["size"][2:]:
    for i, n in enumerate(wn):
        if n in gn:
            x, y = a[..., i], b[..., gn.index(n)]
            out["worst"][n] = float(np.max(np.abs(x - y) / np.maximum(np.abs(x), 1.0)))
print(json.dumps(out))
`

// EXRComparison is what CompareImages found.
type EXRComparison struct {
	Channels     int                `json:"channels"` // of the first image
	Missing      []string           `json:"missing"`  // channels of the first the second lacks
	Extra        []string           `json:"extra"`
	Size         []int              `json:"size"`
	Worst        map[string]float64 `json:"worst"` // per channel: max |a-b| / max(|a|, 1)
	CryptoEqual  bool               `json:"crypto_equal"`
	CryptoFields int                `json:"crypto_fields"`
	Format       []string           `json:"format"` // each channel's pixel type, of either image
	Compression  []string           `json:"compression"`
}

// CompareImages reads two image files with OpenImageIO (channel by channel, by name) and
// reports how the second differs from the first. A missing OpenImageIO fails the test: the
// test command installs it.
func CompareImages(t testing.TB, want, got string) EXRComparison {
	t.Helper()
	out, err := exec.Command(Python, "-c", compareScript, want, got).CombinedOutput()
	if err != nil {
		t.Fatalf("comparing %s with %s with OpenImageIO (%s; the test command installs python3-openimageio): %v\n%s", got, want, Python, err, out)
	}
	var c EXRComparison
	if err := json.Unmarshal(out, &c); err != nil {
		t.Fatalf("comparing %s with %s: %v\n%s", got, want, err, out)
	}
	return c
}

// Within fails the test unless got has exactly the channels of want, equal within rel relative
// (|a-b| <= rel * max(|a|, 1)), with the same size, pixel format and Cryptomatte header.
func (c EXRComparison) Within(t testing.TB, rel float64) {
	t.Helper()
	if len(c.Missing) > 0 {
		t.Fatalf("channels of Blender's file missing in the farm's: %q", c.Missing)
	}
	if len(c.Extra) > 0 {
		t.Fatalf("channels in the farm's file that Blender's lacks: %q", c.Extra)
	}
	if c.Size[0] != c.Size[2] || c.Size[1] != c.Size[3] {
		t.Fatalf("sizes differ: %v", c.Size)
	}
	if c.Format[0] != c.Format[1] {
		t.Fatalf("pixel formats differ: Blender's %s, the farm's %s", c.Format[0], c.Format[1])
	}
	var bad []string
	for n, w := range c.Worst {
		if w > rel {
			bad = append(bad, fmt.Sprintf("%s (%.3g)", n, w))
		}
	}
	if len(bad) > 0 {
		t.Fatalf("%d of %d channels differ by more than %g relative: %v", len(bad), c.Channels, rel, bad)
	}
	if !c.CryptoEqual {
		t.Fatal("the Cryptomatte header differs from Blender's")
	}
}
