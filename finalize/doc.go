// Package finalize is the only way anything rendered by the farm becomes visible.
//
// It holds the finalization protocol on an object store (package objstore): upload to an
// attempt object, read back and verify, then promote by creating a manifest with
// create-if-absent; reading what a manifest names, verified; and garbage collection of the
// attempt objects and checkpoints no manifest names.
//
// Readers trust only objects named by a manifest. The package knows nothing about queues,
// leases, images or the coordinator; callers supply keys built from hashes, attempt ids and
// build fingerprints.
package finalize
