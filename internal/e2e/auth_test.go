//go:build linux

package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/wire"
)

// violations collects the asynchronous errors a NATS connection reports.
type violations struct {
	mu   sync.Mutex
	errs []string
}

func (v *violations) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.errs = append(v.errs, err.Error())
}

// wait returns once an error mentioning sub was reported.
func (v *violations) wait(t *testing.T, sub string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		v.mu.Lock()
		for _, e := range v.errs {
			if strings.Contains(e, "Permissions Violation") && strings.Contains(e, sub) {
				v.mu.Unlock()
				return
			}
		}
		v.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no permissions violation reported for %q (errors: %v)", sub, v.errs)
}

// With authentication on, the farm works with the right credentials and refuses everything
// else: clients without credentials, API calls without the token, and a worker credential
// trying what only the coordinator may do. No secret appears in any log line or error.
func TestAuthenticatedFarm(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	data := t.TempDir()
	raw := make([]byte, 24)
	_, _ = rand.Read(raw)
	token := "tf-" + hex.EncodeToString(raw)
	tokenFile := filepath.Join(t.TempDir(), "api-token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := newFarm(t, data)
	f.Env = []string{"TILEFARM_API_TOKEN=" + token}
	f.restart("--nats-auth", "--api-token-file", tokenFile)
	workerCreds := filepath.Join(data, "worker.creds")
	for _, name := range []string{"worker.creds", "coordinator.creds"} {
		fi, err := os.Stat(filepath.Join(data, name))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("credentials %s: %v, mode %v; want mode 0600", name, err, fi.Mode().Perm())
		}
	}
	credsBefore, _ := os.ReadFile(workerCreds)
	w := f.worker("w", t.TempDir(), "--nats-creds", workerCreds)

	// The right credentials render.
	var outputs []string
	st, r := f.submit(append([]string{scene, "--frames", "2"}, small...)...)
	outputs = append(outputs, r.stdout+r.stderr)
	if done := f.waitDone(st.JobID, 2*time.Minute); done.State != "completed" {
		t.Fatalf("job on the authenticated farm: %+v", done)
	}
	outputsEqualReference(t, f, st.JobID, scene, []int{2}, small...)

	// The API refuses a missing token with 401, and the CLI says why.
	resp, err := http.Get("http://" + f.HTTP + "/v1/jobs/" + st.JobID)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("GET without a token = %d, want 401", resp.StatusCode)
	}
	noToken := runEnv(t, []string{"TILEFARM_API_TOKEN="}, "coordinator", "status", st.JobID, "--server", f.HTTP)
	outputs = append(outputs, noToken.stdout+noToken.stderr)
	if noToken.code != 1 || !strings.Contains(noToken.stderr, "TILEFARM_API_TOKEN") {
		t.Fatalf("status without a token: %s", noToken)
	}

	// NATS refuses a client without credentials.
	if nc, err := nats.Connect(f.NATSURL(), nats.NoReconnect(), nats.Timeout(2*time.Second)); err == nil {
		nc.Close()
		t.Fatal("NATS accepted a client without credentials")
	} else if !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Fatalf("connecting without credentials: %v, want an authorization error", err)
	}

	// A worker credential cannot do what only the coordinator may.
	var v violations
	wnc, err := nats.Connect(f.NATSURL(), workerIdentity(t, workerCreds), nats.ErrorHandler(v.handler), nats.NoReconnect())
	if err != nil {
		t.Fatalf("connecting with the worker credential: %v", err)
	}
	defer wnc.Close()
	wjs, err := jetstream.New(wnc)
	if err != nil {
		t.Fatal(err)
	}
	short := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 2*time.Second)
	}
	ctx, cancel := short()
	if err := wjs.DeleteStream(ctx, queue.StreamTiles); err == nil {
		t.Fatal("a worker credential deleted TILES")
	}
	cancel()
	v.wait(t, "$JS.API.STREAM.DELETE.TILES")
	ctx, cancel = short()
	if tiles, err := wjs.Stream(ctx, queue.StreamTiles); err != nil {
		t.Fatalf("a worker credential cannot even read TILES' info: %v", err)
	} else if err := tiles.Purge(ctx); err == nil {
		t.Fatal("a worker credential purged TILES")
	}
	cancel()
	v.wait(t, "$JS.API.STREAM.PURGE.TILES")
	ctx, cancel = short()
	if err := wjs.DeleteKeyValue(ctx, queue.BucketLeases); err == nil {
		t.Fatal("a worker credential deleted the leases bucket")
	}
	cancel()
	v.wait(t, "$JS.API.STREAM.DELETE.KV_leases")
	ctx, cancel = short()
	if _, err := wjs.CreateOrUpdateConsumer(ctx, queue.StreamTiles, jetstream.ConsumerConfig{Durable: queue.ConsumerWorkers, MaxDeliver: 1}); err == nil {
		t.Fatal("a worker credential edited the workers consumer")
	}
	cancel()
	v.wait(t, "$JS.API.CONSUMER")
	forged := []byte(`{"type":"frame.completed","frame_key":"` + st.Frames[0].FrameKey + `","formats":["exr"]}`)
	if err := wnc.Publish("events.frame.completed", forged); err != nil {
		t.Fatal(err)
	}
	v.wait(t, "events.frame.completed")
	if err := wnc.Publish(queue.SubjectRender, []byte(`{"tile_key":"forged"}`)); err != nil {
		t.Fatal(err)
	}
	v.wait(t, queue.SubjectRender)

	// What a worker may do still works for it: reading its bucket, for one.
	ctx, cancel = short()
	if _, err := wjs.KeyValue(ctx, queue.BucketLeases); err != nil {
		t.Fatalf("the worker credential cannot open the leases bucket: %v", err)
	}
	cancel()

	// A render node's own identity, added while serve runs, is loaded without a restart and
	// renders; no other identity reads its inbox, and none reads the coordinator's.
	if r := run(t, "coordinator", "credentials", "--data", data, "--worker", "node2"); r.code != 0 || !strings.Contains(r.stdout, "accounts") {
		t.Fatalf("credentials --worker node2: %s", r)
	}
	node2Creds := filepath.Join(data, "workers", "node2.creds")
	node2Pub := publicKey(t, node2Creds)
	for _, sub := range []string{"_INBOX.>", queue.WorkerInboxPrefix(node2Pub) + ".>", "_INBOX_W.>"} {
		if _, err := wnc.SubscribeSync(sub); err != nil {
			t.Fatal(err)
		}
		v.wait(t, sub)
	}
	if _, err := f.Coord.WaitLog(t.Context(), regexp.MustCompile(`worker identities loaded[^\n]*added=1`), 0, 30*time.Second); err != nil {
		t.Fatalf("serve never loaded the identity added to its data directory: %v\n%s", err, f.Coord.Log())
	}
	w.Kill()
	w.WaitExit(10 * time.Second)
	outputs = append(outputs, w.Log())
	w = f.worker("node2", t.TempDir(), "--nats-creds", node2Creds)
	st3, r := f.submit(append([]string{scene, "--frames", "4"}, small...)...)
	outputs = append(outputs, r.stdout+r.stderr)
	if done := f.waitDone(st3.JobID, 2*time.Minute); done.State != "completed" || !strings.Contains(w.Log(), `msg="tile promoted"`) {
		t.Fatalf("job on a render node's own identity: %+v\n%s", done, w.Log())
	}

	// The coordinator's own credential sees everything intact.
	copt, err := nats.NkeyOptionFromSeed(filepath.Join(data, "coordinator.creds"))
	if err != nil {
		t.Fatal(err)
	}
	cnc, err := nats.Connect(f.NATSURL(), copt)
	if err != nil {
		t.Fatal(err)
	}
	defer cnc.Close()
	cjs, _ := jetstream.New(cnc)
	ctx, cancel = short()
	defer cancel()
	if _, err := cjs.KeyValue(ctx, queue.BucketLeases); err != nil {
		t.Fatalf("the leases bucket is gone: %v", err)
	}
	events, err := cjs.Stream(ctx, queue.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := events.GetLastMsgForSubject(ctx, "events.frame.completed"); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("a forged frame.completed reached EVENTS: %v", err)
	}

	// Credentials are reused on restart, and the render node goes on rendering.
	f.Coord.Kill()
	f.restart("--nats-auth", "--api-token-file", tokenFile)
	if credsAfter, _ := os.ReadFile(workerCreds); string(credsAfter) != string(credsBefore) {
		t.Fatal("the worker credentials changed on restart")
	}
	st2, r := f.submit(append([]string{scene, "--frames", "3"}, small...)...)
	outputs = append(outputs, r.stdout+r.stderr)
	if done := f.waitDone(st2.JobID, 2*time.Minute); done.State != "completed" {
		t.Fatalf("job after the coordinator's restart: %+v", done)
	}

	// No secret in any log or output.
	seeds := secretLines(t, workerCreds, node2Creds, filepath.Join(data, "coordinator.creds"))
	logs := append(outputs, f.Coord.Log(), w.Log())
	for _, l := range logs {
		for _, secret := range append(seeds, token) {
			if strings.Contains(l, secret) {
				t.Fatalf("a secret appears in a log or output:\n%s", l)
			}
		}
	}
}

