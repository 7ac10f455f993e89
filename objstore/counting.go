package objstore

import (
	"context"
	"io"
	"sync"
)

// Request is one request a Counting store passed on: its kind (the Store method: "Put",
// "PutIfAbsent", "Get", "Stat", "List", "Delete", "PutStream", "Open") and its key (a List's
// prefix).
type Request struct{ Kind, Key string }

// Counting is a Store that records every request made through it, for the tests and
// benchmarks that hold the farm to its store requests per tile (docs/design.md, "Store
// requests of a tile").
type Counting struct {
	Store
	mu   sync.Mutex
	reqs []Request
}

var _ Store = (*Counting)(nil)

// NewCounting counts the requests made to s.
func NewCounting(s Store) *Counting { return &Counting{Store: s} }

// Requests returns the requests recorded so far, in order.
func (c *Counting) Requests() []Request {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Request(nil), c.reqs...)
}

func (c *Counting) record(kind, key string) {
	c.mu.Lock()
	c.reqs = append(c.reqs, Request{kind, key})
	c.mu.Unlock()
}

// Put records and passes on the request.
func (c *Counting) Put(ctx context.Context, key string, data []byte) error {
	c.record("Put", key)
	return c.Store.Put(ctx, key, data)
}

// PutIfAbsent records and passes on the request.
func (c *Counting) PutIfAbsent(ctx context.Context, key string, data []byte) error {
	c.record("PutIfAbsent", key)
	return c.Store.PutIfAbsent(ctx, key, data)
}

// Get records and passes on the request.
func (c *Counting) Get(ctx context.Context, key string) ([]byte, error) {
	c.record("Get", key)
	return c.Store.Get(ctx, key)
}

// Stat records and passes on the request.
func (c *Counting) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	c.record("Stat", key)
	return c.Store.Stat(ctx, key)
}

// List records and passes on the request.
func (c *Counting) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	c.record("List", prefix)
	return c.Store.List(ctx, prefix)
}

// Delete records and passes on the request.
func (c *Counting) Delete(ctx context.Context, key string) error {
	c.record("Delete", key)
	return c.Store.Delete(ctx, key)
}

// PutStream records and passes on the request: one request, however many parts an S3 store
// sends it in.
func (c *Counting) PutStream(ctx context.Context, key string, r io.Reader, size int64) error {
	c.record("PutStream", key)
	return c.Store.PutStream(ctx, key, r, size)
}

// Open records and passes on the request.
func (c *Counting) Open(ctx context.Context, key string) (io.ReadCloser, ObjectInfo, error) {
	c.record("Open", key)
	return c.Store.Open(ctx, key)
}
