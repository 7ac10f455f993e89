package content

import "errors"

// The package's error values, checked with errors.Is; the errors returned wrap them with the
// path or hash concerned and what was expected and found.
var (
	// ErrMismatch is content whose SHA-256 or size differs from the Ref it was asked as: a
	// fetch that delivered other bytes, or an upload streaming other bytes than it declared.
	ErrMismatch = errors.New("content does not match its hash")
	// ErrSharedChanged is a file on a studio share that differs from what the submitter hashed:
	// someone edited or replaced it after submit, so rendering it would not render the job.
	ErrSharedChanged = errors.New("shared file changed since submit")
)
