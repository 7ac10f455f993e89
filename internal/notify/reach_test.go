package notify

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tilefarm/tilefarm/internal/metrics"
)

// A job's receivers may not reach loopback, link-local (the cloud metadata addresses named as
// such) or the unspecified address, in IPv4 or IPv6 (an IPv4 address in IPv6 form too), unless
// a range of --notify-allow covers the address; anything else, private ranges included, they
// may. --notify-allow takes CIDRs and single addresses and nothing else.
func TestJobReceiversMayNotReachLoopbackLinkLocalOrMetadata(t *testing.T) {
	for addr, want := range map[string]string{
		"127.0.0.1":        "127.0.0.0/8 (loopback)",
		"127.8.9.10":       "127.0.0.0/8 (loopback)",
		"::1":              "::1/128 (loopback)",
		"::ffff:127.0.0.1": "127.0.0.0/8 (loopback)",
		"169.254.169.254":  "169.254.169.254/32 (cloud metadata)",
		"fd00:ec2::254":    "fd00:ec2::254/128 (cloud metadata)",
		"169.254.1.2":      "169.254.0.0/16 (link-local)",
		"fe80::1%eth0":     "fe80::/10 (link-local)",
		"0.0.0.0":          "0.0.0.0/32 (unspecified)",
		"::":               "::/128 (unspecified)",
		"10.1.2.3":         "",
		"192.168.1.1":      "",
		"192.0.2.10":       "",
		"2001:db8::1":      "",
		"fd00::1":          "",
	} {
		err := CheckAddr(netip.MustParseAddr(addr), nil)
		var re *RefusedError
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: %v, want it reachable", addr, err)
		case want != "" && (!errors.As(err, &re) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "--notify-allow")):
			t.Errorf("%s: %v, want it refused as in %s, naming --notify-allow", addr, err, want)
		}
	}
	allow, err := ParseAllow([]string{"127.0.0.0/8", " ::1 ", "169.254.0.0/16", ""})
	if err != nil || len(allow) != 3 || allow[1] != netip.MustParsePrefix("::1/128") {
		t.Fatalf("ParseAllow = %v, %v", allow, err)
	}
	for _, addr := range []string{"127.0.0.1", "::ffff:127.0.0.2", "::1", "169.254.169.254"} {
		if err := CheckAddr(netip.MustParseAddr(addr), allow); err != nil {
			t.Errorf("%s with %v allowed: %v", addr, allow, err)
		}
	}
	if err := CheckAddr(netip.MustParseAddr("0.0.0.0"), allow); err == nil {
		t.Error("0.0.0.0 reachable though no allowed range covers it")
	}
	if p, err := ParseAllow([]string{"127.0.0.9/8"}); err != nil || p[0] != netip.MustParsePrefix("127.0.0.0/8") {
		t.Errorf("ParseAllow of an unmasked CIDR = %v, %v", p, err)
	}
	for _, bad := range []string{"localhost", "127.0.0.0/33", "fe80::1%eth0", "10.0.0.0/8x"} {
		if _, err := ParseAllow([]string{bad}); err == nil {
			t.Errorf("ParseAllow(%q) accepted it", bad)
		}
	}
}

// At submission a receiver is checked by its host: a literal address, or every address its
// name resolves to ("localhost", from /etc/hosts), and the error names the URL without its
// credentials and says what the name resolved to; a name that does not resolve is left to the
// dial's check.
func TestCheckReachResolvesTheReceiversHost(t *testing.T) {
	ctx := context.Background()
	err := CheckReach(ctx, "http://ops:hunter2@localhost:8080/hook?token=topsecret", nil)
	if err == nil || !strings.Contains(err.Error(), "localhost resolves to") || !strings.Contains(err.Error(), "(loopback)") ||
		!strings.Contains(err.Error(), "REDACTED@localhost:8080") || strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "topsecret") {
		t.Errorf("a receiver on localhost: %v", err)
	}
	if err := CheckReach(ctx, "http://[fd00:ec2::254]/latest", nil); err == nil || !strings.Contains(err.Error(), "cloud metadata") {
		t.Errorf("the IPv6 metadata address: %v", err)
	}
	for _, ok := range []string{"http://192.0.2.10/hook", "https://receiver.invalid/hook"} {
		if err := CheckReach(ctx, ok, nil); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	if err := CheckReach(ctx, "http://localhost:8080/hook", loopback); err != nil {
		t.Errorf("localhost with 127.0.0.0/8 allowed: %v", err)
	}
}

