// Package layout is the object-store layout the coordinator and the workers share
// (docs/design.md, "Storage layout (object store)"): where scene bundles, tile and frame
// manifests, and remote checkpoints are kept, the output formats and their object names, and
// how a promoted tile is read back (ReadTile, the assembler's and the monitor's reader). Keys
// are built from hashes only, never from user strings.
package layout
