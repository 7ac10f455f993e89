//go:build linux

package e2e

import (
	"cmp"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/farmtest"
	"github.com/tilefarm/tilefarm/internal/miniotest"
	"github.com/tilefarm/tilefarm/internal/natstest"
	"github.com/tilefarm/tilefarm/internal/nettest"
	"github.com/tilefarm/tilefarm/internal/proctest"
)

// hostFarm is a farm whose every process is a host of its own (nettest): the coordinator on
// "coord", MinIO on "store", the test's commands on "client", workers on hosts of their own,
// and JetStream either embedded in the coordinator or a cluster of three nats-server nodes
// (n1, n2, n3). It is started as docs/operations.md and docs/reliability.md tell operators to
// run a farm across machines: serve beyond loopback with its API token, every NATS identity
// made by `coordinator credentials` (one per render node, w1..w3), the store's keys, and, on
// the cluster, TLS from the farm's CA and every stream replicated thrice.
type hostFarm struct {
	*farmProc
	net                  *nettest.Net
	coord, store, client *nettest.Host
	nats                 []*nettest.Host   // the cluster's nodes' hosts; nil: embedded
	cluster              *natstest.Cluster // the cluster, when there is one
	creds                string            // the directory of the NATS identities
	workerArgs           []string          // every worker's NATS flags
}

// hostFarmConfig says how startHostFarm lays a farm out.
type hostFarmConfig struct {
	Cluster bool // JetStream on a 3-node cluster of hosts, not embedded in the coordinator
	// Attach are the nodes (0-2) the coordinator and the workers are given; they discover
	// the others. Empty: all three.
	Attach []int
	Data   string   // serve's --data (a small tmpfs, say); empty: a temporary directory
	Serve  []string // further serve flags
}

const hostFarmToken = "partition-tests-api-token-0123456789"

// hostFarmWorkers are the render nodes a host farm has identities for.
var hostFarmWorkers = []string{"w1", "w2", "w3"}

func startHostFarm(t *testing.T, cfg hostFarmConfig) *hostFarm {
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
	f := newFarm(t, cmp.Or(cfg.Data, t.TempDir()))
	h.creds = f.Data
	if cfg.Cluster {
		h.creds = t.TempDir()
	}
	// The identities first: serve embedding NATS reuses those it finds in its --data.
	r := run(t, "coordinator", "credentials", "--data", h.creds, "--worker", strings.Join(hostFarmWorkers, ","))
	if r.code != 0 {
		t.Fatalf("coordinator credentials: %s", r)
	}
	f.client = h.client
	f.CoordHost, f.HTTP = h.coord, h.coord.HostPort(7070)
	f.Store = "s3+http://" + h.store.HostPort(9000) + "/tilefarm"
	f.Env = []string{"AWS_ACCESS_KEY_ID=" + access, "AWS_SECRET_ACCESS_KEY=" + secret, "TILEFARM_API_TOKEN=" + hostFarmToken}
	f.ServeArgs = append([]string{"--workers", "0"}, cfg.Serve...)
	if cfg.Cluster {
		h.startCluster(t, r.stdout)
		attach := cfg.Attach
		if len(attach) == 0 {
			attach = []int{0, 1, 2}
		}
		f.NATS = h.natsURLs(attach...)
		ca := filepath.Join(h.creds, "ca.pem")
		f.ServeArgs = append(f.ServeArgs, "--nats-creds", filepath.Join(h.creds, "coordinator.creds"), "--nats-ca", ca, "--replicas", "3")
		h.workerArgs = []string{"--nats-ca", ca}
	} else {
		f.NATSListen = h.coord.HostPort(4222)
	}
	h.farmProc = f
	waitMinIO(t, h.store, minio)
	f.restart()
	return h
}

// startCluster starts the cluster's three nodes, each on a host of its own, with the accounts
// block `coordinator credentials` printed and a TLS certificate of the farm's CA.
func (h *hostFarm) startCluster(t *testing.T, accounts string) {
	t.Helper()
	for _, name := range []string{"n1", "n2", "n3"} {
		h.nats = append(h.nats, h.net.Host(name))
	}
	ca, caKey := writeCert(t, h.creds, "ca", true, nil, nil)
	writeCert(t, h.creds, "nats", false, ca, caKey, h.nats[0].Addr, h.nats[1].Addr, h.nats[2].Addr)
	conf := accounts + fmt.Sprintf("tls {\n  cert_file: %q\n  key_file: %q\n}\n",
		filepath.Join(h.creds, "nats.pem"), filepath.Join(h.creds, "nats-key.pem"))
	coordSeed, err := nats.NkeyOptionFromSeed(filepath.Join(h.creds, "coordinator.creds"))
	if err != nil {
		t.Fatal(err)
	}
	h.cluster = natstest.StartCluster(t, 3, natstest.Options{Config: conf,
		Connect: []nats.Option{coordSeed, nats.RootCAs(filepath.Join(h.creds, "ca.pem"))},
		Hosts:   []natstest.Host{h.nats[0], h.nats[1], h.nats[2]}})
}

