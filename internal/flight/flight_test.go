package flight

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestConcurrentGetsShareOneLoad(t *testing.T) {
	c := New[int](2)
	var loads atomic.Int32
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := c.Get(context.Background(), "a", func(context.Context) (int, error) {
				loads.Add(1)
				time.Sleep(20 * time.Millisecond)
				return 7, nil
			})
			if err != nil || v != 7 {
				t.Errorf("Get = %d, %v", v, err)
			}
		}()
	}
	wg.Wait()
	if n := loads.Load(); n != 1 {
		t.Fatalf("16 concurrent Gets loaded %d times, want once", n)
	}
}

func TestBoundedOldestFirstAndErrorsNotCached(t *testing.T) {
	c := New[string](2)
	ctx := context.Background()
	get := func(k string) (string, error) {
		return c.Get(ctx, k, func(context.Context) (string, error) { return "v" + k, nil })
	}
	for _, k := range []string{"a", "b", "c"} {
		if _, err := get(k); err != nil {
			t.Fatal(err)
		}
	}
	if c.Len() != 2 {
		t.Fatalf("Len = %d, want 2", c.Len())
	}
	reloaded := false
	if _, err := c.Get(ctx, "a", func(context.Context) (string, error) { reloaded = true; return "va", nil }); err != nil || !reloaded {
		t.Fatalf("the oldest value was not evicted (reloaded %v, %v)", reloaded, err)
	}
	boom := errors.New("boom")
	if _, err := c.Get(ctx, "x", func(context.Context) (string, error) { return "", boom }); !errors.Is(err, boom) {
		t.Fatalf("Get = %v, want the load's error", err)
	}
	if v, err := get("x"); err != nil || v != "vx" {
		t.Fatalf("a failed load was cached: %q, %v", v, err)
	}
	c.Forget("x")
	if c.Len() != 1 {
		t.Fatalf("Len after Forget = %d, want 1", c.Len())
	}
}

func TestWaiterHonoursItsContext(t *testing.T) {
	c := New[int](1)
	release := make(chan struct{})
	go func() {
		_, _ = c.Get(context.Background(), "k", func(context.Context) (int, error) { <-release; return 1, nil })
	}()
	time.Sleep(10 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := c.Get(ctx, "k", nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiter = %v, want its deadline", err)
	}
	close(release)
}

// Property: the load does not belong to the caller that started it. Cancelling that first
// caller makes it leave with its own error, while the load goes on, uncancelled, and every
// other waiter gets its value: no innocent caller fails because another gave up.
func TestFirstCallerCancelledLeavesTheLoadToTheOthers(t *testing.T) {
	c := New[int](1)
	started, release := make(chan struct{}), make(chan struct{})
	var loadErr atomic.Value
	first, cancel := context.WithCancel(context.Background())
	firstDone := make(chan error, 1)
	go func() {
		_, err := c.Get(first, "k", func(ctx context.Context) (int, error) {
			close(started)
			select {
			case <-release:
				return 7, nil
			case <-ctx.Done():
				loadErr.Store(ctx.Err())
				return 0, ctx.Err()
			}
		})
		firstDone <- err
	}()
	<-started
	second := make(chan int, 1)
	go func() {
		v, err := c.Get(context.Background(), "k", nil)
		if err != nil {
			t.Errorf("second waiter: %v", err)
		}
		second <- v
	}()
	time.Sleep(10 * time.Millisecond)
	cancel()
	if err := <-firstDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("first caller = %v, want its own cancellation", err)
	}
	close(release)
	if v := <-second; v != 7 {
		t.Fatalf("second waiter got %d, want the loaded 7", v)
	}
	if err := loadErr.Load(); err != nil {
		t.Fatalf("the load saw its first caller's cancellation: %v", err)
	}
	if v, err := c.Get(context.Background(), "k", nil); err != nil || v != 7 {
		t.Fatalf("cached value = %d, %v", v, err)
	}
}

// Each calls fn once for every index, never more than width at once, and stops at the first
// error, which it returns; a cancelled ctx is its error.
func TestEach(t *testing.T) {
	var running, most atomic.Int64
	seen := make([]atomic.Int64, 50)
	err := Each(context.Background(), len(seen), 3, func(ctx context.Context, i int) error {
		now := running.Add(1)
		for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
		}
		time.Sleep(time.Millisecond)
		seen[i].Add(1)
		running.Add(-1)
		return nil
	})
	if err != nil || most.Load() > 3 || most.Load() < 2 {
		t.Fatalf("Each = %v with %d at once, want nil and at most 3", err, most.Load())
	}
	for i := range seen {
		if seen[i].Load() != 1 {
			t.Fatalf("index %d called %d times", i, seen[i].Load())
		}
	}
	boom := errors.New("boom")
	var calls atomic.Int64
	err = Each(context.Background(), 1000, 2, func(ctx context.Context, i int) error {
		calls.Add(1)
		if i == 5 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) || calls.Load() > 20 {
		t.Fatalf("Each after an error = %v, %d calls; want boom and no more calls", err, calls.Load())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Each(ctx, 10, 2, func(context.Context, int) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("Each on a cancelled ctx = %v", err)
	}
	if err := Each(context.Background(), 0, 4, func(context.Context, int) error { return boom }); err != nil {
		t.Fatalf("Each of nothing = %v", err)
	}
}
