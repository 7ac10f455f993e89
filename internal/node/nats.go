package node

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/objstore"
)

// NATSClient says how a process reaches NATS: servers, credentials and TLS. Secrets come from
// files or the environment, never from a flag value a process listing would show, and never
// appear in a log line or an error.
type NATSClient struct {
	URLs     string // one URL or several, comma-separated (the nodes of a cluster)
	Creds    string // file: an nkey seed (as serve writes for workers) or a NATS JWT .creds file
	CA       string // file: CA certificate the servers' certificates must chain to
	Cert     string // file: client certificate, for servers that verify clients
	Key      string // file: the client certificate's key
	User     string // user name, with Password (from the environment)
	Password string
	Token    string // token (from the environment)
}

// options are the nats.Options of c, reconnecting forever: a node lost or a leader change is
// ridden through, not fatal.
func (c NATSClient) options(name string) ([]nats.Option, error) {
	opts := []nats.Option{nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond),
		nats.RetryOnFailedConnect(true), nats.Timeout(5 * time.Second)}
	if c.Creds != "" {
		o, err := credsOption(c.Creds)
		if err != nil {
			return nil, err
		}
		opts = append(opts, o)
	}
	if c.User != "" {
		opts = append(opts, nats.UserInfo(c.User, c.Password))
	}
	if c.Token != "" {
		opts = append(opts, nats.Token(c.Token))
	}
	if c.CA != "" {
		opts = append(opts, nats.RootCAs(c.CA))
	}
	if c.Cert != "" || c.Key != "" {
		if c.Cert == "" || c.Key == "" {
			return nil, errors.New("NATS TLS: a client certificate needs both --nats-cert and --nats-key")
		}
		opts = append(opts, nats.ClientCert(c.Cert, c.Key))
	}
	return opts, nil
}

// credsOption reads a credentials file: a NATS JWT .creds file, or an nkey user seed.
func credsOption(path string) (nats.Option, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading NATS credentials: %w", err)
	}
	defer clear(data)
	if bytes.Contains(data, []byte("BEGIN NATS USER JWT")) {
		return nats.UserCredentials(path), nil
	}
	if _, err := nkeys.ParseDecoratedNKey(data); err != nil {
		return nil, fmt.Errorf("NATS credentials %q: neither a .creds file nor an nkey seed", path)
	}
	o, err := nats.NkeyOptionFromSeed(path)
	if err != nil {
		return nil, fmt.Errorf("NATS credentials %q: %w", path, err)
	}
	return o, nil
}

// connect opens a connection to NATS. With RetryOnFailedConnect it returns at once even if no
// server answers yet; the connection keeps trying.
func (c NATSClient) connect(name string, log *slog.Logger) (*nats.Conn, error) {
	opts, err := c.options(name)
	if err != nil {
		return nil, err
	}
	shown := redactURLs(c.URLs)
	var failures atomic.Int64
	opts = append(opts,
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
			// Say why NATS cannot be reached (a refused credential, an untrusted certificate),
			// now and then rather than on every try.
			if n := failures.Add(1); n == 1 || n%20 == 0 {
				log.Warn("cannot reach NATS; retrying", "servers", shown, "tries", n, "err", err)
			}
		}),
		nats.ConnectHandler(func(nc *nats.Conn) { log.Info("connected to NATS", "server", nc.ConnectedServerName()) }),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("disconnected from NATS; reconnecting", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("reconnected to NATS", "server", nc.ConnectedServerName()) }))
	nc, err := nats.Connect(c.URLs, opts...)
	if err != nil {
		return nil, fmt.Errorf("connecting to NATS %s: %w", shown, err)
	}
	return nc, nil
}

// trustOwnCert is the TLS option of a client of our own embedded server: it trusts exactly that
// server's certificate and presents it as its client certificate.
func trustOwnCert(certFile, keyFile string) (nats.Option, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("NATS TLS certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("NATS TLS certificate: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return nats.Secure(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}), nil
}

// redactURLs drops credentials from every URL of a comma-separated list.
func redactURLs(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		parts[i] = RedactURL(strings.TrimSpace(p))
	}
	return strings.Join(parts, ",")
}

// Credential files serve writes into its data directory when it embeds NATS with
// authentication: the coordinator's identity, and the workers' one an operator copies to
// render nodes (tileworker --nats-creds FILE). Both are nkey user seeds, mode 0600, created
// once and reused on restart.
const (
	CoordinatorCredsFile = "coordinator.creds"
	WorkerCredsFile      = "worker.creds"
)

// EnsureCredentials returns the public keys of the coordinator's and the workers' identities
// under dir, creating their seed files the first time.
func EnsureCredentials(dir string) (coordinator, worker string, err error) {
	if coordinator, err = ensureSeed(filepath.Join(dir, CoordinatorCredsFile)); err != nil {
		return "", "", err
	}
	if worker, err = ensureSeed(filepath.Join(dir, WorkerCredsFile)); err != nil {
		return "", "", err
	}
	return coordinator, worker, nil
}

// ensureSeed returns the public key of the nkey user seed in path, writing a new one (0600)
// if there is none.
func ensureSeed(path string) (string, error) {
	if data, err := os.ReadFile(path); err == nil {
		defer clear(data)
		kp, err := nkeys.ParseDecoratedNKey(data)
		if err != nil {
			return "", fmt.Errorf("credentials %q are not an nkey seed; move the file away to make new ones", path)
		}
		defer kp.Wipe()
		if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
			return "", fmt.Errorf("credentials %q can be read by other users (mode %v): chmod 600 it", path, fi.Mode().Perm())
		}
		return kp.PublicKey()
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("reading credentials: %w", err)
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return "", fmt.Errorf("creating credentials: %w", err)
	}
	defer kp.Wipe()
	seed, err := kp.Seed()
	if err != nil {
		return "", err
	}
	defer clear(seed)
	data := []byte("-----BEGIN USER NKEY SEED-----\n" + string(seed) + "\n------END USER NKEY SEED------\n")
	defer clear(data)
	if err := objstore.WriteFileMode(path, data, 0o600); err != nil {
		return "", fmt.Errorf("writing credentials: %w", err)
	}
	return kp.PublicKey()
}

// waitSetUp retries fn while NATS is not ready for it (a cluster still electing its leaders, a
// server not reachable yet), for up to a minute; a configuration JetStream refuses is final.
func waitSetUp(ctx context.Context, what string, log *slog.Logger, fn func(context.Context) error) error {
	deadline := time.Now().Add(time.Minute)
	for try := 1; ; try++ {
		err := fn(ctx)
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) || errors.Is(err, queue.ErrInvalidConfig) {
			return err
		}
		if try == 1 || try%10 == 0 {
			log.Info("waiting for NATS", "step", what, "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}
