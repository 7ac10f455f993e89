// Package finalize is the only way anything rendered by the farm becomes visible.
//
// It holds the object-store interface with its filesystem and S3 (MinIO)
// implementations, the finalization protocol (upload to an attempt object,
// read back and verify, then promote by creating a manifest with
// create-if-absent), garbage collection of orphaned attempt objects, and frame
// assembly: placing tile buffers into a frame, tone mapping, and encoding PNG
// and OpenEXR outputs.
//
// Readers trust only objects named by a manifest. The package knows nothing
// about queues, leases or the coordinator; callers supply keys built from
// hashes, attempt ids and build fingerprints.
package finalize
