package objstore

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/minio/minio-go/v7"
)

// ErrNotFound is returned (wrapped) when an object or manifest does not exist.
var ErrNotFound = errors.New("object not found")

// ErrExists is returned (wrapped) by PutIfAbsent when the key already exists.
// It is how a store reports that somebody else promoted first.
var ErrExists = errors.New("object already exists")

// ErrBadKey is returned (wrapped) for object keys the stores refuse: empty,
// absolute, with "..", empty segments, backslashes or control characters.
var ErrBadKey = errors.New("invalid object key")

// ErrCorrupt is returned (wrapped) by ReadObject when an object named by a
// manifest no longer matches the size or checksum the manifest recorded.
var ErrCorrupt = errors.New("object corrupt")

// ErrVerify is returned (wrapped) when a store refuses an upload whose bytes
// arrived damaged (an S3 server's BadDigest: they do not match the request's
// Content-MD5 or signed payload hash). It is retryable: the upload goes again.
var ErrVerify = errors.New("upload verification failed")

// IsRetryable reports whether err is worth retrying later: network errors,
// timeouts, refused or reset connections, 5xx and throttling responses from
// S3, and failed upload verification. Missing objects, existing objects,
// manifest conflicts, corrupt objects, bad keys and cancelled contexts are
// terminal for the operation that returned them.
func IsRetryable(err error) bool {
	if err == nil {
		return false
	}
	for _, terminal := range []error{ErrNotFound, ErrExists, ErrBadKey, ErrCorrupt, context.Canceled} {
		if errors.Is(err, terminal) {
			return false
		}
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrVerify) {
		return true
	}
	var resp minio.ErrorResponse
	if errors.As(err, &resp) && (resp.StatusCode != 0 || resp.Code != "") {
		return s3Retryable(resp)
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return true
	}
	for _, transient := range []error{
		syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE,
		syscall.ETIMEDOUT, syscall.EHOSTUNREACH, syscall.ENETUNREACH,
		syscall.EAGAIN, syscall.EINTR, syscall.ENOSPC,
		io.ErrUnexpectedEOF,
	} {
		if errors.Is(err, transient) {
			return true
		}
	}
	return false
}

// s3Retryable classifies an S3 error response: server-side failures and
// throttling are transient, client errors (403, 404, 412, bad requests) are not.
func s3Retryable(resp minio.ErrorResponse) bool {
	switch resp.Code {
	case "RequestError", "RequestTimeout", "Throttling", "ThrottlingException",
		"RequestLimitExceeded", "RequestThrottled", "InternalError", "SlowDown",
		"SlowDownWrite", "SlowDownRead", "ServiceUnavailable", "XMinioServerNotInitialized",
		"XMinioStorageFull":
		return true
	}
	return resp.StatusCode >= 500 || resp.StatusCode == 429 || resp.StatusCode == 408
}
