package notify

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The signature is the documented one: "sha256=" and the hex HMAC-SHA256 of
// "<timestamp>.<body>" under the secret, as any receiver computes it (the vector is Python's
// hmac module's and openssl's); Verify accepts it within its tolerance and nothing else.
func TestSignatureIsHMACSHA256OfTimestampAndBody(t *testing.T) {
	secret := []byte("it is a secret of sixteen+")
	body := []byte(`{"id":"ev_1","type":"job.completed"}`)
	const ts = "1893456000" // 2030-01-01T00:00:00Z
	const want = "sha256=45514335b56f03b810d48b36ff7ae4997576d911b3780841b0edcd961c9a13c2"
	signedAt := time.Unix(1893456000, 0)
	if got := Timestamp(signedAt); got != ts {
		t.Fatalf("Timestamp = %s, want %s", got, ts)
	}
	if got := Sign(secret, ts, body); got != want {
		t.Fatalf("Sign = %s, want %s", got, want)
	}
	if err := Verify(secret, body, ts, want, signedAt.Add(time.Minute), 0); err != nil {
		t.Fatalf("Verify refuses the body's own signature a minute later: %v", err)
	}
	for name, c := range map[string]struct {
		secret, body  []byte
		ts, signature string
	}{
		"another body":      {secret, []byte(`{"id":"ev_1","type":"job.failed"}`), ts, want},
		"another secret":    {[]byte("it is a secret of sixteen-"), body, ts, want},
		"another timestamp": {secret, body, "1893456001", want},
		"no timestamp":      {secret, body, "", want},
		"no prefix":         {secret, body, ts, strings.TrimPrefix(want, "sha256=")},
		"upper-case hex":    {secret, body, ts, "sha256=" + strings.ToUpper(strings.TrimPrefix(want, "sha256="))},
		"empty signature":   {secret, body, ts, ""},
	} {
		if err := Verify(c.secret, c.body, c.ts, c.signature, signedAt, 0); !errors.Is(err, ErrBadSignature) {
			t.Errorf("%s: Verify = %v, want ErrBadSignature", name, err)
		}
	}
}

// A receiver refuses replays: a delivery signed correctly but with a timestamp further from
// its clock than the tolerance (a recorded delivery sent again an hour later, or one from the
// future) is ErrStaleTimestamp; a body signed without the timestamp, as the signature was
// before timestamps, is ErrBadSignature, whatever timestamp comes with it.
func TestVerifyRefusesReplaysAndSignaturesWithoutTheTimestamp(t *testing.T) {
	secret := []byte("it is a secret of sixteen+")
	body := []byte(`{"id":"ev_2","type":"job.failed"}`)
	signedAt := time.Date(2030, 5, 4, 12, 0, 0, 0, time.UTC)
	ts := Timestamp(signedAt)
	sig := Sign(secret, ts, body)
	for name, c := range map[string]struct {
		now       time.Time
		tolerance time.Duration
	}{
		"replayed an hour later":           {signedAt.Add(time.Hour), 0},
		"replayed past a tolerance of 30s": {signedAt.Add(31 * time.Second), 30 * time.Second},
		"from the future":                  {signedAt.Add(-10 * time.Minute), 0},
	} {
		err := Verify(secret, body, ts, sig, c.now, c.tolerance)
		if !errors.Is(err, ErrStaleTimestamp) || errors.Is(err, ErrBadSignature) {
			t.Errorf("%s: Verify = %v, want ErrStaleTimestamp alone", name, err)
		}
	}
	if err := Verify(secret, body, ts, sig, signedAt.Add(DefaultTolerance), 0); err != nil {
		t.Errorf("at the edge of the tolerance: %v", err)
	}
	mac := hmac.New(sha256.New, secret)
	mac.Write(body)
	bodyOnly := "sha256=" + hex.EncodeToString(mac.Sum(nil))
	if err := Verify(secret, body, ts, bodyOnly, signedAt, 0); !errors.Is(err, ErrBadSignature) {
		t.Errorf("a body signed without the timestamp: Verify = %v, want ErrBadSignature", err)
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
