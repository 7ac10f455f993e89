// Package bundle is the scene bundle: a scene document with every file it needs, stored once
// in the object store under its scene version and fetched by every worker that renders it. It
// knows the encoding (a header of sizes, then the raw files, decoded without a copy) and the
// limits of a bundle, not what kind of scene it holds: the scene kinds (internal/scene) read,
// check and load its content.
package bundle
