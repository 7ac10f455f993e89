// Package raster holds the farm's linear float frames and their encodings: placing tile
// buffers into a frame, the raw float buffer a promoted tile is stored as, tilefarm's tone
// curve, PNG (8 and 16 bit) and OpenEXR. It imports nothing of the farm, so a renderer that
// reads or writes images (the Blender adapter reads Cycles' EXR passes) links no object store.
package raster
