// Package checkpoint is how a tile in progress survives a kill: the Checkpoint a tile's state
// is saved as (its float64 sums and next sample, with the inputs and build it belongs to), its
// compact versioned encoding (Codec: byte-shuffled, zstd, CRC-checked), and Local, the worker's
// own checkpoint database (one bbolt file). Remote checkpoints are the same bytes in the object
// store (docs/design.md, "Checkpoints").
package checkpoint
