package objstore

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"path"
	"strings"
	"time"
)

// ObjectInfo describes one stored object.
type ObjectInfo struct {
	Key     string
	Size    int64
	ModTime time.Time
}

// Store is the object storage the farm writes to. Keys are slash-separated and
// made from hashes, never from user strings. Every implementation makes a
// written object appear whole or not at all.
type Store interface {
	// Put writes data under key, replacing any existing object (attempt
	// objects, checkpoints, scenes).
	Put(ctx context.Context, key string, data []byte) error
	// PutIfAbsent atomically creates key with data, or returns an error
	// wrapping ErrExists when key already exists. It is the promotion primitive.
	PutIfAbsent(ctx context.Context, key string, data []byte) error
	// Get returns the object's content, or an error wrapping ErrNotFound.
	Get(ctx context.Context, key string) ([]byte, error)
	// Stat returns the object's metadata, or an error wrapping ErrNotFound.
	Stat(ctx context.Context, key string) (ObjectInfo, error)
	// List returns every object whose key starts with prefix, recursively,
	// sorted by key.
	List(ctx context.Context, prefix string) ([]ObjectInfo, error)
	// Delete removes key; a missing key is not an error.
	Delete(ctx context.Context, key string) error
	// PutStream writes size bytes read from r under key, replacing any existing object, without
	// holding them in memory. If r returns an error (or fewer or more than size bytes), nothing is
	// stored under key and the error is returned wrapped: a reader that verifies a hash at EOF can
	// refuse the upload by failing its last Read.
	PutStream(ctx context.Context, key string, r io.Reader, size int64) error
	// Open returns a reader of the object's content and its metadata, or an error wrapping
	// ErrNotFound. The caller closes it.
	Open(ctx context.Context, key string) (io.ReadCloser, ObjectInfo, error)
}

// Environment variables OpenStore reads S3 credentials from.
const (
	EnvAccessKey = "AWS_ACCESS_KEY_ID"
	EnvSecretKey = "AWS_SECRET_ACCESS_KEY"
)

// OpenStore opens the store named by a URL:
//
//	file:///abs/dir               filesystem store rooted at /abs/dir
//	s3://HOST[:PORT]/BUCKET       S3 over TLS
//	s3+http://HOST[:PORT]/BUCKET  S3 over plain HTTP (local MinIO)
//
// S3 credentials come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, never
// from the URL, and the bucket is created when missing. Errors name the URL
// without credentials and never contain the secret key.
func OpenStore(ctx context.Context, rawURL string) (Store, error) {
	return openStore(ctx, rawURL, os.Getenv)
}

// openStore is OpenStore with the environment lookup injected for tests.
func openStore(ctx context.Context, rawURL string, getenv func(string) string) (Store, error) {
	shown := redactURL(rawURL)
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("parsing store URL %q: malformed URL", shown)
	}
	if u.User != nil {
		return nil, fmt.Errorf("store URL %q: credentials in the URL are not allowed; set %s and %s", shown, EnvAccessKey, EnvSecretKey)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return nil, fmt.Errorf("store URL %q: query, fragment or opaque parts are not allowed", shown)
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return nil, fmt.Errorf("store URL %q: file URLs take an absolute path (file:///dir), not host %q", shown, u.Host)
		}
		if u.Path == "" || !path.IsAbs(u.Path) {
			return nil, fmt.Errorf("store URL %q: file URLs need an absolute directory", shown)
		}
		s, err := NewFSStore(path.Clean(u.Path))
		if err != nil {
			return nil, fmt.Errorf("opening store %q: %w", shown, err)
		}
		return s, nil
	case "s3", "s3+http":
		if u.Host == "" || u.Hostname() == "" {
			return nil, fmt.Errorf("store URL %q: missing host (want %s://HOST:PORT/BUCKET)", shown, u.Scheme)
		}
		if p := u.Port(); strings.HasSuffix(u.Host, ":") || (p != "" && !isPort(p)) {
			return nil, fmt.Errorf("store URL %q: invalid port", shown)
		}
		bucket := strings.TrimSuffix(strings.TrimPrefix(u.Path, "/"), "/")
		if bucket == "" || strings.Contains(bucket, "/") {
			return nil, fmt.Errorf("store URL %q: want exactly one path segment naming the bucket", shown)
		}
		access, secret := getenv(EnvAccessKey), getenv(EnvSecretKey)
		if access == "" || secret == "" {
			return nil, fmt.Errorf("store URL %q: %s and %s must be set", shown, EnvAccessKey, EnvSecretKey)
		}
		s, err := NewS3Store(ctx, u.Host, bucket, u.Scheme == "s3", access, secret)
		if err != nil {
			return nil, fmt.Errorf("opening store %q: %w", shown, redactError(err, secret))
		}
		return s, nil
	case "":
		return nil, fmt.Errorf("store URL %q: missing scheme (want file:///DIR, s3://HOST:PORT/BUCKET or s3+http://HOST:PORT/BUCKET)", shown)
	default:
		return nil, fmt.Errorf("store URL %q: unsupported scheme %q (want file, s3 or s3+http)", shown, u.Scheme)
	}
}

