// Package failure classifies what goes wrong in a worker, so the farm spends a tile's failure
// budget only on the tile's own failures: a TerminalError no retry can fix (dead-lettered at
// once), a recovered panic, and the error codes every failure event carries, which tell an
// operator a flaky store from a poison tile (docs/design.md, "Failures, deliveries and the
// failure budget").
package failure
