//go:build linux

// Package e2e holds the end-to-end tests: real coordinator and tileworker processes, a real
// embedded JetStream, killed with SIGKILL and paused with SIGSTOP at the seams docs/design.md names,
// with every result compared pixel for pixel against a local reference render.
//
// Every test keeps to its own farm, directories, hosts and free ports, and calls t.Parallel:
// most of a farm test's time is waiting (on leases, outages, cut links, slow passes, a
// process starting), so test.sh runs several at once (go test's -parallel). No test asserts
// how long something took on this machine; a test that needs a fault to hit work in progress
// checks that it did, so a busier machine only makes the work last longer.
package e2e
