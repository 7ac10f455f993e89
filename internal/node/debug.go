package node

import (
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/tilefarm/tilefarm/internal/coordinator"
)

// IsLoopback reports whether a listen address only accepts this host's connections.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// serveDebug serves Go's profiles (/debug/pprof/) on addr, for finding where a process spends
// its time and memory. It is off unless asked for. Profiles show a process's memory and
// command line, so beyond loopback they need token as a bearer token (the API's), and without
// one serveDebug refuses to start.
func serveDebug(addr, token string) (func(), error) {
	if addr == "" {
		return func() {}, nil
	}
	if token == "" && !IsLoopback(addr) {
		return nil, fmt.Errorf("--debug-listen %s is beyond loopback: profiles need the API token there (set TILEFARM_API_TOKEN), or listen on 127.0.0.1", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening for profiles on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: coordinator.RequireToken(token, mux), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return func() { _ = srv.Close() }, nil
}
