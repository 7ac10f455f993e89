//go:build linux

package nettest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// helperEnv, when set, makes the test binary act as a helper process
// (see helperMain) instead of running tests; the tests re-exec themselves
// inside hosts this way.
const helperEnv = "TILEFARM_NETTEST_HELPER"

const port = 7000

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		helperMain(mode, os.Getenv("TILEFARM_NETTEST_ADDR"))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestNet(t *testing.T) {
	var made []string // namespaces the Net made
	var tmp string    // tmpfs mount point
	t.Run("partitions", func(t *testing.T) {
		n := New(t)
		a, b, c := n.Host("a"), n.Host("b"), n.Host("c")
		made = []string{n.sw, a.NS, b.NS, c.NS}
		tmp = Tmpfs(t, "1m") // before starting a's processes, so they see it

		srv := start(t, b, "server", b.HostPort(port))
		srv.expect("ready")
		ca, cc := start(t, a, "client", ""), start(t, c, "client", "")
		dialB := "dial " + b.HostPort(port)

		ca.want("dial "+b.HostPort(port+1), "refused") // a closed port is refused...
		ca.want(dialB, "ok")
		ca.want("echo hi", "ok")

		n.Cut(a, b)
		n.Cut(a, b)                   // idempotent
		ca.want("echo hi", "timeout") // the established flow stops
		ca.want(dialB, "timeout")     // ...a cut link hangs
		cc.want(dialB, "ok")
		cc.want("echo hi", "ok")

		n.Heal(a, b)
		n.Heal(a, b) // idempotent
		ca.want(dialB, "ok")
		ca.want("echo hi", "ok")

		udpB := "udp " + b.HostPort(port)
		n.CutOneWay(a, b)
		ca.want(dialB, "timeout")
		ca.want(udpB+" one", "timeout") // never reaches b
		n.Heal(a, b)
		n.CutOneWay(b, a)
		ca.want(udpB+" two", "timeout") // reaches b, the reply does not
		srv.expect("udp two")           // (and "udp one" never arrived)
		n.Heal(a, b)
		ca.want(udpB+" three", "ok")
		srv.expect("udp three")

		n.Isolate(b)
		ca.want(dialB, "timeout")
		cc.want(dialB, "timeout")
		n.Rejoin(b)
		ca.want(dialB, "ok")
		cc.want(dialB, "ok")

		ca.want("fill "+tmp, "enospc")

		// The test process itself dials from inside a host: as a, it reaches b while the link
		// is up and hangs once it is cut; its own thread is back home after.
		dial := func() error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			c, err := a.DialContext(ctx, "tcp", b.HostPort(port))
			if err == nil {
				err = roundTrip(c, "from the test")
				c.Close()
			}
			return err
		}
		if err := dial(); err != nil {
			t.Fatalf("dialing b from inside a: %v", err)
		}
		n.Cut(a, b)
		var netErr net.Error
		if err := dial(); !errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &netErr) && netErr.Timeout()) {
			t.Fatalf("dialing b from inside a across a cut link = %v, want a timeout", err)
		}
		n.Heal(a, b)
		home, err := os.Readlink("/proc/self/ns/net")
		if err != nil {
			t.Fatal(err)
		}
		tasks, _ := filepath.Glob("/proc/self/task/*/ns/net")
		for _, task := range tasks {
			if ns, err := os.Readlink(task); err == nil && ns != home {
				t.Fatalf("thread %s of the test process was left in namespace %s, not %s", task, ns, home)
			}
		}
	})

	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatalf("ip netns list: %v", err)
	}
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) > 0 && slices.Contains(made, f[0]) {
			t.Errorf("namespace %s left after cleanup", f[0])
		}
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if tmp != "" && strings.Contains(string(mounts), " "+tmp+" ") {
		t.Errorf("tmpfs %s still mounted after cleanup", tmp)
	}
}

// proc is a helper process running on a host, driven line by line.
type proc struct {
	t     testing.TB
	name  string
	stdin io.Writer
	lines chan string
}

