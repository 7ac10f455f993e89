package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/tilefarm/tilefarm/internal/platform"
)

// readyTimeout bounds how long StartEmbedded waits for the server when ctx has no earlier deadline.
const readyTimeout = 30 * time.Second

// Embedded is an in-process JetStream server: the single-machine farm and every test run against a real
// server rather than a fake, so dedup, ack-wait and KV semantics are the ones production sees.
type Embedded struct {
	srv  *server.Server
	dir  string
	base server.Options   // the options before any EmbeddedOption, which Reconfigure starts from
	opts []EmbeddedOption // the options it runs with
	// writeFailed is set when the server reports it could not write its store: a stream that
	// hit a full disk refuses every write after, even once space returns, until JetStream
	// restarts.
	writeFailed atomic.Bool
}

// EmbeddedOption configures StartEmbedded.
type EmbeddedOption func(*server.Options) error

// Sync is the embedded server's disk sync policy: "always" fsyncs every write, a duration
// fsyncs that often. A process crash loses nothing either way (written data is in the OS page
// cache); only an OS crash or power loss can lose what was written since the last sync.
// DefaultSync is the farm's choice; docs/design.md ("JetStream") gives its cost as measured.
type Sync string

// Sync policies.
const (
	SyncAlways Sync = "always"
	// DefaultSync syncs every second: a power loss loses at most a second of acknowledged
	// messages, and dispatch keeps its speed (always costs a disk flush per write batch).
	DefaultSync Sync = "1s"
)

// ParseSync validates a sync policy: "always" or a positive duration.
func ParseSync(s string) (Sync, error) {
	if s == string(SyncAlways) {
		return SyncAlways, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return "", fmt.Errorf("sync policy %q: want \"always\" or a positive duration such as 1s", s)
	}
	return Sync(s), nil
}

// WithSync sets the embedded server's sync policy (default DefaultSync).
func WithSync(s Sync) EmbeddedOption {
	return func(o *server.Options) error {
		if s == SyncAlways {
			o.SyncAlways = true
			return nil
		}
		d, err := time.ParseDuration(string(s))
		if err != nil || d <= 0 {
			return fmt.Errorf("sync policy %q: want \"always\" or a positive duration", s)
		}
		o.SyncInterval = d
		return nil
	}
}

// WithConfig applies nats-server configuration text, the same a nats-server process reads
// from its file: the farm's account and users (AccountConfig), TLS.
func WithConfig(conf string) EmbeddedOption {
	return func(o *server.Options) error {
		if err := o.ProcessConfigString(conf); err != nil {
			return fmt.Errorf("embedded nats configuration: %w", err)
		}
		return nil
	}
}

// WithTLS serves clients over TLS with the certificate and key files; with ca, clients must
// present a certificate it signed.
func WithTLS(cert, key, ca string) EmbeddedOption {
	return func(o *server.Options) error {
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: cert, KeyFile: key, CaFile: ca, Verify: ca != ""})
		if err != nil {
			return fmt.Errorf("embedded nats TLS: %w", err)
		}
		o.TLSConfig, o.TLS, o.TLSVerify = tc, true, ca != ""
		return nil
	}
}