// natsURLs are the client URLs of the cluster's nodes named, comma-separated.
func (h *hostFarm) natsURLs(nodes ...int) string {
	var urls []string
	for _, i := range nodes {
		urls = append(urls, "nats://"+h.nats[i].HostPort(4222))
	}
	return strings.Join(urls, ",")
}

// waitMinIO waits up to a minute until MinIO on host answers its readiness probe.
func waitMinIO(t *testing.T, host *nettest.Host, minio *proctest.Proc) {
	t.Helper()
	probe := host.HTTPClient()
	probe.Timeout = time.Second
	for deadline := time.Now().Add(time.Minute); ; {
		resp, err := probe.Get("http://" + host.HostPort(9000) + "/minio/health/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("MinIO on its host not ready: %v\n%s", err, minio.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// worker starts a tileworker on a host of its own, with the identity of that render node.
func (h *hostFarm) worker(name string, extra ...string) (*proctest.Proc, *nettest.Host) {
	h.t.Helper()
	host := h.net.Host(name)
	args := append([]string{"--nats-creds", filepath.Join(h.creds, "workers", name+".creds")}, h.workerArgs...)
	w, err := h.StartWorker(farmtest.WorkerSpec{Name: name, Host: host, Args: append(args, extra...)})
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
	t.Parallel() // its own hosts and ports; it mostly waits on leases and cuts
	scene := example("shot")
	h := startHostFarm(t, hostFarmConfig{})
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
	t.Parallel() // its own hosts and ports; it mostly waits on leases and cuts
	scene := example("shot")
	h := startHostFarm(t, hostFarmConfig{})
	// A fast clock: w1 hands its tile on after 5 s of an unreachable store, not 30.
	slow, slowHost := h.worker("w1", "--fault-pass-delay", "400ms", "--passes", "32", "--checkpoint-every", "0", "--hand-on-after", "5s")
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
	t.Parallel() // its own hosts and ports; it mostly waits on leases and cuts
	scene := example("shot")
	h := startHostFarm(t, hostFarmConfig{})
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
	t.Parallel() // its own hosts and ports; it mostly waits on leases and cuts
	scene := example("shot")
	disk := nettest.Tmpfs(t, "96k")
	f := startServe(t, t.TempDir())
	w := f.worker("w", disk, "--checkpoint-every", "0", "--remote-checkpoint-every", "0")
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

// assertExact fails the test unless st is the status of a job completed exactly: every frame
// and tile completed, none failed, and the samples done the samples of the job.
func assertExact(t *testing.T, st api.Status) {
	t.Helper()
	exact := st.State == "completed" && st.FramesCompleted == st.FramesTotal && st.FramesFailed == 0 &&
		st.TilesCompleted == st.TilesTotal && st.TilesFailed == 0 && st.SamplesDone == st.SamplesTotal && len(st.Frames) == st.FramesTotal
	for _, fr := range st.Frames {
		exact = exact && fr.State == "completed" && fr.TilesCompleted == fr.TilesTotal && fr.TilesFailed == 0 && fr.SamplesDone == fr.SamplesTotal
	}
	if !exact {
		t.Fatalf("the job's status is not that of a job completed exactly: %+v", st)
	}
}

// promotions counts the tiles the workers promoted, as they log them.
func promotions(workers ...*proctest.Proc) int {
	n := 0
	for _, w := range workers {
		n += strings.Count(w.Log(), `msg="tile promoted"`)
	}
	return n
}

// Property: the whole namespaced farm (a 3-node cluster, MinIO, the coordinator and three
// workers, each a host) renders equal to the reference; and a coordinator cut off from every
// node of its NATS cluster for 60 s while workers render catches up when the link heals: the workers go on rendering through the cut, a job
// submitted during it waits (the command retrying) and is accepted once the link heals and rendered, no job is stranded, and the statuses are
// exact: every tile promoted once, frames equal to the reference, nothing dead-lettered.
func TestPartitionCoordinatorCutOffFromNATS(t *testing.T) {
	t.Parallel() // its own hosts and ports; it mostly waits on leases and cuts
	scene := example("shot")
	h := startHostFarm(t, hostFarmConfig{Cluster: true})
	slow := []string{"--fault-pass-delay", "500ms", "--passes", "16", "--checkpoint-every", "0"}
	w1, _ := h.worker("w1", slow...)
	w2, _ := h.worker("w2", slow...)
	w3, _ := h.worker("w3", slow...)
	st, r := h.submit(append([]string{scene, "--frames", "1-2"}, small...)...)
	if r.code != 42 {
		t.Fatalf("submit: %s", r)
	}
	waitCheckpoint(t, w1, 2)
	if mid, _ := h.status(st.JobID); mid.State == "completed" {
		t.Fatalf("the job completed before the cut: %+v", mid)
	}
	before := promotions(w1, w2, w3)
	for _, n := range h.nats {
		h.net.Cut(h.coord, n)
	}
	cut := time.Now()
	waitLog(t, h.Coord, `(?:cannot reach NATS|disconnected from NATS)`, 30*time.Second)
	// A coordinator cut off from JetStream cannot know it still leads, so it records nothing
	// (docs/design.md, "Replication"): a submission made during the cut waits, the command
	// trying again, until the link heals and the coordinator leads again.
	time.Sleep(time.Until(cut.Add(30 * time.Second)))
	type submitted struct {
		st api.Status
		r  result
		at time.Time
	}
	lateDone := make(chan submitted, 1)
	go func() {
		st, r := h.submit(append([]string{scene, "--frames", "3"}, small...)...)
		lateDone <- submitted{st, r, time.Now()}
	}()
	time.Sleep(time.Until(cut.Add(60 * time.Second)))
	during := promotions(w1, w2, w3) - before
	if during == 0 {
		t.Fatalf("the workers promoted nothing while the coordinator was cut off:\nw1:\n%s\nw2:\n%s", w1.Log(), w2.Log())
	}
	healed := time.Now()
	for _, n := range h.nats {
		h.net.Heal(h.coord, n)
	}
	s := <-lateDone
	late, r := s.st, s.r
	if r.code != 42 || s.at.Before(healed) {
		t.Fatalf("a job submitted while the coordinator is cut off from NATS: want it accepted once the link healed, got at %v (healed %v): %s",
			s.at.Format(time.TimeOnly), healed.Format(time.TimeOnly), r)
	}
	for _, job := range []string{st.JobID, late.JobID} {
		assertExact(t, h.waitDone(job, 3*time.Minute))
	}
	if n, want := promotions(w1, w2, w3), 3*6; n != want {
		t.Fatalf("%d promotions for %d tiles", n, want)
	}
	h.assertNoDeadLetters()
	outputsEqualReference(t, h.farmProc, st.JobID, scene, []int{1, 2}, small...)
	outputsEqualReference(t, h.farmProc, late.JobID, scene, []int{3}, small...)
	t.Logf("figures: tiles promoted during the 60 s cut %d; tiles lost 0, promoted twice 0, frames differing 0, false dead letters 0", during)
}

// Property: a NATS node cut off from the rest of its cluster, with the coordinator and a
// worker rendering attached to it, costs nothing but time: the worker stops its tile within
// its lease (no renewal reaches a quorum), both leave the node for one that serves JetStream,
// the tile resumes from its remote checkpoint, and healed, the node rejoins: the job completes
// equal to the reference, each tile promoted once, nothing dead-lettered.
func TestPartitionNATSNodeCutOffFromItsCluster(t *testing.T) {
	t.Parallel() // its own hosts and ports; it mostly waits on leases and cuts
	scene := example("shot")
	h := startHostFarm(t, hostFarmConfig{Cluster: true, Attach: []int{0}})
	slow, _ := h.worker("w1", "--fault-pass-delay", "400ms", "--passes", "32", "--checkpoint-every", "0")
	st, r := h.submit(append([]string{scene, "--frames", "4"}, oneTile...)...)
	if r.code != 42 {
		t.Fatalf("submit: %s", r)
	}
	waitCheckpoint(t, slow, 8)
	if mid, _ := h.status(st.JobID); mid.State == "completed" {
		t.Fatalf("the job completed before the cut: %+v", mid)
	}
	h.net.Cut(h.nats[0], h.nats[1])
	h.net.Cut(h.nats[0], h.nats[2])
	waitLog(t, slow, `lease expired on this worker's clock`, 30*time.Second)
	rescuer, _ := h.worker("w2")
	for _, p := range []*proctest.Proc{slow, h.Coord} {
		waitLog(t, p, `does not answer JetStream requests; moving to another`, time.Minute)
		waitLog(t, p, `reconnected to NATS" server=n[23]`, time.Minute)
	}
	done := h.waitDone(st.JobID, 2*time.Minute)
	assertExact(t, done)
	if done.SamplesRecovered == 0 {
		t.Fatalf("the tile did not resume from its checkpoint: %+v", done)
	}
	h.net.Heal(h.nats[0], h.nats[1])
	h.net.Heal(h.nats[0], h.nats[2])
	if n := promotions(slow, rescuer); n != 1 {
		t.Fatalf("%d promotions of the one tile:\nw1:\n%s\nw2:\n%s", n, slow.Log(), rescuer.Log())
	}
	h.assertNoDeadLetters()
	outputsEqualReference(t, h.farmProc, st.JobID, scene, []int{4}, oneTile...)
	t.Log("figures: tiles lost 0, promoted twice 0, frames differing 0, false dead letters 0")
}

// fillDisk writes a file into dir until its file system is full and returns its path.
func fillDisk(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !strings.Contains(err.Error(), "no space left on device") {
				t.Fatalf("filling %s: %v", dir, err)
			}
			break
		}
	}
	// The last bytes too, so nothing but the page cache holds them.
	for n := 4096; n > 0; n /= 2 {
		for {
			if _, err := f.Write(chunk[:n]); err != nil {
				break
			}
		}
	}
	return path
}

// Property: the coordinator's data disk filling up mid-render (its database and its embedded
// JetStream's store on it) gives clear errors and loses nothing: when space returns the farm
// goes on by itself, the job completes exactly and equal to the reference, nothing is
// dead-lettered, and the database opens again after a restart with the same statuses.
func TestCoordinatorDataDiskFull(t *testing.T) {
	t.Parallel() // its own hosts and ports; it mostly waits on leases and cuts
	scene := example("shot")
	disk := nettest.Tmpfs(t, "48m")
	f := newFarm(t, disk)
	f.Store = "file://" + filepath.Join(t.TempDir(), "store")
	f.restart()
	w := f.worker("w", t.TempDir(), "--fault-pass-delay", "150ms", "--checkpoint-every", "0")
	st, r := f.submit(append([]string{scene, "--frames", "1-4"}, small...)...)
	if r.code != 42 {
		t.Fatalf("submit: %s", r)
	}
	waitCheckpoint(t, w, 2)
	if mid, _ := f.status(st.JobID); mid.State == "completed" {
		t.Fatalf("the job completed before the disk filled: %+v", mid)
	}
	filler := fillDisk(t, disk)
	waitLog(t, f.Coord, `cannot write its store under --data`, 30*time.Second)
	late, r := f.submit(append([]string{scene, "--frames", "5"}, small...)...)
	if r.code != 75 || !strings.Contains(r.stderr, "data disk is full") || late.JobID != "" {
		t.Fatalf("a submission while the coordinator's disk is full: %s (want exit 75 saying the disk is full)", r)
	}
	if mid, r := f.status(st.JobID); r.code != 3 || mid.State == "completed" {
		t.Fatalf("the status while the disk is full: %s", r)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	waitLog(t, f.Coord, `restarted and writes its store again`, 30*time.Second)
	assertExact(t, f.waitDone(st.JobID, 3*time.Minute))
	f.assertNoDeadLetters()
	outputsEqualReference(t, f, st.JobID, scene, []int{1, 2, 3, 4}, small...)
	late, r = f.submit(append([]string{scene, "--frames", "5"}, small...)...)
	if r.code != 42 {
		t.Fatalf("a submission once space returned: %s", r)
	}
	assertExact(t, f.waitDone(late.JobID, 2*time.Minute))
	// The database and the streams open again, with the same statuses.
	f.Coord.Kill()
	f.restart()
	for _, job := range []string{st.JobID, late.JobID} {
		again, _ := f.status(job)
		assertExact(t, again)
	}
	t.Log("figures: tiles lost 0, promoted twice 0, frames differing 0, false dead letters 0")
}
