package objstore

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

func TestOpenStoreFile(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenStore(context.Background(), "file://"+filepath.ToSlash(dir)+"/store")
	if err != nil {
		t.Fatal(err)
	}
	fs, ok := s.(*FSStore)
	if !ok || fs.Root() != filepath.Join(dir, "store") {
		t.Fatalf("OpenStore gave %T rooted at %v", s, fs)
	}
	if err := s.Put(context.Background(), "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
}

func TestOpenStoreBadURLs(t *testing.T) {
	const secret = "SuperSecretKey-9f8e7d"
	env := envOf([]string{EnvAccessKey + "=AKID", EnvSecretKey + "=" + secret})
	cases := []struct {
		url, wantInErr string
	}{
		{"", "missing scheme"},
		{"/just/a/path", "missing scheme"},
		{"ftp://host/bucket", "unsupported scheme"},
		{"file://relative/dir", "absolute path"},
		{"file:relative", "opaque"},
		{"file://", "absolute directory"},
		{"s3://", "missing host"},
		{"s3:///bucket", "missing host"},
		{"s3://host:port/bucket", "malformed"},
		{"s3://host:99999/bucket", "invalid port"},
		{"s3://host:9000", "bucket"},
		{"s3://host:9000/", "bucket"},
		{"s3://host:9000/a/b", "bucket"},
		{"s3://host:9000/Bad_Bucket", "bucket"},
		{"s3://host:9000/bucket?region=x", "query"},
		{"s3+http://AKID:" + secret + "@host:9000/bucket", "credentials in the URL"},
		{"s3+https://host:9000/bucket", "unsupported scheme"},
		{"s3://ho st:9000/bucket", "malformed"},
	}
	for _, c := range cases {
		_, err := openStore(context.Background(), c.url, env)
		if err == nil {
			t.Errorf("openStore(%q) succeeded", c.url)
			continue
		}
		msg := err.Error()
		if strings.Contains(msg, secret) {
			t.Errorf("openStore(%q) error leaks the secret: %s", c.url, msg)
		}
		if !strings.Contains(msg, c.wantInErr) {
			t.Errorf("openStore(%q) = %q, want it to mention %q", c.url, msg, c.wantInErr)
		}
		if !strings.Contains(msg, redactURL(c.url)) {
			t.Errorf("openStore(%q) = %q, want it to name the URL", c.url, msg)
		}
	}
}

func TestOpenStoreCredentials(t *testing.T) {
	const secret = "AnotherSecret-123456"
	// Missing credentials are reported by name.
	_, err := openStore(context.Background(), "s3+http://127.0.0.1:9/bucket", envOf(nil))
	if err == nil || !strings.Contains(err.Error(), EnvAccessKey) || !strings.Contains(err.Error(), EnvSecretKey) {
		t.Fatalf("missing credentials: %v", err)
	}
	// An unreachable server: retryable, names the URL, never the secret.
	t.Setenv(EnvAccessKey, "AKID")
	t.Setenv(EnvSecretKey, secret)
	_, err = OpenStore(context.Background(), "s3+http://127.0.0.1:1/bucket")
	if err == nil || strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), "s3+http://127.0.0.1:1/bucket") {
		t.Fatalf("unreachable server: %v", err)
	}
	if !IsRetryable(err) {
		t.Fatalf("connection refused is not retryable: %v", err)
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"s3://user:pw@host:9/b":  "s3://REDACTED@host:9/b",
		"s3://host:9/b@x":        "s3://host:9/b@x",
		"s3://a@b@host/bucket":   "s3://REDACTED@host/bucket",
		"file:///data/x":         "file:///data/x",
		"no scheme user:pw@host": "no scheme user:pw@host",
	} {
		if got := redactURL(in); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", in, got, want)
		}
	}
	err := redactError(errorString("signature for s3cr3t failed"), "s3cr3t")
	if strings.Contains(err.Error(), "s3cr3t") {
		t.Fatalf("redactError kept the secret: %v", err)
	}
}

type errorString string

func (e errorString) Error() string { return string(e) }

// envOf turns KEY=VALUE pairs into a getenv function.
func envOf(kv []string) func(string) string {
	m := map[string]string{}
	for _, e := range kv {
		k, v, _ := strings.Cut(e, "=")
		m[k] = v
	}
	return func(k string) string { return m[k] }
}
