// Package identity derives every identity of the farm from what it identifies (docs/design.md,
// "Identities"): scene versions, settings hashes, frame and tile keys, input hashes, job ids,
// idempotency keys, payload hashes, attempt ids and build fingerprints. Each is a domain-tagged
// sha256 over length-prefixed fields, so no two identities ever share a value, and a change
// that could change a pixel changes the key.
package identity