// StartEmbedded starts a JetStream server with file storage under dir. listen "" opens only an ephemeral
// loopback client port; "host:port" listens there so external tileworkers can join (port 0 picks a free one).
func StartEmbedded(ctx context.Context, dir, listen string, opts ...EmbeddedOption) (*Embedded, error) {
	if dir == "" {
		return nil, errors.New("starting embedded nats: empty store dir")
	}
	host, port := "127.0.0.1", server.RANDOM_PORT
	if listen != "" {
		h, p, err := net.SplitHostPort(listen)
		if err != nil {
			return nil, fmt.Errorf("starting embedded nats: parsing listen address %q: %w", listen, err)
		}
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 || n > 65535 {
			return nil, fmt.Errorf("starting embedded nats: bad port in listen address %q", listen)
		}
		if n == 0 {
			n = server.RANDOM_PORT // 0 means the default 4222 to nats-server
		}
		host, port = h, n
		if host == "" {
			host = "0.0.0.0"
		}
	}
	sopts := &server.Options{
		ServerName:             "tilefarm-embedded",
		Host:                   host,
		Port:                   port,
		JetStream:              true,
		StoreDir:               dir,
		NoSigs:                 true, // the host process owns signal handling
		NoLog:                  true,
		DisableJetStreamBanner: true,
	}
	base := *sopts
	if err := applyEmbedded(sopts, opts); err != nil {
		return nil, fmt.Errorf("starting embedded nats: %w", err)
	}
	srv, err := server.NewServer(sopts)
	if err != nil {
		return nil, fmt.Errorf("starting embedded nats in %q: %w", dir, err)
	}
	srv.Start()

	deadline := time.Now().Add(readyTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	for !srv.ReadyForConnections(100 * time.Millisecond) {
		if ctx.Err() != nil || time.Now().After(deadline) {
			srv.Shutdown()
			srv.WaitForShutdown()
			if ctx.Err() != nil {
				return nil, fmt.Errorf("starting embedded nats in %q: %w", dir, ctx.Err())
			}
			return nil, fmt.Errorf("starting embedded nats in %q: not ready after %v", dir, readyTimeout)
		}
	}
	if !srv.JetStreamEnabled() {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, fmt.Errorf("starting embedded nats in %q: jetstream did not start", dir)
	}
	return &Embedded{srv: srv, dir: dir, base: base, opts: opts}, nil
}

func applyEmbedded(o *server.Options, opts []EmbeddedOption) error {
	for _, opt := range append([]EmbeddedOption{WithSync(DefaultSync)}, opts...) {
		if err := opt(o); err != nil {
			return err
		}
	}
	return nil
}

// Reconfigure applies opts to the running server in place of those it started with, as a
// nats-server reloads its configuration file: the farm's account with a worker identity added
// (AccountConfig) takes effect without a restart, and connections stay up.
func (e *Embedded) Reconfigure(opts ...EmbeddedOption) error {
	o := e.base
	if a, ok := e.srv.Addr().(*net.TCPAddr); ok {
		o.Port = a.Port // the port it took, where it was asked for any
	}
	if err := applyEmbedded(&o, opts); err != nil {
		return fmt.Errorf("reconfiguring embedded nats: %w", err)
	}
	if err := e.srv.ReloadOptions(&o); err != nil {
		return fmt.Errorf("reconfiguring embedded nats: %w", err)
	}
	e.opts = opts
	return nil
}

// ClientURL returns the TCP URL external clients (tileworkers in other processes) connect to.
func (e *Embedded) ClientURL() string { return e.srv.ClientURL() }

// Connect opens an in-process connection, which skips TCP for clients living in the same
// process; opts carry its credentials when the server requires them.
func (e *Embedded) Connect(name string, opts ...nats.Option) (*nats.Conn, error) {
	nc, err := nats.Connect(e.srv.ClientURL(), append([]nats.Option{nats.InProcessServer(e.srv), nats.Name(name)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("connecting %q to embedded nats: %w", name, err)
	}
	return nc, nil
}

// Shutdown stops the server and waits until its stores are closed, so the directory can be reopened.
func (e *Embedded) Shutdown() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}

// Writable reports whether JetStream runs and has written its store without error since it
// started. JetStream stops by itself, or a stream stops writing, when its disk is full; its
// clients stay connected, their requests refused.
func (e *Embedded) Writable() bool { return e.srv.JetStreamEnabled() && !e.writeFailed.Load() }

// restartRoom is the free space the store's disk needs before RestartJetStream tries: a
// restart on a disk still full would only fail again.
const restartRoom = 16 << 20

// RestartJetStream stops JetStream and starts it again from its store as it was left, which
// clears the streams' write errors. It fails while the store's disk has less than restartRoom
// free, or JetStream does not start.
func (e *Embedded) RestartJetStream() error {
	free, err := platform.FreeBytes(e.dir)
	if err != nil {
		return fmt.Errorf("restarting embedded JetStream: %w", err)
	}
	if free < restartRoom {
		return fmt.Errorf("restarting embedded JetStream: %d bytes free on the disk of %s, want %d", free, e.dir, restartRoom)
	}
	if e.srv.JetStreamEnabled() {
		if err := e.srv.ShutdownJetStream(); err != nil {
			return fmt.Errorf("restarting embedded JetStream: %w", err)
		}
	}
	e.writeFailed.Store(false)
	if err := e.Reconfigure(e.opts...); err != nil { // a reload starts a stopped JetStream
		return err
	}
	if !e.srv.JetStreamEnabled() {
		return errors.New("restarting embedded JetStream: it did not start")
	}
	return nil
}

// SetLog makes the server log its warnings and errors (a write to its store failing on a full
// disk, say) to log, and its notices at debug level.
func (e *Embedded) SetLog(log *slog.Logger) {
	e.srv.SetLoggerV2(serverLog{log: log, writeFailed: &e.writeFailed}, false, false, false)
}

// serverLog is nats-server's logger interface on slog. It notes a failed write to the store,
// which the server reports only in its log.
type serverLog struct {
	log         *slog.Logger
	writeFailed *atomic.Bool
}

func (l serverLog) Noticef(format string, v ...any) {
	l.log.Debug("nats-server: " + fmt.Sprintf(format, v...))
}
func (l serverLog) Warnf(format string, v ...any) {
	l.log.Warn("nats-server: " + fmt.Sprintf(format, v...))
}
func (l serverLog) Fatalf(format string, v ...any) { l.Errorf(format, v...) }
func (l serverLog) Debugf(string, ...any)          {}
func (l serverLog) Tracef(string, ...any)          {}
func (l serverLog) Errorf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if strings.Contains(msg, "no space left on device") || strings.Contains(msg, "write error") || strings.Contains(msg, "out of space") ||
		strings.Contains(msg, "out of resources") {
		l.writeFailed.Store(true)
	}
	l.log.Error("nats-server: " + msg)
}
