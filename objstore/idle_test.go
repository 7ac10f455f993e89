package objstore

import (
	"context"
	"net"
	"testing"
	"time"
)

// Property: a store behind a link that drops packets fails its requests with a retryable
// error instead of hanging: here a listener accepts connections and never answers.
func TestS3StoreBehindABlackHoleTimesOut(t *testing.T) {
	defer func(d time.Duration) { s3IdleTimeout = d }(s3IdleTimeout)
	s3IdleTimeout = 300 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never read or written
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	_, err = NewS3Store(ctx, ln.Addr().String(), "farm", false, "access", "secret-key-never-logged")
	if err == nil || !IsRetryable(err) {
		t.Fatalf("a black-holed store = %v, want a retryable error", err)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("the request hung %v before failing", took)
	}
}
