//go:build linux

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/png"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/client"
	"github.com/tilefarm/tilefarm/internal/farmtest"
	"github.com/tilefarm/tilefarm/internal/proctest"
)

// bins are the binaries built once for all tests.
var bins farmtest.Binaries

func TestMain(m *testing.M) {
	// The tests read the processes' logs as key=value lines; TestJSONLogsByDefault checks the
	// JSON a process writes without this.
	os.Setenv("TILEFARM_LOG_FORMAT", "text")
	dir, err := os.MkdirTemp("", "tilefarm-e2e-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Under TILEFARM_E2E_RACE the binaries fail (exit 66) on a data race, and killAtEnd fails
	// the test whose process reported one.
	if bins, err = farmtest.Build(dir, farmtest.BuildOptions{Race: os.Getenv("TILEFARM_E2E_RACE") != ""}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func example(name string) string {
	p, _ := filepath.Abs(filepath.Join("../../examples", name, "scene.json"))
	return p
}

// small settings keep farm tests fast; tiles 32 px give several tiles per frame.
var small = []string{"--width", "96", "--height", "54", "--spp", "8", "--tile", "32"}

// result of a finished command.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// run runs a binary to completion.
func run(t *testing.T, name string, args ...string) result {
	t.Helper()
	return runEnv(t, nil, name, args...)
}

// runEnv runs a binary to completion with extra environment variables.
func runEnv(t *testing.T, env []string, name string, args ...string) result {
	t.Helper()
	return runOn(t, nil, env, name, args...)
}

// runOn is runEnv on host (nil: this machine), killed after three minutes.
func runOn(t *testing.T, host farmtest.Host, env []string, name string, args ...string) result {
	t.Helper()
	cmd := exec.Command(bins.Path(name), args...)
	if host != nil {
		cmd = host.Command(bins.Path(name), args...)
	}
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatalf("running %s %v: %v", name, args, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(3 * time.Minute):
		_ = cmd.Process.Kill()
		err = <-done
	}
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running %s %v: %v", name, args, err)
	}
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

func start(t *testing.T, name string, args ...string) *proctest.Proc {
	t.Helper()
	return startEnv(t, nil, name, args...)
}

// startEnv starts a long-running binary (serve, tileworker) with extra environment variables
// for the rest of the test, its output in a log file of the test's.
func startEnv(t *testing.T, env []string, name string, args ...string) *proctest.Proc {
	t.Helper()
	return startBinary(t, name, bins.Path(name), env, args...)
}

// startBinary starts the program bin under name (a server the test command provides, say) for
// the rest of the test, as startEnv starts the farm's own.
func startBinary(t *testing.T, name, bin string, env []string, args ...string) *proctest.Proc {
	t.Helper()
	p, err := proctest.Start(name, bin, filepath.Join(t.TempDir(), name+".log"), env, args...)
	if err != nil {
		t.Fatal(err)
	}
	killAtEnd(t, p, fmt.Sprintf("%s %v", name, args))
	return p
}

// killAtEnd kills p when the test ends, fails the test if p reported a data race (the binaries
// are built with -race under TILEFARM_E2E_RACE), and shows p's log under label if the test
// failed, so a failure can be read without the log files a finished test deletes.
func killAtEnd(t *testing.T, p *proctest.Proc, label string) {
	t.Cleanup(func() {
		p.Kill()
		if farmtest.DataRace(p) {
			t.Errorf("%s reported a data race", p.Name)
		}
		if t.Failed() {
			t.Logf("---- log of %s ----\n%s", label, p.Log())
		}
	})
}

func freePort(t *testing.T) string {
	t.Helper()
	addr, err := proctest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// farmProc is a farm of a test (farmtest.Farm) on a coordinator serve: each of its processes
// is killed, checked for a data race and its log shown on failure when the test ends
// (killAtEnd).
type farmProc struct {
	t *testing.T
	*farmtest.Farm
	// client is the host the test's commands run on when the farm's hosts are network
	// namespaces (nettest); nil is this machine.
	client farmtest.Host
}

// newFarm is a farm, not yet started, with its coordinator's data and filesystem store under
// data.
func newFarm(t *testing.T, data string) *farmProc {
	return &farmProc{t: t, Farm: &farmtest.Farm{Bins: bins, Dir: t.TempDir(), Data: data, Store: "file://" + filepath.Join(data, "store")}}
}

// startServe starts `coordinator serve` on free ports with a filesystem store under data.
func startServe(t *testing.T, data string, extra ...string) *farmProc {
	t.Helper()
	f := newFarm(t, data)
	f.restart(extra...)
	return f
}

// startServeStore starts `coordinator serve` on an object store with the given environment.
func startServeStore(t *testing.T, data, store string, env []string, extra ...string) *farmProc {
	t.Helper()
	f := newFarm(t, data)
	f.Store, f.Env = store, env
	f.restart(extra...)
	return f
}

// startServeNATS starts `coordinator serve` with a filesystem store under data on the NATS
// server at natsURL.
func startServeNATS(t *testing.T, data, natsURL string, extra ...string) *farmProc {
	t.Helper()
	f := newFarm(t, data)
	f.NATS = natsURL
	f.restart(extra...)
	return f
}

// restart starts serve again on the same ports and data, and waits until it is healthy.
func (f *farmProc) restart(extra ...string) {
	f.t.Helper()
	if err := f.StartCoordinator(f.t.Context(), extra...); err != nil {
		f.t.Fatal(err)
	}
	killAtEnd(f.t, f.Coord, fmt.Sprintf("coordinator %v", extra))
}

// js connects to the farm's JetStream, for tests that look at or into its streams.
func (f *farmProc) js() jetstream.JetStream {
	f.t.Helper()
	nc, err := nats.Connect(f.NATSURL())
	if err != nil {
		f.t.Fatalf("connecting to the farm's NATS: %v", err)
	}
	f.t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		f.t.Fatal(err)
	}
	return js
}

// deadLetters lists the DLQ through the CLI.
func (f *farmProc) deadLetters() string {
	f.t.Helper()
	r := f.cli("dlq", "list")
	if r.code != 0 {
		f.t.Fatalf("dlq list: %s", r)
	}
	return r.stdout
}

// assertNoDeadLetters fails the test if anything was dead-lettered.
func (f *farmProc) assertNoDeadLetters() {
	f.t.Helper()
	if out := f.deadLetters(); strings.Contains(out, "tiles.") {
		f.t.Fatalf("something was dead-lettered:\n%s", out)
	}
}

// delayProxy forwards TCP connections to target, holding every chunk for oneWay in each
// direction, so a round trip through it takes 2*oneWay longer: a render node far from NATS.
func delayProxy(t *testing.T, target string, oneWay time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			go delayPipe(out, in, oneWay)
			go delayPipe(in, out, oneWay)
		}
	}()
	return ln.Addr().String()
}

// delayPipe copies src to dst in order, each chunk oneWay after it was read.
func delayPipe(dst, src net.Conn, oneWay time.Duration) {
	type chunk struct {
		data []byte
		due  time.Time
	}
	q := make(chan chunk, 4096)
	go func() {
		defer close(q)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				q <- chunk{buf[:n], time.Now().Add(oneWay)}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range q {
		time.Sleep(time.Until(c.due))
		if _, err := dst.Write(c.data); err != nil {
			break
		}
	}
	dst.Close()
	src.Close()
}

// worker starts a tileworker process for this farm.
func (f *farmProc) worker(name, ckptDir string, extra ...string) *proctest.Proc {
	f.t.Helper()
	w, err := f.StartWorker(farmtest.WorkerSpec{Name: name, Checkpoints: ckptDir, Args: extra})
	if err != nil {
		f.t.Fatal(err)
	}
	killAtEnd(f.t, w.Proc, fmt.Sprintf("tileworker %s %v", name, extra))
	return w.Proc
}

// cli runs a client command against this farm, on its client host if it has one.
func (f *farmProc) cli(args ...string) result {
	f.t.Helper()
	return runOn(f.t, f.client, f.Env, "coordinator", append(args, "--server", f.HTTP)...)
}

// submit submits and decodes the JSON status.
func (f *farmProc) submit(args ...string) (api.Status, result) {
	f.t.Helper()
	r := f.cli(append([]string{"submit", "--json"}, args...)...)
	var st api.Status
	if r.code != 1 && r.code != 2 && r.code != 75 {
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
			f.t.Fatalf("decoding submit output: %v\n%s", err, r)
		}
	}
	return st, r
}

func (f *farmProc) status(job string) (api.Status, result) {
	f.t.Helper()
	r := f.cli("status", job, "--json")
	var st api.Status
	if r.code != 2 && r.code != 75 {
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
			f.t.Fatalf("decoding status output: %v\n%s", err, r)
		}
	}
	return st, r
}

