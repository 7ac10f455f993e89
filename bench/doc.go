// Package bench holds tilefarm's benchmarks: farm efficiency against the local reference
// renderer, per-tile farm overhead, checkpoint resume rate and JetStream dispatch rate. The
// package has no code of its own; everything lives in its test files, so `go test -bench` runs
// the real farm in-process (embedded JetStream, filesystem store) with nothing else to start.
//
// Speed is only ever reported as a ratio against a baseline measured in the same run, because
// the machines it runs on are shared and noisy; no test asserts a wall-clock time.
package bench
