//go:build linux

package nettest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// DialContext dials addr from inside h's namespace, for the test process's own clients (an
// HTTP client of the coordinator, a readiness probe): the socket is made on an OS thread
// switched into the namespace for the dial alone, and keeps working from any thread after,
// since a socket belongs to the namespace it was made in. The test process needs no link of
// its own to the hosts, so nothing is added to the root namespace.
func (h *Host) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	target, err := os.Open("/var/run/netns/" + h.NS)
	if err != nil {
		return nil, fmt.Errorf("dialing %s from host %s: %w", addr, h.Name, err)
	}
	defer target.Close()
	type result struct {
		c   net.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		// The thread is switched back before it is released; if that fails it dies with the
		// goroutine (never unlocked), so no other goroutine ever runs in the host's namespace.
		runtime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			done <- result{err: err}
			runtime.UnlockOSThread()
			return
		}
		defer home.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- result{err: fmt.Errorf("entering the namespace of host %s: %w", h.Name, err)}
			runtime.UnlockOSThread()
			return
		}
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if unix.Setns(int(home.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		done <- result{c, err}
	}()
	r := <-done
	if r.err != nil {
		return nil, fmt.Errorf("dialing %s from host %s: %w", addr, h.Name, r.err)
	}
	return r.c, nil
}

// HTTPClient is an HTTP client whose connections are made from inside h (DialContext).
func (h *Host) HTTPClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = h.DialContext
	t.Proxy = nil
	return &http.Client{Transport: t}
}