// api is a client of the farm's HTTP API with its token, from its client host if it has one:
// what the tests poll with, so a wait costs a request and not a CLI process.
func (f *farmProc) api() *client.Client {
	token := ""
	for _, kv := range f.Env {
		if v, ok := strings.CutPrefix(kv, client.EnvToken+"="); ok {
			token = v
		}
	}
	var opts []client.Option
	if f.client != nil {
		opts = append(opts, client.WithHTTPClient(f.client.HTTPClient()))
	}
	return client.New(f.HTTP, token, opts...)
}

// patience scales every bound a test puts on waiting for its farm (waitUntil, checkpoints,
// the add-on's Blender). Those bounds catch a hang; they time nothing. The test command runs
// the packages and their tests at once on two cores, where a farm's step takes several times
// what it takes alone, so a test states what a step takes alone and waits patience times that.
const patience = 4

// waitDone polls the job's status until it is completed or failed (status would exit 0 or 1),
// failing the test if d passes first.
func (f *farmProc) waitDone(job string, d time.Duration) api.Status {
	f.t.Helper()
	return f.waitUntil(job, d, "finished", func(st api.Status) bool {
		code := st.State.ExitCode()
		return code == api.ExitOK || code == api.ExitFailed
	})
}

// waitCode polls the job's status until status would exit with code (api.JobState.ExitCode).
func (f *farmProc) waitCode(job string, code int, d time.Duration) api.Status {
	f.t.Helper()
	return f.waitUntil(job, d, fmt.Sprintf("with status exiting %d", code), func(st api.Status) bool { return st.State.ExitCode() == code })
}

