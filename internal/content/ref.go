package content

import (
	"fmt"
)

// Ref names one file's content: its SHA-256 and size. The size travels with the hash so a
// wrong length is refused by a cheap comparison before any byte is hashed.
type Ref struct {
	SHA256 string // lowercase hex, 64 chars
	Size   int64
}

// ValidSHA256 reports whether s is 64 lowercase hex digits, the only spelling of a hash the
// package accepts: it names files in the cache and keys in the store, so one content has one
// name.
func ValidSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// checkRef refuses a Ref that cannot name any content, before it is used as a file name.
func checkRef(ref Ref) error {
	if !ValidSHA256(ref.SHA256) {
		return fmt.Errorf("invalid content ref: sha256 %q is not 64 lowercase hex digits", ref.SHA256)
	}
	if ref.Size < 0 {
		return fmt.Errorf("invalid content ref %s: negative size %d", ref.SHA256, ref.Size)
	}
	return nil
}

// mismatch is the error of content that is not ref: it wraps ErrMismatch and says what was
// expected and found.
func mismatch(ref Ref, gotSHA string, gotSize int64) error {
	if gotSize != ref.Size {
		return fmt.Errorf("%w: size expected %d, found %d", ErrMismatch, ref.Size, gotSize)
	}
	return fmt.Errorf("%w: sha256 expected %s, found %s", ErrMismatch, ref.SHA256, gotSHA)
}
