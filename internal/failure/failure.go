package failure

import (
	"errors"
	"fmt"
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
	CodeMaxDeliveries = "max_deliveries" // MaxDeliver deliveries lost without a word (kills, lost connections)
)

// ErrLostDeliveries is the terminal failure of a message whose deliveries ended MaxDeliver
// times without a failure or a hand-back: its workers were killed or lost their connection
// each time, so the work itself is suspect (it may kill its worker).
var ErrLostDeliveries = errors.New("max deliveries exceeded")

// ErrorCode classifies a worker failure; retryable tells storage problems apart from the rest.
func Classify(err error, storage func(error) bool) string {
	var p *PanicError
	switch {
	case errors.Is(err, ErrLostDeliveries):
		return CodeMaxDeliveries
	case IsTerminal(err):
		return CodeTerminal
	case errors.As(err, &p):
		return CodePanic
	case storage != nil && storage(err):
		return CodeStorage
	}
	return CodeRetryable
}

// PanicError is a recovered panic: retried (it may be a one-off) until the failure budget says
// it is not.
type PanicError struct{ Value any }

func (e *PanicError) Error() string { return fmt.Sprintf("panic: %v", e.Value) }
