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
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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

// How a client finds its link to a server dead: a ping every pingInterval, and the link given
// up when maxPingsOut go unanswered.
const (
	pingInterval = 5 * time.Second
	maxPingsOut  = 3
)

// How a client finds that the server it is connected to no longer serves JetStream though the
// link is up: a JetStream request every jetStreamCheckEvery, and the server left for another
// of its pool after jetStreamCheckFails failures in a row.
const (
	jetStreamCheckEvery = 2 * time.Second
	jetStreamCheckFails = 3
)

// watchJetStream moves nc to another server of its pool when the one it is connected to stops
// answering JetStream requests while the link itself stays up: a node cut off from the rest
// of its cluster keeps its clients, which would otherwise wait there, their work stalled,
// until the cluster healed, though the other nodes serve. It runs until ctx is done.
func watchJetStream(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, log *slog.Logger) {
	t := time.NewTicker(jetStreamCheckEvery)
	defer t.Stop()
	fails := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !nc.IsConnected() {
			fails = 0
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, jetStreamCheckEvery)
		_, err := js.AccountInfo(cctx)
		cancel()
		if err == nil || ctx.Err() != nil {
			fails = 0
			continue
		}
		if fails++; fails < jetStreamCheckFails || len(nc.Servers()) < 2 {
			continue
		}
		log.Warn("the NATS server does not answer JetStream requests; moving to another", "server", nc.ConnectedServerName(),
			"tries", fails, "err", err)
		fails = 0
		if err := nc.ForceReconnect(); err != nil {
			log.Warn("cannot move to another NATS server", "err", err)
		}
	}
}

// options are the nats.Options of c, reconnecting forever: a node lost or a leader change is
// ridden through, not fatal. A worker's connection (worker) with an nkey identity takes that
// identity's own inbox prefix, the only inbox its credential may read.
func (c NATSClient) options(name string, worker bool) ([]nats.Option, error) {
	opts := []nats.Option{nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond),
		nats.RetryOnFailedConnect(true), nats.Timeout(5 * time.Second),
		// A link that drops packets is found dead in at most pingInterval*(maxPingsOut+1) and
		// left for another server, rather than after nats' default of minutes.
		nats.PingInterval(pingInterval), nats.MaxPingsOutstanding(maxPingsOut)}
	if c.Creds != "" {
		o, pub, err := credsOption(c.Creds)
		if err != nil {
			return nil, err
		}
		opts = append(opts, o)
		if worker {
			opts = append(opts, nats.CustomInboxPrefix(queue.WorkerInboxPrefix(pub)))
		}
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

// credsOption reads a credentials file, a NATS JWT .creds file or an nkey user seed, and
// returns the option that presents it and the identity's public key.
func credsOption(path string) (opt nats.Option, pub string, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, "", fmt.Errorf("reading NATS credentials: %w", err)
	}
	defer clear(data)
	kp, err := nkeys.ParseDecoratedNKey(data) // a .creds file's seed too
	if err != nil {
		return nil, "", fmt.Errorf("NATS credentials %q: neither a .creds file nor an nkey seed", path)
	}
	defer kp.Wipe()
	if pub, err = kp.PublicKey(); err != nil {
		return nil, "", fmt.Errorf("NATS credentials %q: %w", path, err)
	}
	if bytes.Contains(data, []byte("BEGIN NATS USER JWT")) {
		return nats.UserCredentials(path), pub, nil
	}
	if opt, err = nats.NkeyOptionFromSeed(path); err != nil {
		return nil, "", fmt.Errorf("NATS credentials %q: %w", path, err)
	}
	return opt, pub, nil
}

// connect opens a connection to NATS. With RetryOnFailedConnect it returns at once even if no
// server answers yet; the connection keeps trying.
func (c NATSClient) connect(name string, worker bool, log *slog.Logger) (*nats.Conn, error) {
	opts, err := c.options(name, worker)
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
// authentication: the coordinator's identity, a first worker identity an operator may copy to
// a render node (tileworker --nats-creds FILE), and one identity per render node under
// WorkerCredsDir, NAME.creds, made by `coordinator credentials --worker NAME`. All are nkey
// user seeds, mode 0600, created once and reused on restart. Each worker identity reads only
// its own inbox (queue.WorkerInboxPrefix), so workers sharing one see each other's replies:
// give each render node its own.
const (
	CoordinatorCredsFile = "coordinator.creds"
	WorkerCredsFile      = "worker.creds"
	WorkerCredsDir       = "workers"
)

// Identities are the public keys of a farm's NATS identities.
type Identities struct {
	Coordinator string
	Workers     []string // WorkerCredsFile's, then WorkerCredsDir's by file name
}

// AccountConfig is the nats-server configuration granting the identities their permissions.
func (i Identities) AccountConfig() string { return queue.AccountConfig(i.Coordinator, i.Workers...) }

// EnsureCredentials returns the public keys of the farm's identities under dir, creating the
// coordinator's and the first worker's seed files the first time.
func EnsureCredentials(dir string) (Identities, error) {
	var ids Identities
	var err error
	if ids.Coordinator, err = ensureSeed(filepath.Join(dir, CoordinatorCredsFile)); err != nil {
		return ids, err
	}
	first, err := ensureSeed(filepath.Join(dir, WorkerCredsFile))
	if err != nil {
		return ids, err
	}
	ids.Workers = append(ids.Workers, first)
	entries, err := os.ReadDir(filepath.Join(dir, WorkerCredsDir))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return ids, fmt.Errorf("reading worker identities: %w", err)
	}
	for _, e := range entries { // sorted by name
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".creds") {
			continue
		}
		pub, err := readSeed(filepath.Join(dir, WorkerCredsDir, e.Name()))
		if err != nil {
			return ids, err
		}
		ids.Workers = append(ids.Workers, pub)
	}
	return ids, nil
}

// validIdentityName is what a worker identity may be called: a file name on every system.
var validIdentityName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// EnsureWorkerCredentials returns the seed file of the worker identity called name under dir,
// creating it the first time.
func EnsureWorkerCredentials(dir, name string) (string, error) {
	if !validIdentityName.MatchString(name) {
		return "", fmt.Errorf("worker identity %q: want letters, digits, '.', '_' or '-', at most 64", name)
	}
	if err := os.MkdirAll(filepath.Join(dir, WorkerCredsDir), 0o700); err != nil {
		return "", fmt.Errorf("creating the worker identities' directory: %w", err)
	}
	path := filepath.Join(dir, WorkerCredsDir, name+".creds")
	_, err := ensureSeed(path)
	return path, err
}

// readSeed returns the public key of the nkey user seed in path, which only its owner may read.
func readSeed(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading credentials: %w", err)
	}
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
}

// ensureSeed returns the public key of the nkey user seed in path, writing a new one (0600)
// if there is none.
func ensureSeed(path string) (string, error) {
	if _, err := os.Stat(path); err == nil {
		return readSeed(path)
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
