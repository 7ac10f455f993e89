// Package blender renders Blender scenes with Cycles for the farm, with the same promises as the
// built-in path tracer: a tile is a border render of a pixel rectangle, its samples are split
// into a fixed partition of passes, and each pass's float result is added into float64 sums in
// order, so a tile checkpointed after any pass resumes on any node with the same bits, and a
// frame assembled from tiles equals a local reference render (docs/design.md, "Blender scenes").
//
// Blender runs as persistent child processes (a Pool, one per worker slot), each started as
// `blender -b --factory-startup --disable-autoexec` with driver.py (each render on the threads its
// request fixes: a slot's --threads, or more lent by idle slots), which takes requests
// over a pipe: inspect a .blend, render one pass of one tile, encode a float frame with the
// scene's colour management. Scripts embedded in a .blend never run.
//
// The package imports nothing from the farm.
package blender