// start runs the test binary as a helper in the given mode on h; it is
// killed at cleanup.
func start(t testing.TB, h *Host, mode, addr string) *proc {
	t.Helper()
	cmd := h.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, "TILEFARM_NETTEST_ADDR="+addr)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s helper on %s: %v", mode, h.Name, err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	p := &proc{t: t, name: mode + "@" + h.Name, stdin: stdin, lines: make(chan string, 16)}
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			p.lines <- s.Text()
		}
		close(p.lines)
	}()
	return p
}

// expect fails the test unless the helper's next output line is want.
func (p *proc) expect(want string) {
	p.t.Helper()
	select {
	case got, ok := <-p.lines:
		if !ok {
			p.t.Fatalf("%s: exited, want %q", p.name, want)
		}
		if got != want {
			p.t.Fatalf("%s: got %q, want %q", p.name, got, want)
		}
	case <-time.After(5 * time.Second):
		p.t.Fatalf("%s: no output after 5s, want %q", p.name, want)
	}
}

// want sends a command to a client helper and checks its answer.
func (p *proc) want(cmd, want string) {
	p.t.Helper()
	if _, err := fmt.Fprintln(p.stdin, cmd); err != nil {
		p.t.Fatalf("%s: send %q: %v", p.name, cmd, err)
	}
	p.t.Logf("%s: %s", p.name, cmd)
	p.expect(want)
}

// helperMain is the helper process. "server" echoes TCP lines and UDP
// datagrams on addr, reporting each datagram on stdout. "client" reads
// commands from stdin and prints one result word per command.
func helperMain(mode, addr string) {
	switch mode {
	case "server":
		ln, err := net.Listen("tcp", addr)
		check(err)
		pc, err := net.ListenPacket("udp", addr)
		check(err)
		fmt.Println("ready")
		go func() {
			buf := make([]byte, 1500)
			for {
				n, from, err := pc.ReadFrom(buf)
				check(err)
				fmt.Printf("udp %s\n", strings.TrimSpace(string(buf[:n])))
				_, _ = pc.WriteTo(buf[:n], from)
			}
		}()
		for {
			c, err := ln.Accept()
			check(err)
			go func() { _, _ = io.Copy(c, c) }()
		}
	case "client":
		var conn net.Conn
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			f := strings.Fields(in.Text())
			var err error
			switch f[0] {
			case "dial": // dial ADDR: replaces the current connection
				if conn != nil {
					conn.Close()
				}
				conn, err = net.DialTimeout("tcp", f[1], time.Second)
			case "echo": // echo MSG: over the current connection
				err = roundTrip(conn, f[1])
			case "udp": // udp ADDR MSG
				var c net.Conn
				if c, err = net.Dial("udp", f[1]); err == nil {
					err = roundTrip(c, f[2])
					c.Close()
				}
			case "fill": // fill DIR: write into DIR until it fails
				err = fill(f[1])
			}
			fmt.Println(result(err))
		}
	}
}

// roundTrip sends msg on c and waits up to a second for it to come back.
func roundTrip(c net.Conn, msg string) error {
	if c == nil {
		return errors.New("not connected")
	}
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return err
	}
	buf := make([]byte, len(msg)+1)
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != msg+"\n" {
		return fmt.Errorf("got %q back", buf)
	}
	return nil
}

// fill writes 64 KiB blocks into a file in dir until a write fails; it
// gives up after 64 MiB, as a tmpfs that large is not the one expected.
func fill(dir string) error {
	f, err := os.Create(filepath.Join(dir, "fill"))
	if err != nil {
		return err
	}
	defer f.Close()
	block := make([]byte, 64<<10)
	for range 1024 {
		if _, err := f.Write(block); err != nil {
			return err
		}
	}
	return errors.New("64 MiB written without error")
}

// result names an outcome so the test can tell a hang from a refusal.
func result(err error) string {
	var ne net.Error
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.ENOSPC):
		return "enospc"
	}
	return "error: " + strings.ReplaceAll(err.Error(), "\n", " ")
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		os.Exit(2)
	}
}