// statusPoll is how often waitUntil asks for a job's status.
const statusPoll = 100 * time.Millisecond

// waitUntil polls the job's status through the API until done says so, failing the test
// (the job not what) with the last status or error if d passes first. A coordinator that does
// not answer for a while (restarting, say) is asked again.
func (f *farmProc) waitUntil(job string, d time.Duration, what string, done func(api.Status) bool) api.Status {
	f.t.Helper()
	c := f.api()
	d *= patience
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(f.t.Context(), 10*time.Second)
		st, err := c.Status(ctx, job)
		cancel()
		if err == nil && done(st) {
			return st
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("job %s not %s after %v: last status %+v, error %v", job, what, d, st, err)
		}
		time.Sleep(statusPoll)
	}
}

// metric reads one sample from the coordinator's /metrics.
func metricValue(t *testing.T, addr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("reading metrics: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return parseMetric(t, body, name)
}

// parseMetric is the value of the unlabelled metric name in a /metrics body.
func parseMetric(t *testing.T, body []byte, name string) float64 {
	t.Helper()
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, name+" ") {
			v, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimPrefix(line, name)), 64)
			if err != nil {
				t.Fatalf("metric %s: %v", name, err)
			}
			return v
		}
	}
	t.Fatalf("metric %s not found in:\n%s", name, body)
	return 0
}

// reference renders frames locally with `tileworker render`, once per settings and frame.
func reference(t *testing.T, scene string, frame int, settings ...string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), fmt.Sprintf("ref_%04d.png", frame))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := bins.RenderReference(ctx, farmtest.Reference{Scene: scene, Frame: frame, Out: out, Args: settings}); err != nil {
		t.Fatalf("reference render: %v", err)
	}
	return out
}

// samePixels asserts two PNG files decode to identical pixels.
func samePixels(t *testing.T, got, want string) {
	t.Helper()
	a, b := decodePNG(t, got), decodePNG(t, want)
	if a.Bounds() != b.Bounds() {
		t.Fatalf("%s is %v, reference %s is %v", got, a.Bounds(), want, b.Bounds())
	}
	diff := 0
	for y := a.Bounds().Min.Y; y < a.Bounds().Max.Y; y++ {
		for x := a.Bounds().Min.X; x < a.Bounds().Max.X; x++ {
			r1, g1, b1, a1 := a.At(x, y).RGBA()
			r2, g2, b2, a2 := b.At(x, y).RGBA()
			if r1 != r2 || g1 != g2 || b1 != b2 || a1 != a2 {
				diff++
			}
		}
	}
	if diff > 0 {
		t.Fatalf("%s differs from the reference %s in %d pixels", got, want, diff)
	}
}

func decodePNG(t *testing.T, path string) image.Image {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("decoding %s: %v", path, err)
	}
	return img
}

func containsFold(s, sub string) bool {
	return strings.Contains(strings.ToLower(s), strings.ToLower(sub))
}
