//go:build linux

// Package nettest runs each process of a test as its own "host" in its own
// Linux network namespace, all joined by one bridge, so that tests can cut
// and heal links between hosts for real (nftables drop rules) and observe
// how the farm behaves under network partitions.
//
// Everything lives in namespaces the test creates: the bridge sits in a
// dedicated "switch" namespace, and nothing is added to the root
// namespace's links, routes or firewall. The package needs root and the
// ip (iproute2) and nft (nftables) tools.
package nettest

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fixHint tells whoever sees a failing New how to make it work.
const fixHint = "needs root and nft (apt-get install nftables)"

// nftTable is the ruleset every host starts with: a set of peer addresses
// whose packets the input chain drops. Cutting or healing a link only adds
// or removes set elements, which keeps both idempotent. Packets are dropped
// at the receiver only: a drop in the sender's output hook would make its
// send calls fail with EPERM, which a real broken link never does. There
// is deliberately no "ct state established accept" rule: a cut must stop
// flows that are already open, not only new ones.
const nftTable = `table inet tilefarm {
	set drop_in { type ipv4_addr; }
	chain input { type filter hook input priority 0; policy accept; ip saddr @drop_in drop; }
}
`

var validName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,32}$`)

// Net is a set of hosts on one switch. Its methods fail the test on error,
// so call them from the test's goroutine.
type Net struct {
	t      testing.TB
	id     string // random suffix shared by all the Net's namespace names
	sw     string // netns holding the bridge "br0"
	subnet string // "10.x.y." prefix of every host address
	hosts  []*Host
	nss    []string // namespaces made so far, removed at cleanup
}

// Host is one network namespace attached to the Net's switch. Processes
// started with Command run "on" the host and reach the other hosts at
// their Addr.
type Host struct {
	Name string // name given to Net.Host
	Addr string // IPv4 address, without prefix length
	NS   string // netns name, as used by "ip netns exec"
	net  *Net
}

// New creates an empty Net (a switch namespace with a bridge) so that a
// test can add hosts to it. It fails the test, never skips it, when the
// machine cannot run it, because a skipped partition test silently tests
// nothing. Everything New and its hosts create is removed at cleanup, also
// when the test failed.
func New(t testing.TB) *Net {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("nettest: not running as root: %s", fixHint)
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("nettest: %v: %s", err, fixHint)
		}
	}
	n := &Net{
		t:      t,
		id:     fmt.Sprintf("%06x", rand.IntN(1<<24)),
		subnet: fmt.Sprintf("10.%d.%d.", 1+rand.IntN(254), rand.IntN(256)),
	}
	t.Cleanup(n.cleanup)
	n.sw = "tf" + n.id + "-switch"
	n.addNS(n.sw)
	n.ip("-n", n.sw, "link", "add", "br0", "type", "bridge")
	n.ip("-n", n.sw, "link", "set", "br0", "up")
	return n
}

// Host adds a host called name to the Net: a new namespace with lo up and
// an interface eth0 plugged into the switch, addressed 10.x.y.i/24 where
// 10.x.y is random per Net (so parallel tests never clash) and i counts
// hosts from 1. There is no default route: hosts only talk to each other.
func (n *Net) Host(name string) *Host {
	n.t.Helper()
	if !validName.MatchString(name) {
		n.t.Fatalf("nettest: invalid host name %q (want %s)", name, validName)
	}
	for _, h := range n.hosts {
		if h.Name == name {
			n.t.Fatalf("nettest: duplicate host name %q", name)
		}
	}
	i := len(n.hosts) + 1
	if i > 253 {
		n.t.Fatalf("nettest: too many hosts (max 253)")
	}
	h := &Host{Name: name, Addr: fmt.Sprintf("%s%d", n.subnet, i), NS: "tf" + n.id + "-" + name, net: n}
	n.addNS(h.NS)
	port := fmt.Sprintf("v%d", i) // switch-side veth; names are per namespace
	n.ip("-n", n.sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", h.NS)
	n.ip("-n", n.sw, "link", "set", port, "master", "br0", "up")
	n.ip("-n", h.NS, "addr", "add", h.Addr+"/24", "dev", "eth0")
	n.ip("-n", h.NS, "link", "set", "eth0", "up")
	n.ip("-n", h.NS, "link", "set", "lo", "up")
	n.nft(h, nftTable)
	n.waitUp(h)
	n.hosts = append(n.hosts, h)
	return h
}

// Command returns a command that runs name inside the host's network
// namespace (via "ip netns exec"), so the process sees only the host's
// network. Callers may set Env, Dir, Stdout etc. before starting it. The
// process gets a private copy of the mount table when it starts: create
// Tmpfs mounts before starting processes that should see them.
func (h *Host) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", h.NS, name}, args...)...)
}

// HostPort returns "addr:port", the address other hosts dial to reach a
// server listening on port on h.
func (h *Host) HostPort(port int) string {
	return fmt.Sprintf("%s:%d", h.Addr, port)
}

// Cut drops every packet between a and b, both ways, including packets of
// connections already open. Packets are dropped, not rejected, so
// connections hang rather than fail fast, as on a real broken link.
// Cutting a cut link does nothing.
func (n *Net) Cut(a, b *Host) {
	n.t.Helper()
	n.CutOneWay(a, b)
	n.CutOneWay(b, a)
}

// CutOneWay drops packets sent from `from` to `to` only (on arrival at
// to); packets from `to` to `from` still pass. Note that TCP
// connections need both ways, so they hang in either direction; this
// mostly matters for UDP and for asymmetric-failure tests.
func (n *Net) CutOneWay(from, to *Host) {
	n.t.Helper()
	n.nft(to, fmt.Sprintf("add element inet tilefarm drop_in { %s }\n", from.Addr))
}

// Heal removes every cut between a and b, in both directions. Healing a
// link that is not cut does nothing.
func (n *Net) Heal(a, b *Host) {
	n.t.Helper()
	for _, p := range [][2]*Host{{a, b}, {b, a}} {
		// Adding before deleting, in one nft transaction, makes the delete
		// succeed whether or not the element was there.
		n.nft(p[1], fmt.Sprintf("add element inet tilefarm drop_in { %[1]s }\n"+
			"delete element inet tilefarm drop_in { %[1]s }\n", p[0].Addr))
	}
}

// Isolate cuts h from every other host of the Net (hosts added later are
// not cut), as when a machine loses its network.
func (n *Net) Isolate(h *Host) {
	n.t.Helper()
	for _, o := range n.hosts {
		if o != h {
			n.Cut(h, o)
		}
	}
}

// Rejoin heals every link between h and the other hosts, undoing Isolate
// and any other cut involving h.
func (n *Net) Rejoin(h *Host) {
	n.t.Helper()
	for _, o := range n.hosts {
		if o != h {
			n.Heal(h, o)
		}
	}
}

// Tmpfs mounts a tmpfs of the given size (as for mount -o size=, e.g.
// "8m") on a new temporary directory and returns the directory, so that a
// test can fill a process's disk and watch it cope with ENOSPC. It is
// unmounted at cleanup. Create it before starting processes on a host that
// use it: they only see mounts that exist when they start. It needs root.
func Tmpfs(t testing.TB, size string) string {
	t.Helper()
	dir := t.TempDir() // its removal is registered first, so runs after the unmount
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("nettest: mount tmpfs on %s: %v: %s (%s)", dir, err, out, fixHint)
	}
	t.Cleanup(func() {
		if err := exec.Command("umount", dir).Run(); err != nil {
			// Busy (a process still uses it): detach it lazily instead.
			if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
				t.Errorf("nettest: umount %s: %v: %s", dir, err, out)
			}
		}
	})
	return dir
}

// addNS creates a named network namespace and records it for cleanup.
func (n *Net) addNS(name string) {
	n.t.Helper()
	n.ip("netns", "add", name)
	n.nss = append(n.nss, name)
}

// cleanup deletes every namespace the Net made, killing processes left in
// them first, because a leftover process would keep its namespace alive.
func (n *Net) cleanup() {
	for _, ns := range slices.Backward(n.nss) {
		out, _ := exec.Command("ip", "netns", "pids", ns).Output()
		if pids := strings.Fields(string(out)); len(pids) > 0 {
			n.t.Logf("nettest: killing processes left in %s: %v", ns, pids)
			for _, p := range pids {
				if pid, err := strconv.Atoi(p); err == nil {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			n.t.Errorf("nettest: delete netns %s: %v: %s", ns, err, out)
		}
	}
}

// waitUp waits until h's link to the switch carries traffic, so that the
// first packets a test sends are not lost to a link coming up.
func (n *Net) waitUp(h *Host) {
	n.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		out, err := exec.Command("ip", "-n", h.NS, "-o", "link", "show", "eth0").Output()
		if err == nil && strings.Contains(string(out), "state UP") {
			return
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("nettest: eth0 of host %s not up after 5s: %s", h.Name, out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ip runs the ip tool and fails the test on error.
func (n *Net) ip(args ...string) {
	n.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		n.t.Fatalf("nettest: ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// nft runs an nft script inside h's namespace, atomically, and fails the
// test on error.
func (n *Net) nft(h *Host, script string) {
	n.t.Helper()
	cmd := exec.Command("ip", "netns", "exec", h.NS, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		n.t.Fatalf("nettest: nft in %s: %v: %s\nscript:\n%s", h.NS, err, out, script)
	}
}
