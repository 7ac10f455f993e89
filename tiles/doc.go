// Package tiles cuts frames into tiles: the row-major split of a frame into rectangles and the
// tile keys of a frame's tiles, derived and never stored. Tile size decides how work is cut,
// never what a pixel is.
package tiles
