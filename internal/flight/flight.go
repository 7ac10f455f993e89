// Package flight is a bounded cache that loads each key at most once at a time: a process
// asked for the same scene by many slots at the same moment downloads and parses it once.
package flight

import (
	"context"
	"sync"
	"sync/atomic"
)

// Cache holds up to limit values by key, evicting the oldest first. The zero value is not
// usable; make one with New.
type Cache[V any] struct {
	mu      sync.Mutex
	limit   int
	values  map[string]V
	order   []string // oldest first
	loading map[string]*load[V]
}

type load[V any] struct {
	done chan struct{}
	v    V
	err  error
}

// New makes a cache of at most limit values.
func New[V any](limit int) *Cache[V] {
	return &Cache[V]{limit: max(limit, 1), values: map[string]V{}, loading: map[string]*load[V]{}}
}

// Get returns the cached value of key, or loads it with fn. Callers asking for a key while it
// loads share that one load and its outcome; an error is not cached. The load runs on a context
// of its own (ctx's values, none of its cancellation), so no caller's end is the others': a
// caller whose ctx ends while it waits, the first one included, gets ctx's error and leaves,
// and the load goes on for the others.
func (c *Cache[V]) Get(ctx context.Context, key string, fn func(context.Context) (V, error)) (V, error) {
	c.mu.Lock()
	if v, ok := c.values[key]; ok {
		c.mu.Unlock()
		return v, nil
	}
	l, ok := c.loading[key]
	if !ok {
		l = &load[V]{done: make(chan struct{})}
		c.loading[key] = l
		go func() {
			v, err := fn(context.WithoutCancel(ctx))
			c.mu.Lock()
			defer c.mu.Unlock()
			l.v, l.err = v, err
			delete(c.loading, key)
			if err == nil {
				c.putLocked(key, v)
			}
			close(l.done)
		}()
	}
	c.mu.Unlock()
	select {
	case <-l.done:
		return l.v, l.err
	case <-ctx.Done():
		var zero V
		return zero, ctx.Err()
	}
}

// Peek returns the cached value of key without loading it.
func (c *Cache[V]) Peek(key string) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.values[key]
	return v, ok
}

// Put stores a value under key.
func (c *Cache[V]) Put(key string, v V) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.putLocked(key, v)
}

// Forget drops key from the cache.
func (c *Cache[V]) Forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.values[key]; !ok {
		return
	}
	delete(c.values, key)
	for i, k := range c.order {
		if k == key {
			c.order = append(c.order[:i], c.order[i+1:]...)
			break
		}
	}
}

// Len is the number of cached values.
func (c *Cache[V]) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.values)
}

func (c *Cache[V]) putLocked(key string, v V) {
	if _, ok := c.values[key]; !ok {
		c.order = append(c.order, key)
		if len(c.order) > c.limit {
			delete(c.values, c.order[0])
			c.order = c.order[1:]
		}
	}
	c.values[key] = v
}

// Each runs fn for every i in [0, n), at most width at once (width <= 0: n), and returns the
// first error: after it no call starts, and the ctx the running ones were given is cancelled.
// A ctx that ends first is its error. It is the one bounded fan-out of the farm's many-file
// work: hashing a scene's files, uploading them, checking them in the store.
func Each(ctx context.Context, n, width int, fn func(ctx context.Context, i int) error) error {
	if width <= 0 || width > n {
		width = n
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range width {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(ctx, i); err != nil {
					cancel(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return context.Cause(ctx)
}