// isPort reports whether p is a decimal TCP port number.
func isPort(p string) bool {
	if len(p) == 0 || len(p) > 5 {
		return false
	}
	n := 0
	for _, c := range p {
		if c < '0' || c > '9' {
			return false
		}
		n = n*10 + int(c-'0')
	}
	return n > 0 && n < 65536
}

// redactURL removes any userinfo from a URL so that it can appear in errors
// and logs. Unparsable input is cut at the last '@' before the host.
func redactURL(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return raw
	}
	hostEnd := strings.IndexAny(rest, "/?#")
	if hostEnd < 0 {
		hostEnd = len(rest)
	}
	if at := strings.LastIndex(rest[:hostEnd], "@"); at >= 0 {
		rest = "REDACTED@" + rest[at+1:]
	}
	return scheme + "://" + rest
}

// redactedError carries an error whose text had a secret removed while
// keeping the original chain for errors.Is/As.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// redactError hides secret from err's text, as defence in depth: no code path
// is known to echo it, but an error message is the easiest place to leak it.
func redactError(err error, secret string) error {
	if err == nil || secret == "" || !strings.Contains(err.Error(), secret) {
		return err
	}
	return &redactedError{msg: strings.ReplaceAll(err.Error(), secret, "REDACTED"), err: err}
}

// tempPrefix starts the names of the filesystem store's temporary files;
// keys may not use it so that temp files are never mistaken for objects.
const tempPrefix = ".tmp-"

// maxKeyLen bounds keys to what S3 accepts.
const maxKeyLen = 1024

// ValidateKey checks an object key: non-empty, relative, slash-separated
// segments that are neither empty, "." nor contain "..", and no backslashes or
// control characters. Both stores enforce it so that a key means the same
// object everywhere and cannot escape the filesystem store's root.
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty", ErrBadKey)
	}
	if err := checkKeyChars(key); err != nil {
		return err
	}
	for _, seg := range strings.Split(key, "/") {
		if err := checkSegment(key, seg); err != nil {
			return err
		}
	}
	return nil
}

// validatePrefix checks a List prefix: empty, or a key that may end with "/".
func validatePrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	if err := checkKeyChars(prefix); err != nil {
		return err
	}
	segs := strings.Split(strings.TrimSuffix(prefix, "/"), "/")
	for _, seg := range segs {
		if err := checkSegment(prefix, seg); err != nil {
			return err
		}
	}
	return nil
}

func checkKeyChars(key string) error {
	if len(key) > maxKeyLen {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrBadKey, len(key), maxKeyLen)
	}
	if strings.HasPrefix(key, "/") {
		return fmt.Errorf("%w: %q is absolute", ErrBadKey, key)
	}
	if strings.Contains(key, "..") {
		return fmt.Errorf("%w: %q contains \"..\"", ErrBadKey, key)
	}
	for _, c := range key {
		if c == '\\' || c < 0x20 || c == 0x7f {
			return fmt.Errorf("%w: %q contains a backslash or control character", ErrBadKey, key)
		}
	}
	return nil
}

func checkSegment(key, seg string) error {
	switch {
	case seg == "":
		return fmt.Errorf("%w: %q has an empty segment", ErrBadKey, key)
	case seg == ".":
		return fmt.Errorf("%w: %q has a \".\" segment", ErrBadKey, key)
	case strings.HasPrefix(seg, tempPrefix):
		return fmt.Errorf("%w: %q uses the reserved prefix %q", ErrBadKey, key, tempPrefix)
	}
	return nil
}
