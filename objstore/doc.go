// Package objstore is the object store the farm keeps everything durable in: one small
// interface (Store) with a filesystem and an S3 (MinIO) implementation, opened from a URL,
// its errors (retryable or not, IsRetryable) and the rules every key obeys. It knows nothing
// of manifests or tiles; the finalize package builds the promotion protocol on it. It also
// holds the atomic file write its filesystem store is made of, which the farm's other local
// files (outputs, cached scenes, credentials) use too.
package objstore
