// Package e2e holds the end-to-end tests: real coordinator and tileworker processes, a real
// embedded JetStream, killed with SIGKILL and paused with SIGSTOP at the seams docs/design.md names,
// with every result compared pixel for pixel against a local reference render.
//
// Most tests run one at a time, as their timings are the machine's. Those that spend their time
// waiting (on leases, outages, cut links, slow passes) and keep to their own farm, hosts and free
// ports call t.Parallel, and run two at a time after the others (go test's -parallel).
package e2e
