// Package content is the render node's side of moving scenes by content: a scene and every file
// it uses travel as files named by their SHA-256 and size (a Ref), stored once in the object
// store under that hash, and each worker keeps a local Cache of them by hash, shared by every
// job and render slot of its process, so a texture used by a hundred jobs crosses the network
// once. The package also holds the hashing helpers the submitter and the worker share (HashFile,
// HashFiles, VerifyingReader) and the mapping of a studio share onto a node's mount of it
// (SharedRoot, VerifyShared), for files read in place rather than fetched.
//
// No file is ever held whole in memory: everything streams through fixed buffers.
package content
