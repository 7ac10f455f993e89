package objstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/minio/minio-go/v7/pkg/s3utils"
)

// s3MaxRetries bounds minio-go's own retries of one request; the farm retries
// whole operations with its own backoff, so a down server should surface fast.
const s3MaxRetries = 3

// S3Store is a Store on an S3 bucket (MinIO in practice). Create-if-absent is
// a conditional PUT with If-None-Match: *.
type S3Store struct {
	client *minio.Client
	bucket string
}

var _ Store = (*S3Store)(nil)

// NewS3Store connects to endpoint (HOST:PORT), over TLS when secure, and
// creates bucket if it does not exist yet.
func NewS3Store(ctx context.Context, endpoint, bucket string, secure bool, accessKey, secretKey string) (*S3Store, error) {
	return newS3Store(ctx, endpoint, bucket, secure, accessKey, secretKey, nil)
}

// newS3Store is NewS3Store whose requests go through wrap's round tripper when wrap is set:
// a test's, which damages them on the way.
func newS3Store(ctx context.Context, endpoint, bucket string, secure bool, accessKey, secretKey string,
	wrap func(http.RoundTripper) http.RoundTripper) (*S3Store, error) {
	if err := s3utils.CheckValidBucketNameStrict(bucket); err != nil {
		return nil, fmt.Errorf("s3 store: bucket %q: %w", bucket, err)
	}
	t, err := s3Transport(secure)
	if err != nil {
		return nil, fmt.Errorf("s3 store %s: %w", endpoint, err)
	}
	var transport http.RoundTripper = t
	if wrap != nil {
		transport = wrap(t)
	}
	client, err := minio.New(endpoint, &minio.Options{
		Creds:        credentials.NewStaticV4(accessKey, secretKey, ""),
		Secure:       secure,
		BucketLookup: minio.BucketLookupPath,
		MaxRetries:   s3MaxRetries,
		Transport:    transport,
	})
	if err != nil {
		return nil, redactError(fmt.Errorf("s3 store %s: %w", endpoint, err), secretKey)
	}
	s := &S3Store{client: client, bucket: bucket}
	if err := s.ensureBucket(ctx); err != nil {
		return nil, redactError(fmt.Errorf("s3 store %s: %w", endpoint, err), secretKey)
	}
	return s, nil
}

// ensureBucket creates the bucket unless it exists; a concurrent creator is fine.
func (s *S3Store) ensureBucket(ctx context.Context) error {
	ok, err := s.client.BucketExists(ctx, s.bucket)
	if err != nil {
		return fmt.Errorf("checking bucket %q: %w", s.bucket, err)
	}
	if ok {
		return nil
	}
	err = s.client.MakeBucket(ctx, s.bucket, minio.MakeBucketOptions{})
	if err != nil {
		var resp minio.ErrorResponse
		if errors.As(err, &resp) && (resp.Code == minio.BucketAlreadyOwnedByYou) {
			return nil
		}
		return fmt.Errorf("creating bucket %q: %w", s.bucket, err)
	}
	return nil
}

// Bucket returns the bucket name.
func (s *S3Store) Bucket() string { return s.bucket }

// put uploads data under key in one request.
func (s *S3Store) put(ctx context.Context, key string, data []byte, opts minio.PutObjectOptions) error {
	// One request per object: the conditional header applies to a single PUT,
	// and farm objects (tiles, frames, checkpoints) fit far below its limit.
	opts.DisableMultipart = true
	return s.upload(ctx, key, bytes.NewReader(data), int64(len(data)), opts)
}

// upload is put and PutStream: it sends size bytes of r under key, each request's body
// checked by the server against its MD5, and maps a body damaged on the way to ErrVerify.
func (s *S3Store) upload(ctx context.Context, key string, r io.Reader, size int64, opts minio.PutObjectOptions) error {
	opts.ContentType = "application/octet-stream"
	// The server checks the body against its MD5 and refuses one damaged on the way
	// (BadDigest): what it stores is what was sent, so nobody reads an upload back. The
	// signature then leaves the body out (a SHA-256 of it costs more CPU than its MD5).
	opts.SendContentMd5, opts.DisableContentSha256 = true, true
	_, err := s.client.PutObject(ctx, s.bucket, key, r, size, opts)
	var resp minio.ErrorResponse
	if errors.As(err, &resp) && (resp.Code == "BadDigest" || resp.Code == "XAmzContentSHA256Mismatch") {
		return fmt.Errorf("%w: the server received other bytes than were sent: %w", ErrVerify, err)
	}
	return err
}

