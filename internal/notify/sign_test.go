package notify

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The signature is the documented one: "sha256=" and the hex HMAC-SHA256 of the body under the
// secret, as any receiver computes it (the vector is Python's hmac module's); Verify accepts it
// and nothing else.
func TestSignatureIsHMACSHA256OfTheBody(t *testing.T) {
	secret := []byte("it is a secret of sixteen+")
	body := []byte(`{"id":"ev_1","type":"job.completed"}`)
	const want = "sha256=0cf7d1d3c85c2f06aa84dd157a270bdd6349315ffd499d4be879b814eadb6787"
	if got := Sign(secret, body); got != want {
		t.Fatalf("Sign = %s, want %s", got, want)
	}
	if !Verify(secret, body, want) {
		t.Fatal("Verify refuses the body's own signature")
	}
	for name, c := range map[string]struct {
		secret, body []byte
		header       string
	}{
		"another body":    {secret, []byte(`{"id":"ev_1","type":"job.failed"}`), want},
		"another secret":  {[]byte("it is a secret of sixteen-"), body, want},
		"no prefix":       {secret, body, strings.TrimPrefix(want, "sha256=")},
		"upper-case hex":  {secret, body, "sha256=" + strings.ToUpper(strings.TrimPrefix(want, "sha256="))},
		"empty signature": {secret, body, ""},
	} {
		if Verify(c.secret, c.body, c.header) {
			t.Errorf("%s: Verify accepted it", name)
		}
	}
}

// A failed delivery waits about 1 s, doubling to at most 5 min, each delay somewhere in the
// upper half of its step (equal jitter): never less than half, never more than the step.
func TestRetryDelayDoublesWithJitterUpToItsCap(t *testing.T) {
	n := &Notifier{base: retryBase}
	for attempt := 1; attempt <= 12; attempt++ {
		step := min(retryBase<<(attempt-1), retryMax)
		for _, j := range []float64{0, 0.5, 0.999999} {
			n.jitter = func() float64 { return j }
			d := n.retryDelay(attempt)
			if d < step/2 || d > step {
				t.Fatalf("attempt %d, jitter %v: delay %v, want within [%v, %v]", attempt, j, d, step/2, step)
			}
		}
		n.jitter = func() float64 { return 0 }
		lo := n.retryDelay(attempt)
		n.jitter = func() float64 { return 0.999999 }
		if hi := n.retryDelay(attempt); hi-lo < step/2-time.Millisecond {
			t.Fatalf("attempt %d: jitter spreads delays over %v, want about %v", attempt, hi-lo, step/2)
		}
	}
	n.jitter = func() float64 { return 0.999999 }
	if d := n.retryDelay(40); d > retryMax {
		t.Fatalf("attempt 40 waits %v, more than the cap %v", d, retryMax)
	}
}

// A receiver's URL must be http or https with a host; what the farm shows of one (logs,
// errors, status) never holds its user information or query, where credentials live.
func TestURLsAreCheckedAndRedacted(t *testing.T) {
	for _, ok := range []string{"http://127.0.0.1:9000/hook", "https://hooks.example.com/services/T0/B0", "https://u:p@example.com/x?token=1"} {
		if err := CheckURL(ok); err != nil {
			t.Errorf("CheckURL(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "ftp://example.com/x", "example.com/hook", "https:///nohost", "mailto:ops@example.com", "http://[::1", "https://example.com/" + strings.Repeat("a", 3000)} {
		if err := CheckURL(bad); err == nil {
			t.Errorf("CheckURL(%q) accepted it", bad)
		}
	}
	if err := CheckURLs(make([]string, MaxURLs+1)); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Errorf("%d URLs: %v", MaxURLs+1, err)
	}
	err := CheckURL("ftp://alice:hunter2@example.com/x?key=topsecret")
	if err == nil || strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "topsecret") {
		t.Errorf("error of a URL with credentials: %v", err)
	}
	for in, want := range map[string]string{
		"https://alice:hunter2@example.com/hook?key=topsecret#frag": "https://REDACTED@example.com/hook?REDACTED",
		"http://127.0.0.1:9000/hook":                                "http://127.0.0.1:9000/hook",
		"https://example.com/hook?":                                 "https://example.com/hook?",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}

// The secret comes from the file when one is named, else from the environment; white space
// around it is not part of it, and a short one is refused rather than used.
func TestSecretFromFileOrEnvironment(t *testing.T) {
	t.Setenv(EnvSecret, "  from the environment, long enough \n")
	s, err := Secret("")
	if err != nil || string(s) != "from the environment, long enough" {
		t.Fatalf("Secret from the environment = %q, %v", s, err)
	}
	file := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(file, []byte("from the file, long enough too\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if s, err = Secret(file); err != nil || string(s) != "from the file, long enough too" {
		t.Fatalf("Secret from a file = %q, %v", s, err)
	}
	if err := os.WriteFile(file, []byte("short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err = Secret(file); err == nil || strings.Contains(err.Error(), "short\n") {
		t.Fatalf("a short secret: %v", err)
	}
	if _, err = Secret(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("a missing secret file was accepted")
	}
	t.Setenv(EnvSecret, "")
	if s, err = Secret(""); err != nil || s != nil {
		t.Fatalf("no secret anywhere = %q, %v; want none", s, err)
	}
}
