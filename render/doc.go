// Package render is tilefarm's CPU path tracer: it parses scene files, builds a
// BVH per animation frame and renders pixel rectangles (tiles) progressively.
//
// Everything a tile produces is a pure function of (scene, settings, frame,
// pixel, sample index): its numbers are Owen-scrambled Sobol points whose
// index and scrambles are stateless hashes of those values (sampler.go), and every pixel adds its samples in sample-index order into float64
// accumulators. That is what lets the farm split a frame into any tiles, stop
// a tile after any pass, checkpoint it and resume it elsewhere with the exact
// same bits as an uninterrupted render.
//
// The package imports nothing from the farm.
package render

// Version names the pixel-affecting behaviour of this renderer. The farm folds
// it into the settings hash, so it must be bumped on any change that alters a
// single pixel (sampling, materials, BVH tie-breaking, parsing defaults ...).
const Version = "pt-2"
