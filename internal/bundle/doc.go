// Package bundle is a scene's manifest: the scene document and every file it needs, by its
// relative name, size and SHA-256. Each file is stored once in the object store under its hash
// and never uploaded again by any job; the manifest is stored under the scene version, its own
// hash, and workers fetch the files it names into their cache (internal/content). It knows the
// encoding and the limits of a manifest, and reads content through a Source (the artist's disk,
// the store, a worker's cache), never what kind of scene it holds: the scene kinds
// (internal/scene) read, check and load its content (docs/design.md, "Scenes by content").
package bundle
