// Package e2e holds the end-to-end tests: real coordinator and tileworker processes, a real
// embedded JetStream, killed with SIGKILL and paused with SIGSTOP at the seams docs/design.md names,
// with every result compared pixel for pixel against a local reference render.
package e2e
