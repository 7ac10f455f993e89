package composecheck

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/proctest"
)

// World runs a compose file's stack without Docker, for a test: it gives each container a
// root directory whose mounts are symlinks to one directory per named volume (shared between
// containers, as compose shares them) or to the repository's files; container paths in
// command lines and scripts are rewritten under the root, listen addresses to free loopback
// ports, and service host names to those ports. A world that cannot be laid out, or a
// command line or healthcheck naming a port no service listens on, fails the test.
type World struct {
	t       testing.TB
	root    string // the repository
	dir     string
	file    *File
	volumes map[string]string // volume name -> its directory
	addrs   map[string]string // "service:port" -> loopback host:port
}

// Container is one container of a World: a replica of a service.
type Container struct {
	w       *World
	Name    string            // the service's
	Service *Service          // what the compose file says of it
	Root    string            // its filesystem
	Listens map[string]string // container port -> loopback host:port
	Sources map[string]string // mount target -> the volume directory mounted there
}

// NewWorld lays out an empty world for cf, the compose file of the repository at root, in a
// directory of t's.
func NewWorld(t testing.TB, root string, cf *File) *World {
	return &World{t: t, root: root, dir: t.TempDir(), file: cf, volumes: map[string]string{}, addrs: map[string]string{}}
}

// Container makes replica replica of service: its root and mounts.
func (w *World) Container(service string, replica int) *Container {
	w.t.Helper()
	s := w.file.Services[service]
	c := &Container{w: w, Name: service, Service: s, Root: filepath.Join(w.dir, "containers", fmt.Sprintf("%s-%d", service, replica)),
		Listens: map[string]string{}, Sources: map[string]string{}}
	for _, m := range s.Volumes {
		var src string
		switch {
		case m.Type == "bind":
			src = filepath.Join(w.root, m.Source)
		case m.Source == "":
			src = filepath.Join(c.Root+".anon", m.Target)
		default:
			if w.volumes[m.Source] == "" {
				w.volumes[m.Source] = filepath.Join(w.dir, "volumes", m.Source)
			}
			src = w.volumes[m.Source]
		}
		if m.Type != "bind" {
			if err := os.MkdirAll(src, 0o755); err != nil {
				w.t.Fatal(err)
			}
			c.Sources[m.Target] = src
		}
		link := filepath.Join(c.Root, m.Target)
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			w.t.Fatal(err)
		}
		if err := os.Symlink(src, link); err != nil {
			w.t.Fatal(err)
		}
	}
	if err := os.MkdirAll(c.Root, 0o755); err != nil {
		w.t.Fatal(err)
	}
	return c
}

// Path is where a container path lies on this machine: in the volume directory mounted there
// (a process sees a mount as a directory, not a symlink), else under the root, where a bind
// mount of a file is a symlink next to the container's other files there.
func (c *Container) Path(p string) string {
	if m, ok := MountFor(c.Service, p); ok && c.Sources[m.Target] != "" {
		rel, _ := filepath.Rel(m.Target, p)
		return filepath.Join(c.Sources[m.Target], rel)
	}
	return filepath.Join(c.Root, p)
}

var listenAddr = regexp.MustCompile(`^(0\.0\.0\.0)?:([0-9]+)$`)

// RewriteArgs maps a command line onto this machine.
func (c *Container) RewriteArgs(args []string) []string {
	c.w.t.Helper()
	out := make([]string, len(args))
	for i, a := range args {
		switch {
		case strings.HasPrefix(a, "/"):
			out[i] = c.Path(a)
		case strings.Contains(a, "://"):
			out[i] = c.w.rewriteURLs(c.Name, a)
		case listenAddr.MatchString(a):
			port := listenAddr.FindStringSubmatch(a)[2]
			out[i] = c.Listen(port)
		default:
			out[i] = a
		}
	}
	return out
}

// Listen gives the container port a free loopback port.
func (c *Container) Listen(port string) string {
	c.w.t.Helper()
	addr := freeAddr(c.w.t)
	c.Listens[port] = addr
	if _, ok := c.w.addrs[c.Name+":"+port]; !ok {
		c.w.addrs[c.Name+":"+port] = addr
	}
	return addr
}

