package e2e

import (
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/farmtest"
	"github.com/tilefarm/tilefarm/internal/miniotest"
	"github.com/tilefarm/tilefarm/internal/nettest"
	"github.com/tilefarm/tilefarm/internal/proctest"
)

// hostFarm is a farm whose every process is a host of its own (nettest): the coordinator with
// its embedded JetStream on "coord", MinIO on "store", the test's commands on "client", and
// workers on hosts of their own, started as docs/operations.md tells operators to run a farm
// across machines: serve beyond loopback with its API token and NATS credentials, workers
// with worker.creds and the store's keys.
type hostFarm struct {
	*farmProc
	net                  *nettest.Net
	coord, store, client *nettest.Host
}

const hostFarmToken = "partition-tests-api-token-0123456789"

func startHostFarm(t *testing.T, extra ...string) *hostFarm {
	t.Helper()
	n := nettest.New(t)
	h := &hostFarm{net: n, coord: n.Host("coord"), store: n.Host("store"), client: n.Host("client")}
	bin, err := miniotest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	access, secret := "tilefarm-partitions", "partition-tests-minio-secret-0123"
	minio, err := proctest.StartCmd("minio", h.store.Command(bin, "server", "--address", h.store.HostPort(9000),
		"--console-address", h.store.HostPort(9001), "--quiet", t.TempDir()), filepath.Join(t.TempDir(), "minio.log"),
		[]string{"MINIO_ROOT_USER=" + access, "MINIO_ROOT_PASSWORD=" + secret, "MINIO_BROWSER=off", "MINIO_UPDATE=off", "MINIO_CI_CD=on"})
	if err != nil {
		t.Fatal(err)
	}
	killAtEnd(t, minio, "minio")
	probe := h.store.HTTPClient()
	probe.Timeout = time.Second
	for deadline := time.Now().Add(time.Minute); ; {
		resp, err := probe.Get("http://" + h.store.HostPort(9000) + "/minio/health/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("MinIO on its host not ready: %v\n%s", err, minio.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
	f := newFarm(t, t.TempDir())
	f.client = h.client
	f.CoordHost, f.HTTP, f.NATSListen = h.coord, h.coord.HostPort(7070), h.coord.HostPort(4222)
	f.Store = "s3+http://" + h.store.HostPort(9000) + "/tilefarm"
	f.Env = []string{"AWS_ACCESS_KEY_ID=" + access, "AWS_SECRET_ACCESS_KEY=" + secret, "TILEFARM_API_TOKEN=" + hostFarmToken}
	f.ServeArgs = append([]string{"--workers", "0"}, extra...)
	h.farmProc = f
	f.restart()
	return h
}

// worker starts a tileworker on a host of its own, with the farm's worker credentials.
func (h *hostFarm) worker(name string, extra ...string) (*proctest.Proc, *nettest.Host) {
	h.t.Helper()
	host := h.net.Host(name)
	w, err := h.StartWorker(farmtest.WorkerSpec{Name: name, Host: host,
		Args: append([]string{"--nats-creds", filepath.Join(h.Data, "worker.creds")}, extra...)})
	if err != nil {
		h.t.Fatal(err)
	}
	killAtEnd(h.t, w.Proc, "tileworker "+name)
	return w.Proc, host
}

// waitLog waits up to d for a line of p's log matching re, and returns when it was logged
// and the offset in p's log just past it.
func waitLog(t *testing.T, p *proctest.Proc, re string, d time.Duration) (time.Time, int) {
	t.Helper()
	m, err := p.WaitLog(t.Context(), regexp.MustCompile(`time=(\S+) [^\n]*`+re), 0, d)
	if err != nil {
		t.Fatalf("%s never logged %q within %v: %v\n%s", p.Name, re, d, err, p.Log())
	}
	at, err := time.Parse(time.RFC3339Nano, m.Groups[1])
	if err != nil {
		t.Fatal(err)
	}
	return at, m.End
}

// Property: a namespaced farm, every process a host of its own, renders a job equal to the
// reference; a worker cut off from NATS mid-tile while it still reaches MinIO stops the tile
// within its lease TTL of its last renewal and never promotes it; the tile resumes elsewhere
// from its remote checkpoint; healed, the worker rejoins and nothing is published twice.
func TestPartitionWorkerCutOffFromNATS(t *testing.T) {
	scene := example("shot")
	h := startHostFarm(t)
	slow, slowHost := h.worker("w1", "--fault-pass-delay", "400ms", "--passes", "32", "--checkpoint-every", "0")
	st, r := h.submit(append([]string{scene, "--frames", "3"}, oneTile...)...)
	if r.code != 42 && r.code != 3 {
		t.Fatalf("submit: %s", r)
	}
	waitCheckpoint(t, slow, 8) // and uploaded: every checkpoint is, with --checkpoint-every 0
	if mid, _ := h.status(st.JobID); mid.State == "completed" {
		t.Fatalf("the job completed before the cut: %+v", mid)
	}
	cut := time.Now()
	h.net.Cut(slowHost, h.coord)
	expired, end := waitLog(t, slow, `lease expired on this worker's clock`, 30*time.Second)
	if since := expired.Sub(cut); since > 2*3*time.Second { // the lease TTL is 3 s
		t.Fatalf("w1 stopped the tile %v after the cut, its lease lives 3 s", since)
	}
	rescuer, _ := h.worker("w2")
	done := h.waitDone(st.JobID, 2*time.Minute)
	if done.State != "completed" || done.SamplesRecovered == 0 || done.TilesFailed != 0 {
		t.Fatalf("job after the cut: %+v (want completed, resumed from w1's checkpoint)", done)
	}
	h.net.Heal(slowHost, h.coord)
	waitWorkers(t, h.farmProc, "w1,w2", time.Minute) // w1 rejoins
	time.Sleep(2 * time.Second)                      // and says what it would say about its old tile
	if strings.Contains(slow.Log(), `msg="tile promoted"`) {
		t.Fatalf("w1 promoted the tile it had lost:\n%s", slow.Log())
	}
	if n := strings.Count(rescuer.Log(), `msg="tile promoted"`); n != 1 {
		t.Fatalf("w2 promoted %d tiles, want the one tile once:\n%s", n, rescuer.Log())
	}
	after := slow.Log()[end:]
	if n := strings.Count(after, "checkpoint saved"); strings.Contains(after, "remote checkpoint uploaded") || n > 1 {
		t.Fatalf("w1 kept rendering (%d checkpoints) or uploading after its lease expired:\n%s", n, after)
	}
	h.assertNoDeadLetters()
	outputsEqualReference(t, h.farmProc, st.JobID, scene, []int{3}, oneTile...)
	t.Logf("figures: tiles lost 0, promoted twice 0, frames differing 0, false dead letters 0; w1 stopped %v after the cut",
		expired.Sub(cut).Round(time.Millisecond))
}

// Property: a worker cut off from MinIO but not from NATS (its packets dropped, not refused)
// says so (its log, tilefarm_worker_store_available), takes no new work, and hands its tile on
// without spending a delivery, so another worker renders it: the job completes equal to the
// reference, nothing dead-lettered.
func TestPartitionWorkerCutOffFromTheStore(t *testing.T) {
	scene := example("shot")
	h := startHostFarm(t)
	slow, slowHost := h.worker("w1", "--fault-pass-delay", "400ms", "--passes", "32", "--checkpoint-every", "0")
	st, r := h.submit(append([]string{scene, "--frames", "4"}, oneTile...)...)
	if r.code != 42 && r.code != 3 {
		t.Fatalf("submit: %s", r)
	}
	waitCheckpoint(t, slow, 8)
	if mid, _ := h.status(st.JobID); mid.State == "completed" {
		t.Fatalf("the job completed before the cut: %+v", mid)
	}
	h.net.Cut(slowHost, h.store)
	rescuer, _ := h.worker("w2")
	waitLog(t, slow, `object store unavailable`, time.Minute)
	waitLog(t, slow, `handing the job on`, 2*time.Minute)
	done := h.waitDone(st.JobID, 3*time.Minute)
	if done.State != "completed" || done.TilesFailed != 0 {
		t.Fatalf("job after the store was cut off from w1: %+v", done)
	}
	if !strings.Contains(rescuer.Log(), `msg="tile promoted"`) || strings.Contains(slow.Log(), `msg="tile promoted"`) {
		t.Fatalf("the tile was not rendered by w2 alone:\nw1:\n%s\nw2:\n%s", slow.Log(), rescuer.Log())
	}
	h.assertNoDeadLetters()
	outputsEqualReference(t, h.farmProc, st.JobID, scene, []int{4}, oneTile...)
	h.net.Heal(slowHost, h.store)
	waitLog(t, slow, `object store available again`, time.Minute)
	t.Log("figures: tiles lost 0, promoted twice 0, frames differing 0, false dead letters 0")
}

// Property: a link that flaps (cut and healed every few seconds) between a rendering worker and
// NATS for half a minute costs nothing but time: the job completes equal to the reference,
// nothing is dead-lettered, and no tile is promoted twice.
func TestPartitionFlappingLink(t *testing.T) {
	scene := example("shot")
	h := startHostFarm(t)
	flappy, flappyHost := h.worker("w1", "--fault-pass-delay", "150ms", "--checkpoint-every", "0")
	steady, _ := h.worker("w2", "--fault-pass-delay", "150ms", "--checkpoint-every", "0")
	st, r := h.submit(append([]string{scene, "--frames", "5-6"}, small...)...)
	if r.code != 42 && r.code != 3 {
		t.Fatalf("submit: %s", r)
	}
	waitCheckpoint(t, flappy, 2)
	flaps := 0
	for start := time.Now(); time.Since(start) < 30*time.Second; flaps++ {
		if mid, _ := h.status(st.JobID); flaps == 0 && mid.State == "completed" {
			t.Fatalf("the job completed before the link flapped: %+v", mid)
		}
		h.net.Cut(flappyHost, h.coord)
		time.Sleep(time.Duration(1500+500*(flaps%3)) * time.Millisecond)
		h.net.Heal(flappyHost, h.coord)
		time.Sleep(2 * time.Second)
	}
	done := h.waitDone(st.JobID, 3*time.Minute)
	if done.State != "completed" || done.TilesFailed != 0 {
		t.Fatalf("job after %d flaps: %+v", flaps, done)
	}
	if promoted := strings.Count(flappy.Log(), `msg="tile promoted"`) + strings.Count(steady.Log(), `msg="tile promoted"`); promoted != done.TilesTotal {
		t.Fatalf("%d promotions for %d tiles:\nw1:\n%s\nw2:\n%s", promoted, done.TilesTotal, flappy.Log(), steady.Log())
	}
	h.assertNoDeadLetters()
	outputsEqualReference(t, h.farmProc, st.JobID, scene, []int{5, 6}, small...)
	t.Logf("figures: %d flaps; tiles lost 0, promoted twice 0, frames differing 0, false dead letters 0", flaps)
}

// Property: a worker whose checkpoint disk is full says so and keeps rendering, its tiles still
// resumable from their remote checkpoints: the job completes equal to the reference, nothing
// dead-lettered, and the worker's local database stays readable (it starts again on it).
func TestWorkerCheckpointDiskFull(t *testing.T) {
	scene := example("shot")
	disk := nettest.Tmpfs(t, "96k")
	f := startServe(t, t.TempDir())
	w := f.worker("w", disk, "--checkpoint-every", "0")
	st, _ := f.submit(append([]string{scene, "--frames", "7"}, oneTile...)...)
	done := f.waitDone(st.JobID, 2*time.Minute)
	if done.State != "completed" || done.TilesFailed != 0 {
		t.Fatalf("job on a worker with a full checkpoint disk: %+v", done)
	}
	if !strings.Contains(w.Log(), "saving local checkpoint") || !strings.Contains(w.Log(), "no space left on device") {
		t.Fatalf("the worker never said its checkpoint disk was full:\n%s", w.Log())
	}
	if !strings.Contains(w.Log(), "remote checkpoint uploaded") {
		t.Fatalf("no remote checkpoint while the local disk was full:\n%s", w.Log())
	}
	f.assertNoDeadLetters()
	outputsEqualReference(t, f, st.JobID, scene, []int{7}, oneTile...)
	w.Kill()
	w.WaitExit(10 * time.Second)
	again := f.worker("w", disk, "--checkpoint-every", "0")
	waitLog(t, again, `worker started`, 30*time.Second)
}
