package notify

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"
)

// What a job's own receivers may reach (docs/operations.md, "Notifications"): a job's submitter
// names them, and the coordinator posts to them from inside the farm's network, so by default
// they may not reach the coordinator's own host (loopback, the unspecified address) or its
// link-local neighbourhood, where cloud metadata services hand out credentials. The farm-wide
// receivers (serve --notify) are the operator's own and may reach anything. The operator
// allows refused ranges anyway with serve --notify-allow (Config.Allow).

// refusedRanges are the ranges a job's receivers may not reach unless allowed, each with what
// it is; the more specific first, so an address is named by the narrowest.
var refusedRanges = []struct {
	prefix netip.Prefix
	what   string
}{
	{netip.MustParsePrefix("169.254.169.254/32"), "cloud metadata"},
	{netip.MustParsePrefix("fd00:ec2::254/128"), "cloud metadata"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("0.0.0.0/32"), "unspecified"},
	{netip.MustParsePrefix("::/128"), "unspecified"},
}

// lookupTimeout bounds resolving a receiver's name at submission: a name that does not
// resolve in time is checked at each dial instead.
const lookupTimeout = 2 * time.Second

// RefusedError is an address a job's receiver may not reach: in Range, a refused range that
// no allowed one covers. Host is the name that resolved to it, if a name did.
type RefusedError struct {
	Host  string
	Addr  netip.Addr
	Range netip.Prefix
	What  string // loopback, link-local, cloud metadata, unspecified
}

func (e *RefusedError) Error() string {
	s := fmt.Sprintf("%s is in %s (%s), which a job's receivers may not reach; serve --notify-allow %s allows it", e.Addr, e.Range, e.What, e.Range)
	if e.Host != "" {
		s = e.Host + " resolves to " + s
	}
	return s
}

// ParseAllow parses serve --notify-allow: CIDRs, or single addresses, each allowed to a job's
// receivers though refused by default.
func ParseAllow(specs []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, spec := range specs {
		spec = strings.TrimSpace(spec)
		if spec == "" {
			continue
		}
		if p, err := netip.ParsePrefix(spec); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(spec)
		if err != nil || a.Zone() != "" {
			return nil, fmt.Errorf("%q is not a CIDR (like 127.0.0.0/8) or an IP address", spec)
		}
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// CheckAddr returns a *RefusedError when a job's receiver may not reach ip: it is in a refused
// range and in no allowed one. An IPv4 address in IPv6 form is checked as IPv4, and a zone is
// not part of the address.
func CheckAddr(ip netip.Addr, allow []netip.Prefix) error {
	ip = ip.Unmap().WithZone("")
	for _, p := range allow {
		if p.Contains(ip) {
			return nil
		}
	}
	for _, r := range refusedRanges {
		if r.prefix.Contains(ip) {
			return &RefusedError{Addr: ip, Range: r.prefix, What: r.what}
		}
	}
	return nil
}

// CheckReach checks at submission that a job's receiver raw (a CheckURL) may be reached: its
// host, a literal address or every address its name resolves to now, passes CheckAddr. A name
// that does not resolve (yet, or in lookupTimeout) passes: the dial checks every address
// actually connected to (receiverClient), so a name that resolves elsewhere later, a DNS
// rebinding, is refused there. Its error names the URL redacted.
func CheckReach(ctx context.Context, raw string, allow []netip.Prefix) error {
	u, err := url.Parse(raw)
	if err != nil {
		return errors.New("notification URL is not a URL")
	}
	host := u.Hostname()
	var addrs []netip.Addr
	name := ""
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
		defer cancel()
		if addrs, err = net.DefaultResolver.LookupNetIP(ctx, "ip", host); err != nil {
			return nil
		}
		name = host
	}
	for _, a := range addrs {
		if err := CheckAddr(a, allow); err != nil {
			var re *RefusedError
			if errors.As(err, &re) {
				re.Host = name
			}
			return fmt.Errorf("notification URL %s: %w", Redact(raw), err)
		}
	}
	return nil
}

// receiverClient is the HTTP client of webhook deliveries. Redirects are not followed. With
// restrict (a job's own receivers) every address it connects to passes CheckAddr, checked in
// the dialer's ControlContext on the address dialled, after resolution, so no name can
// resolve its way past the check; a refused one fails the attempt with a *RefusedError. A
// proxy of proxy (HTTP_PROXY, HTTPS_PROXY) is the operator's and is dialled unchecked: through
// it, the receiver's address is checked at submission only.
func receiverClient(restrict bool, allow []netip.Prefix, proxy func(*http.Request) (*url.URL, error)) *http.Client {
	plain := &net.Dialer{}
	t := &http.Transport{Proxy: proxy, DialContext: plain.DialContext, ForceAttemptHTTP2: true,
		MaxIdleConnsPerHost: laneInFlight, IdleConnTimeout: time.Minute}
	if restrict {
		guarded := &net.Dialer{ControlContext: func(_ context.Context, _, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("connecting to %s: not an address that can be checked: %w", address, err)
			}
			return CheckAddr(ap.Addr(), allow)
		}}
		var proxies sync.Map // canonical host:port of every proxy used
		t.Proxy = func(req *http.Request) (*url.URL, error) {
			u, err := proxy(req)
			if u != nil {
				proxies.Store(proxyAddr(u), true)
			}
			return u, err
		}
		t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if _, ok := proxies.Load(strings.ToLower(addr)); ok {
				return plain.DialContext(ctx, network, addr)
			}
			return guarded.DialContext(ctx, network, addr)
		}
	}
	return &http.Client{
		Transport: t,
		// A redirect is an answer that is not 2xx: following one would post the event
		// (and its signature) somewhere the operator did not name.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// proxyAddr is the host:port the transport dials for proxy u, lower-cased.
func proxyAddr(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443", "socks5": "1080", "socks5h": "1080"}[u.Scheme]
	}
	return strings.ToLower(net.JoinHostPort(u.Hostname(), port))
}