// Put uploads data under key in one request, replacing any existing object.
func (s *S3Store) Put(ctx context.Context, key string, data []byte) error {
	if err := ValidateKey(key); err != nil {
		return fmt.Errorf("putting %q: %w", key, err)
	}
	if err := s.put(ctx, key, data, minio.PutObjectOptions{}); err != nil {
		return fmt.Errorf("putting %q: %w", key, err)
	}
	return nil
}

// The parts of a streamed upload. minio-go reads each part whole into one buffer before
// sending it (it needs the part's MD5 first), and an object of at most one part goes as a
// single PUT read whole the same way, so a PutStream holds one part: 16 MiB up to
// s3PartSize*s3MaxParts (156 GiB), past that size/s3MaxParts rounded up to a MiB (S3 allows
// no more parts). One upload thread (s3Threads) keeps it to one part at a time.
const (
	s3PartSize = 16 << 20
	s3MaxParts = 10000 // S3's limit on the parts of one upload
	s3Threads  = 1
)

// s3PartSizeFor is the part size of a streamed upload of size bytes: s3PartSize, or as
// little more as keeps it within s3MaxParts.
func s3PartSizeFor(size int64) uint64 {
	if size <= s3PartSize*s3MaxParts {
		return s3PartSize
	}
	const mib = 1 << 20
	return uint64((size/s3MaxParts + mib) / mib * mib)
}

// PutStream uploads size bytes of r under key: one PUT up to s3PartSize, a multipart upload
// past it, holding one part in memory either way (s3PartSize). Every read goes through a
// sizedReader, so a reader that fails, ends early, runs long or is cancelled fails the upload
// before it completes: a single PUT is then never sent, and minio-go aborts a multipart upload
// (deleting its parts), leaving any object already under key as it was.
func (s *S3Store) PutStream(ctx context.Context, key string, r io.Reader, size int64) error {
	if err := ValidateKey(key); err != nil {
		return fmt.Errorf("putting %q: %w", key, err)
	}
	if size < 0 {
		return fmt.Errorf("putting %q: negative size %d", key, size)
	}
	sr := newSizedReader(ctx, r, size)
	if size == 0 {
		// minio-go never reads an empty body: check here that r is empty and does not fail.
		if _, err := sr.Read(nil); err != io.EOF {
			return fmt.Errorf("putting %q: %w", key, err)
		}
	}
	opts := minio.PutObjectOptions{PartSize: s3PartSizeFor(size), NumThreads: s3Threads}
	if err := s.upload(ctx, key, sr, size, opts); err != nil {
		return fmt.Errorf("putting %q: %w", key, err)
	}
	return nil
}

// PutIfAbsent uploads data with If-None-Match: * so the server creates key
// only if it does not exist; a failed precondition becomes ErrExists.
func (s *S3Store) PutIfAbsent(ctx context.Context, key string, data []byte) error {
	if err := ValidateKey(key); err != nil {
		return fmt.Errorf("creating %q: %w", key, err)
	}
	opts := minio.PutObjectOptions{}
	opts.SetMatchETagExcept("*")
	if err := s.put(ctx, key, data, opts); err != nil {
		if isPreconditionFailed(err) {
			return fmt.Errorf("creating %q: %w", key, ErrExists)
		}
		return fmt.Errorf("creating %q: %w", key, err)
	}
	return nil
}

