package objstore

import (
	"context"
	"net"
	"net/http"
	"time"

	"github.com/minio/minio-go/v7"
)

// s3IdleTimeout is how long a store connection may make no progress (nothing sent, nothing
// received) before its request fails. A link that drops packets, unlike a server that is
// down, refuses nothing: without this a request would hang for as long as the link is cut,
// and its worker would hold its tile in silence. A failed request is a retryable error
// (a net.Error), which the worker reports and retries.
var s3IdleTimeout = 15 * time.Second // a variable for the test of a black-holed store

// s3Transport is minio-go's transport for S3 stores (its TLS settings included), whose
// connections time out when idle mid-request (idleConn), dials after 5 s, and responses whose
// headers do not come within s3IdleTimeout.
func s3Transport(secure bool) (*http.Transport, error) {
	t, err := minio.DefaultTransport(secure)
	if err != nil {
		return nil, err
	}
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &idleConn{Conn: c, idle: s3IdleTimeout}, nil
	}
	t.ResponseHeaderTimeout = s3IdleTimeout
	return t, nil
}

// idleConn is a connection whose every read and write must make progress within idle.
type idleConn struct {
	net.Conn
	idle time.Duration
}

func (c *idleConn) Read(p []byte) (int, error) {
	if err := c.Conn.SetReadDeadline(time.Now().Add(c.idle)); err != nil {
		return 0, err
	}
	return c.Conn.Read(p)
}

func (c *idleConn) Write(p []byte) (int, error) {
	if err := c.Conn.SetWriteDeadline(time.Now().Add(c.idle)); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}
