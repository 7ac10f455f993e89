// Package logtest holds what tests use to read what a component logged: a log sink that the
// component's goroutines may write while the test reads it.
package logtest

import (
	"bytes"
	"sync"
)

// Buffer is a log sink safe for concurrent writers and readers. Its zero value is ready.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String is everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
