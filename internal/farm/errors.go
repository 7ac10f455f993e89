package farm

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/tilefarm/tilefarm/render"
)

// TerminalError marks a failure that no retry can fix (an invalid scene, a manifest conflict):
// the message is dead-lettered at once instead of burning its deliveries.
type TerminalError struct{ Err error }

func (e *TerminalError) Error() string { return e.Err.Error() }
func (e *TerminalError) Unwrap() error { return e.Err }

// Terminal wraps err as terminal.
func Terminal(err error) error {
	if err == nil {
		return nil
	}
	return &TerminalError{Err: err}
}

// Terminalf formats a terminal error.
func Terminalf(format string, args ...any) error { return Terminal(fmt.Errorf(format, args...)) }

// IsTerminal reports whether err (or anything it wraps) is terminal.
func IsTerminal(err error) bool {
	var t *TerminalError
	return errors.As(err, &t)
}

// Error classes recorded with every failed attempt, so an operator can tell a flaky store from a
// poison tile at a glance.
const (
	CodeRetryable     = "retryable"      // failed, will be retried
	CodeStorage       = "storage"        // the object store stayed unreachable through in-place retries
	CodePanic         = "panic"          // the renderer panicked
	CodeTerminal      = "terminal"       // can never succeed: invalid scene, build mismatch, manifest conflict
	CodeMaxDeliveries = "max_deliveries" // the queue gave up after MaxDeliver deliveries
)

// ErrorCode classifies a worker failure; retryable tells storage problems apart from the rest.
func ErrorCode(err error, storage func(error) bool) string {
	var p *PanicError
	switch {
	case IsTerminal(err):
		return CodeTerminal
	case errors.As(err, &p):
		return CodePanic
	case storage != nil && storage(err):
		return CodeStorage
	}
	return CodeRetryable
}

// PanicError is a recovered panic: retried (it may be a one-off) until MaxDeliver says it is not.
type PanicError struct{ Value any }

func (e *PanicError) Error() string { return fmt.Sprintf("panic: %v", e.Value) }

// BuildFingerprint identifies the build that rendered something: all workers of a farm must run
// the same one, and every manifest records it.
func BuildFingerprint() string {
	amd64 := ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "GOAMD64" {
				amd64 = "/" + s.Value
			}
		}
	}
	return fmt.Sprintf("%s %s%s render/%s", runtime.Version(), runtime.GOARCH, amd64, render.Version)
}

// BuildFor is the build fingerprint of tiles and frames rendered with st: this build's, plus
// the external renderer's (Blender's version, Cycles kernel and BVH) for scenes that need one.
// Manifests and checkpoints record it, so neither is ever mixed across builds.
func BuildFor(st render.Settings) string {
	if st.Build == "" {
		return BuildFingerprint()
	}
	return BuildFingerprint() + "; " + st.Build
}
