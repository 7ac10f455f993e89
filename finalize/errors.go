package finalize

import (
	"errors"
)

// ErrConflict is returned (wrapped) by Promote when a manifest already exists
// for the key with different content. It is terminal: retrying cannot help,
// because a frame is a pure function of its inputs and two different results
// for one key mean a determinism bug or a build mismatch.
var ErrConflict = errors.New("manifest conflict")