// workerIdentity is the option that connects as the worker identity in a credential file, as
// a tileworker does: its seed, and its own inbox, the only one it may read.
func workerIdentity(t *testing.T, path string) nats.Option {
	t.Helper()
	seed, err := nats.NkeyOptionFromSeed(path)
	if err != nil {
		t.Fatal(err)
	}
	prefix := queue.WorkerInboxPrefix(publicKey(t, path))
	return func(o *nats.Options) error {
		if err := seed(o); err != nil {
			return err
		}
		return nats.CustomInboxPrefix(prefix)(o)
	}
}

// publicKey is the public key of the nkey seed in a credential file.
func publicKey(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.ParseDecoratedNKey(b)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// secretLines returns the nkey seeds in credential files.
func secretLines(t *testing.T, files ...string) []string {
	t.Helper()
	var out []string
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "SU") {
				out = append(out, l)
			}
		}
	}
	if len(out) != len(files) {
		t.Fatalf("found %d seeds in %d credential files", len(out), len(files))
	}
	return out
}

// serve refuses to expose the API beyond loopback without a token, and says why.
func TestServeRefusesAnOpenAPIBeyondLoopback(t *testing.T) {
	t.Parallel()
	r := runEnv(t, []string{"TILEFARM_API_TOKEN="}, "coordinator", "serve", "--data", t.TempDir(), "--listen", "0.0.0.0:"+strings.Split(freePort(t), ":")[1],
		"--nats-listen", freePort(t))
	if r.code != 2 || !strings.Contains(r.stderr, "without a token") || !strings.Contains(r.stderr, "--insecure") {
		t.Fatalf("serve --listen 0.0.0.0 without a token: %s", r)
	}
}