// isPreconditionFailed recognises the 412 answer to a conditional PUT. Some
// servers answer a concurrent conditional write with 409 ConditionalRequestConflict,
// which means the same thing here: somebody else created the key.
func isPreconditionFailed(err error) bool {
	var resp minio.ErrorResponse
	if !errors.As(err, &resp) {
		return false
	}
	return resp.StatusCode == http.StatusPreconditionFailed ||
		resp.Code == minio.PreconditionFailed ||
		resp.Code == "ConditionalRequestConflict" ||
		resp.Message == "At least one of the pre-conditions you specified did not hold"
}

// isNoSuchKey recognises a missing object.
func isNoSuchKey(err error) bool {
	var resp minio.ErrorResponse
	if !errors.As(err, &resp) {
		return false
	}
	return resp.Code == minio.NoSuchKey || resp.StatusCode == http.StatusNotFound && resp.Code != minio.NoSuchBucket
}

// Get downloads key.
func (s *S3Store) Get(ctx context.Context, key string) ([]byte, error) {
	if err := ValidateKey(key); err != nil {
		return nil, fmt.Errorf("getting %q: %w", key, err)
	}
	obj, err := s.client.GetObject(ctx, s.bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return nil, readErr("getting", key, err)
	}
	defer obj.Close()
	data, err := io.ReadAll(obj)
	if err != nil {
		return nil, readErr("getting", key, err)
	}
	return data, nil
}

// Open starts the download of key. minio-go sends the GET on the object's first use, so Open
// asks for its Stat, which sends it: a missing key fails here, not at the first Read, and the
// body then streams as it is read.
func (s *S3Store) Open(ctx context.Context, key string) (io.ReadCloser, ObjectInfo, error) {
	if err := ValidateKey(key); err != nil {
		return nil, ObjectInfo{}, fmt.Errorf("opening %q: %w", key, err)
	}
	obj, err := s.client.GetObject(ctx, s.bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return nil, ObjectInfo{}, readErr("opening", key, err)
	}
	info, err := obj.Stat()
	if err != nil {
		obj.Close()
		return nil, ObjectInfo{}, readErr("opening", key, err)
	}
	return obj, ObjectInfo{Key: key, Size: info.Size, ModTime: info.LastModified}, nil
}

// readErr is the error of a read (verb "getting" or "opening") of key: ErrNotFound for a
// missing key.
func readErr(verb, key string, err error) error {
	if isNoSuchKey(err) {
		return fmt.Errorf("%s %q: %w", verb, key, ErrNotFound)
	}
	return fmt.Errorf("%s %q: %w", verb, key, err)
}

// Stat returns key's size and last-modified time.
func (s *S3Store) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	if err := ValidateKey(key); err != nil {
		return ObjectInfo{}, fmt.Errorf("stat %q: %w", key, err)
	}
	info, err := s.client.StatObject(ctx, s.bucket, key, minio.StatObjectOptions{})
	if err != nil {
		if isNoSuchKey(err) {
			return ObjectInfo{}, fmt.Errorf("stat %q: %w", key, ErrNotFound)
		}
		return ObjectInfo{}, fmt.Errorf("stat %q: %w", key, err)
	}
	return ObjectInfo{Key: key, Size: info.Size, ModTime: info.LastModified}, nil
}

// List returns every object under prefix, recursively, sorted by key.
func (s *S3Store) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	if err := validatePrefix(prefix); err != nil {
		return nil, fmt.Errorf("listing %q: %w", prefix, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops minio-go's listing goroutine on early return
	var out []ObjectInfo
	for info := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if info.Err != nil {
			return nil, fmt.Errorf("listing %q: %w", prefix, info.Err)
		}
		out = append(out, ObjectInfo{Key: info.Key, Size: info.Size, ModTime: info.LastModified})
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("listing %q: %w", prefix, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// Delete removes key; S3 treats a missing key as success.
func (s *S3Store) Delete(ctx context.Context, key string) error {
	if err := ValidateKey(key); err != nil {
		return fmt.Errorf("deleting %q: %w", key, err)
	}
	if err := s.client.RemoveObject(ctx, s.bucket, key, minio.RemoveObjectOptions{}); err != nil && !isNoSuchKey(err) {
		return fmt.Errorf("deleting %q: %w", key, err)
	}
	return nil
}
