package content

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
)

// VerifyingReader wraps r, hashing what is read, so content is checked as it streams rather
// than after it has been stored. When r reaches EOF it compares the count and digest with want
// and, if they differ, returns an error wrapping ErrMismatch from that last Read instead of
// io.EOF, so an upload streaming from it is refused by its writer. Reading more than want.Size
// bytes fails at once with ErrMismatch, so a longer stream is not read to its end. Errors are
// sticky: every Read after one returns it again.
func VerifyingReader(r io.Reader, want Ref) io.Reader {
	return &verifyingReader{r: r, want: want, h: sha256.New()}
}

type verifyingReader struct {
	r    io.Reader
	want Ref
	h    hash.Hash
	n    int64
	err  error
}

func (v *verifyingReader) Read(p []byte) (int, error) {
	if v.err != nil {
		return 0, v.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	// Read at most one byte past want.Size: enough to see the content is too long.
	if room := v.want.Size - v.n + 1; room >= 0 && int64(len(p)) > room {
		p = p[:room]
	}
	k, err := v.r.Read(p)
	v.h.Write(p[:k])
	v.n += int64(k)
	if v.n > v.want.Size {
		v.err = fmt.Errorf("content %s: %w: more than the %d bytes expected", v.want.SHA256, ErrMismatch, v.want.Size)
		// The bytes up to want.Size are good; the one past it is not delivered.
		good := max(0, k-int(v.n-v.want.Size))
		return good, v.err
	}
	switch {
	case errors.Is(err, io.EOF):
		if got := hex.EncodeToString(v.h.Sum(nil)); v.n != v.want.Size || got != v.want.SHA256 {
			v.err = fmt.Errorf("content %s: %w", v.want.SHA256, mismatch(v.want, got, v.n))
		} else {
			v.err = io.EOF
		}
		return k, v.err
	case err != nil:
		v.err = err
	}
	return k, err
}