// Beyond loopback the embedded JetStream requires credentials without being asked: serve
// writes them and refuses a client that has none.
func TestEmbeddedNATSBeyondLoopbackRequiresCredentials(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	port := strings.Split(freePort(t), ":")[1]
	f := newFarm(t, data)
	f.NATSListen = "0.0.0.0:" + port
	f.restart()
	if _, err := os.Stat(filepath.Join(data, "worker.creds")); err != nil {
		t.Fatalf("no worker credentials written: %v", err)
	}
	if !strings.Contains(f.Coord.Log(), "auth=true") {
		t.Fatalf("the embedded server does not say it requires credentials:\n%s", f.Coord.Log())
	}
	if nc, err := nats.Connect("nats://127.0.0.1:"+port, nats.NoReconnect(), nats.Timeout(2*time.Second)); err == nil {
		nc.Close()
		t.Fatal("a client without credentials was accepted beyond loopback")
	}
	seed, err := nats.NkeyOptionFromSeed(filepath.Join(data, "worker.creds"))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect("nats://127.0.0.1:"+port, seed, nats.NoReconnect())
	if err != nil {
		t.Fatalf("the worker credential was refused: %v", err)
	}
	nc.Close()
}

// Property: nothing believed without proof. A tile.completed forged with a worker credential
// for every tile of a frame no worker rendered yet does not complete it: the relay finds no
// manifest before asking for the frame's assembly and sends the tiles back, and the job
// renders them and completes equal to the reference.
func TestForgedCompletionDoesNotCompleteATile(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	data := t.TempDir()
	f := newFarm(t, data)
	f.restart("--nats-auth")
	st, r := f.submit(append([]string{scene, "--frames", "9"}, small...)...)
	if r.code != 42 {
		t.Fatalf("submit: %s", r)
	}
	var tiles api.FrameTiles
	if r := f.cli("status", st.JobID, "--json"); r.code != 42 {
		t.Fatalf("status: %s", r)
	}
	resp, err := http.Get("http://" + f.HTTP + "/v1/jobs/" + st.JobID + "/frames/9/tiles")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.NewDecoder(resp.Body).Decode(&tiles); err != nil || len(tiles.Tiles) == 0 {
		t.Fatalf("tiles of frame 9: %v %+v", err, tiles)
	}
	resp.Body.Close()
	nc, err := nats.Connect(f.NATSURL(), workerIdentity(t, filepath.Join(data, "worker.creds")))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	frameKey := st.Frames[0].FrameKey
	for _, tile := range tiles.Tiles {
		ev := wire.Event{ID: "forged:" + tile.TileKey, Type: wire.EventTileCompleted, JobID: st.JobID, TileKey: tile.TileKey,
			TileIndex: tile.Index, FrameKey: frameKey, Worker: "forger", Attempt: "forged", Time: time.Now().UTC()}
		data, _ := json.Marshal(ev)
		if _, err := js.Publish(t.Context(), ev.Subject(), data); err != nil {
			t.Fatalf("publishing a forged completion with the worker credential: %v", err)
		}
	}
	// The claims are applied, then found unproven before the frame is assembled.
	for deadline := time.Now().Add(30 * time.Second); ; {
		if strings.Contains(f.Coord.Log(), "tiles recorded completed have no manifest") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the forged completions were never found unproven:\n%s", f.Coord.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if now, _ := f.status(st.JobID); now.State == "completed" || now.TilesCompleted == now.TilesTotal {
		t.Fatalf("forged completions completed the frame: %+v", now)
	}
	w := f.worker("honest", t.TempDir(), "--nats-creds", filepath.Join(data, "worker.creds"))
	done := f.waitDone(st.JobID, 2*time.Minute)
	if done.State != "completed" || strings.Count(w.Log(), `msg="tile promoted"`) != done.TilesTotal {
		t.Fatalf("job after forged completions: %+v\n%s", done, w.Log())
	}
	outputsEqualReference(t, f, st.JobID, scene, []int{9}, small...)
}