func freeAddr(t testing.TB) string {
	t.Helper()
	addr, err := proctest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// rewriteURLs points URLs naming a compose service at that service's loopback port; a URL
// naming a service on a port it does not listen on fails the test.
func (w *World) rewriteURLs(from, list string) string {
	w.t.Helper()
	parts := strings.Split(list, ",")
	for i, p := range parts {
		u, err := url.Parse(p)
		if err != nil || w.file.Services[u.Hostname()] == nil {
			continue
		}
		addr, ok := w.addrs[u.Host]
		if !ok {
			w.t.Fatalf("service %s connects to %s, but %s does not listen on port %s", from, p, u.Hostname(), u.Port())
		}
		u.Host = addr
		parts[i] = u.String()
	}
	return strings.Join(parts, ",")
}

// RewriteScript maps the container paths of a shell script under the root: every mount
// target, where it starts a path.
func (c *Container) RewriteScript(script string) string {
	var targets []string
	for _, m := range c.Service.Volumes {
		targets = append(targets, regexp.QuoteMeta(m.Target))
	}
	sort.Slice(targets, func(i, j int) bool { return len(targets[i]) > len(targets[j]) })
	re := regexp.MustCompile(strings.Join(targets, "|"))
	var b strings.Builder
	last := 0
	for _, loc := range re.FindAllStringIndex(script, -1) {
		before := loc[0] == 0 || strings.ContainsRune(" \t\n\"'=(", rune(script[loc[0]-1]))
		after := loc[1] == len(script) || strings.ContainsRune("/ \t\n\"';)", rune(script[loc[1]]))
		if !before || !after {
			continue
		}
		b.WriteString(script[last:loc[0]])
		b.WriteString(c.Path(script[loc[0]:loc[1]]))
		last = loc[1]
	}
	b.WriteString(script[last:])
	return b.String()
}

var probePort = regexp.MustCompile(`/dev/tcp/127\.0\.0\.1/([0-9]+)|//127\.0\.0\.1:([0-9]+)/`)

// Healthy runs the service's healthcheck against this container's ports.
func (c *Container) Healthy() error {
	c.w.t.Helper()
	test := c.Service.Healthcheck.Test[1:]
	var rewritten []string
	for _, a := range test {
		a = probePort.ReplaceAllStringFunc(a, func(m string) string {
			sub := probePort.FindStringSubmatch(m)
			probed := sub[1] + sub[2]
			addr, ok := c.Listens[probed]
			if !ok {
				c.w.t.Fatalf("service %s: the healthcheck probes port %s, which the service does not listen on (%v)", c.Name, probed, c.Listens)
			}
			if sub[1] != "" {
				return "/dev/tcp/127.0.0.1/" + Port(addr)
			}
			return "//127.0.0.1:" + Port(addr) + "/"
		})
		rewritten = append(rewritten, a)
	}
	if len(rewritten) == 0 {
		c.w.t.Fatalf("service %s: empty healthcheck", c.Name)
	}
	if rewritten[0] == "wget" { // the NATS image's wget; not every machine has one
		u := rewritten[len(rewritten)-1]
		resp, err := http.Get(u)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", u, resp.Status)
		}
		return nil
	}
	out, err := exec.Command(rewritten[0], rewritten[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	return nil
}

// HealthyBefore runs the healthcheck with the ports given loopback addresses nobody listens
// on: before the service starts, it must fail.
func (c *Container) HealthyBefore(ports ...string) error {
	for _, p := range ports {
		c.Listens[p] = freeAddr(c.w.t)
	}
	defer clear(c.Listens)
	return c.Healthy()
}

// WaitHealthy polls the healthcheck until it passes, and fails the test at once if p, the
// service's process, dies first.
func (c *Container) WaitHealthy(p *proctest.Proc) {
	c.w.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		err := c.Healthy()
		if err == nil {
			return
		}
		if p.Exited() {
			c.w.t.Fatalf("service %s exited before it was healthy:\n%s", c.Name, p.Log())
		}
		if time.Now().After(deadline) {
			c.w.t.Fatalf("service %s never became healthy (%v):\n%s", c.Name, err, p.Log())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Port is the port of a host:port address, or addr itself when it has none.
func Port(addr string) string {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return p
}