// At delivery a job's receiver is checked on the address actually dialled: one named
// "localhost" (accepted at submission or not, a name can resolve anywhere by the time of the
// dial) is never posted to; its delivery is dropped at once as given up with a log line
// saying why, and the NATS subject and a farm-wide receiver on loopback, the operator's own,
// are delivered to. With --notify-allow covering loopback the same receiver gets the event.
// A job naming a farm-wide receiver gets it as the farm's.
func TestNotifierRefusesAJobReceiverAtTheDial(t *testing.T) {
	e := newEnv(t)
	job, farm := newReceiver(t, 0), newReceiver(t, 0)
	byName := strings.Replace(job.URL, "127.0.0.1", "localhost", 1)
	e.record([]string{byName, farm.URL}, events("ev_refused")...)
	_, stop := e.run(Config{URLs: []string{farm.URL}, Secret: testSecret}, time.Hour)
	waitFor(t, 10*time.Second, "the notification settled", func() bool { return len(e.pending()) == 0 })
	stop()
	if attempts, _, _ := job.state(); attempts != 0 {
		t.Fatalf("the refused receiver got %d requests", attempts)
	}
	if attempts, got, bad := farm.state(); attempts != 1 || len(got) != 1 || len(bad) > 0 {
		t.Fatalf("the farm-wide receiver: %d attempts, accepted %v, wrong %v", attempts, got, bad)
	}
	if len(e.published()) != 1 {
		t.Fatal("the event was not published on NATS")
	}
	gaveUp, ok := testutil.ToFloat64(e.m.NotificationDeliveries.WithLabelValues(metrics.DeliveryGaveUp)), testutil.ToFloat64(e.m.NotificationDeliveries.WithLabelValues(metrics.DeliveryOK))
	failed := testutil.ToFloat64(e.m.NotificationDeliveries.WithLabelValues(metrics.DeliveryFailed))
	if gaveUp != 1 || ok != 2 || failed != 0 {
		t.Fatalf("deliveries: %v gave up, %v ok, %v failed; want the refused one given up at once", gaveUp, ok, failed)
	}
	if logs := e.logs.String(); !strings.Contains(logs, "receiver's address is refused") || !strings.Contains(logs, "--notify-allow 127.0.0.0/8") {
		t.Fatalf("no log line saying the receiver is refused and how to allow it:\n%s", logs)
	}

	e.record([]string{byName}, events("ev_allowed")...)
	_, stop = e.run(Config{Secret: testSecret, Allow: loopback}, time.Hour)
	defer stop()
	waitFor(t, 10*time.Second, "the allowed receiver's delivery", func() bool { return len(e.pending()) == 0 })
	if attempts, got, _ := job.state(); attempts != 1 || len(got) != 1 || got[0].ID != "ev_allowed" {
		t.Fatalf("the receiver allowed by --notify-allow: %d attempts, accepted %v", attempts, got)
	}
}

// Through a proxy the coordinator dials the proxy, the operator's own, which no job's
// receiver policy refuses even on loopback: the event reaches it, for the receiver it names.
func TestNotifierReachesAJobReceiverThroughAProxy(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	var proxied []string
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		if Verify(testSecret, body, r.Header.Get(TimestampHeader), r.Header.Get(SignatureHeader), time.Now(), 0) == nil {
			proxied = append(proxied, r.URL.String())
		}
	}))
	t.Cleanup(proxy.Close)
	proxyURL, _ := url.Parse(proxy.URL)
	e.record([]string{"http://receiver.invalid/hook"}, events("ev_proxied")...)
	_, stop := e.run(Config{Secret: testSecret}, time.Hour, func(n *Notifier) {
		n.jobs = receiverClient(true, nil, http.ProxyURL(proxyURL))
	})
	defer stop()
	waitFor(t, 10*time.Second, "the notification delivered through the proxy", func() bool { return len(e.pending()) == 0 })
	mu.Lock()
	defer mu.Unlock()
	if len(proxied) != 1 || proxied[0] != "http://receiver.invalid/hook" {
		t.Fatalf("the proxy forwarded %q", proxied)
	}
}
