//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coordinator"
	"github.com/tilefarm/tilefarm/internal/nettest"
	"github.com/tilefarm/tilefarm/internal/queue"
)

// coordinatorOn starts another `coordinator serve` of h's farm on a host of its own, with data
// of its own: the same cluster, store, identity and flags.
func (h *hostFarm) coordinatorOn(name string) *farmProc {
	h.t.Helper()
	host := h.net.Host(name)
	f := newFarm(h.t, h.t.TempDir())
	f.client = h.client
	f.CoordHost, f.HTTP = host, host.HostPort(7070)
	f.Store, f.Env, f.NATS, f.ServeArgs = h.Store, h.Env, h.NATS, h.ServeArgs
	f.restart()
	return f
}

// hostGet reads path of the coordinator at addr from host, with the farm's token.
func hostGet(host *nettest.Host, addr, path string) ([]byte, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+hostFarmToken)
	c := host.HTTPClient()
	c.Timeout = 3 * time.Second
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// leadsFrom reports whether the coordinator at addr, asked from host, says it leads.
func leadsFrom(host *nettest.Host, addr string) bool {
	body, err := hostGet(host, addr, "/v1/workers")
	var ws api.WorkersResponse
	return err == nil && json.Unmarshal(body, &ws) == nil && ws.Leader != nil && ws.Leader.This
}

// hostMetric reads one metric of the coordinator at addr from host.
func hostMetric(t *testing.T, host *nettest.Host, addr, name string) float64 {
	t.Helper()
	body, err := hostGet(host, addr, "/metrics")
	if err != nil {
		t.Fatalf("reading the metrics of %s: %v", addr, err)
	}
	return parseMetric(t, body, name)
}

// hostDialer dials NATS from inside a host, for the test's own reads of the cluster.
type hostDialer struct{ h *nettest.Host }

func (d hostDialer) Dial(network, address string) (net.Conn, error) {
	return d.h.DialContext(context.Background(), network, address)
}

// clusterJetStream connects the test to the farm's cluster from host, as the coordinator.
func (h *hostFarm) clusterJetStream(t *testing.T, host *nettest.Host) jetstream.JetStream {
	t.Helper()
	seed, err := nats.NkeyOptionFromSeed(filepath.Join(h.creds, "coordinator.creds"))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(h.NATS, seed, nats.RootCAs(filepath.Join(h.creds, "ca.pem")), nats.SetCustomDialer(hostDialer{host}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// Property: a farm of three coordinators on hosts of their own, a 3-node cluster, MinIO and
// workers survives its leader (docs/design.md, "Replication"). While a job renders, the
// leader's host is cut from every other host: another coordinator leads within 10 s, the job
// completes exactly, frames equal to the reference, nothing dead-lettered, each tile promoted
// once and each job announced completed once; a submit made during the switch through all
// three addresses is accepted exactly once; the cut leader, asked from its own host to cancel
// the job while cut off, is refused (its write unconfirmed, rolled back: the job completes);
// healed, it writes
// nothing to the journal and follows, answering from the new leader's records. Then the new
// leader's process is killed, and the third leads and renders a job too.
func TestPartitionLeaderCutOffFailsOver(t *testing.T) {
	t.Parallel() // its own hosts and ports; it mostly waits on leases and cuts
	scene := example("shot")
	h := startHostFarm(t, hostFarmConfig{Cluster: true})
	coords := []*farmProc{h.farmProc, h.coordinatorOn("coord2"), h.coordinatorOn("coord3")}
	all := make([]string, len(coords))
	for i, c := range coords {
		all[i] = "http://" + c.HTTP
	}
	submitAll := func(addrs []string, args ...string) (api.Status, result) {
		r := runOn(t, h.client, h.Env, "coordinator", append([]string{"submit", "--json", "--server", strings.Join(addrs, ",")}, args...)...)
		var st api.Status
		if r.code != 42 && r.code != 3 && r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil || st.JobID == "" {
			t.Fatalf("submit at %v: want the job, got %s", addrs, r)
		}
		return st, r
	}
	for deadline := time.Now().Add(30 * time.Second); !leadsFrom(h.client, coords[0].HTTP); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first coordinator does not lead")
		}
	}
	slow := []string{"--fault-pass-delay", "500ms", "--passes", "16", "--checkpoint-every", "0"}
	w1, _ := h.worker("w1", slow...)
	w2, _ := h.worker("w2", slow...)
	st, _ := submitAll(all, append([]string{scene, "--frames", "1-2"}, small...)...)
	waitCheckpoint(t, w1, 2)
	if mid, _ := coords[1].status(st.JobID); mid.State == "completed" || mid.TilesTotal == 0 {
		t.Fatalf("before the cut, a standby's status: %+v (completed: the cut would hit nothing)", mid)
	}

	h.net.Isolate(h.coord)
	cut := time.Now()
	// The cut leader, asked on its own host before its lease has run out to cancel the job,
	// cannot record it; and during the switch a submit goes to the cut address first, the
	// command going on until a coordinator leads.
	refusedDone := make(chan result, 1)
	go func() {
		refusedDone <- runOn(t, h.coord, h.Env, "coordinator", "cancel", st.JobID, "--server", all[0])
	}()
	second := append([]string{scene, "--frames", "3"}, small...)
	type submitted struct {
		st api.Status
		r  result
	}
	secondDone := make(chan submitted, 1)
	go func() {
		r := runOn(t, h.client, h.Env, "coordinator", append([]string{"submit", "--json", "--server", strings.Join(all, ",")}, second...)...)
		var st api.Status
		_ = json.Unmarshal([]byte(r.stdout), &st)
		secondDone <- submitted{st, r}
	}()
	var leader *farmProc
	for leader == nil {
		for _, c := range coords[1:] {
			if leadsFrom(h.client, c.HTTP) {
				leader = c
			}
		}
		if leader == nil && time.Since(cut) > 10*time.Second {
			t.Fatalf("no coordinator leads 10 s after the leader's host was cut")
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("a new leader at %s %v after the cut", leader.HTTP, time.Since(cut).Round(time.Millisecond))
	s2 := <-secondDone
	st2 := s2.st
	if s2.r.code != 42 && s2.r.code != 3 || st2.JobID == "" {
		t.Fatalf("the submit made during the switch: %s", s2.r)
	}
	refused := <-refusedDone
	if refused.code != 75 {
		t.Fatalf("the cut leader asked to cancel the job: want exit 75, got %s", refused)
	}
	if n := hostMetric(t, h.coord, coords[0].HTTP, "tilefarm_coordinator_journal_refusals_total"); n < 1 {
		t.Fatalf("the cut leader's write was never refused: %v refusals; the cancel: %s", n, refused)
	}
	if again, _ := submitAll(all[1:], second...); again.JobID != st2.JobID {
		t.Fatalf("the submission made during the switch made a second job: %s and %s", st2.JobID, again.JobID)
	}
	for _, job := range []string{st.JobID, st2.JobID} {
		assertExact(t, leader.waitDone(job, 3*time.Minute))
	}
	if n, want := promotions(w1, w2), 3*6; n != want {
		t.Fatalf("%d promotions for %d tiles", n, want)
	}
	leader.assertNoDeadLetters()
	var jobs []map[string]any
	if r := leader.cli("jobs", "--json"); r.code != 0 || json.Unmarshal([]byte(r.stdout), &jobs) != nil || len(jobs) != 2 {
		t.Fatalf("jobs: want the two submitted, got %s", r)
	}
	outputsEqualReference(t, leader, st.JobID, scene, []int{1, 2}, small...)
	outputsEqualReference(t, leader, st2.JobID, scene, []int{3}, small...)

	// Healed, the old leader follows: the job it never saw is completed in its own records.
	h.net.Rejoin(h.coord)
	if done := coords[0].waitDone(st2.JobID, time.Minute); done.State != "completed" {
		t.Fatalf("the healed leader does not follow: %+v", done)
	}
	if leadsFrom(h.client, coords[0].HTTP) {
		t.Fatal("the healed leader leads again beside the new one")
	}
	js := h.clusterJetStream(t, h.client)
	writers := journalWritersOf(t, js)
	ids := make([]string, len(coords))
	for i, c := range coords {
		ids[i] = coordinatorID(t, c)
	}
	newID := ids[slices.Index(coords, leader)]
	first := slices.Index(writers, newID)
	if first < 0 || slices.Contains(writers[first:], ids[0]) {
		t.Fatalf("the journal after the new leader's first entry holds the old leader's: %v (old %s, new %s)", writers, ids[0], newID)
	}
	notify, err := js.Stream(t.Context(), queue.StreamNotify)
	if err != nil {
		t.Fatal(err)
	}
	info, err := notify.Info(t.Context(), jetstream.WithSubjectFilter("notify.>"))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{st.JobID, st2.JobID} {
		if n := info.State.Subjects["notify.job.completed."+id]; n != 1 {
			t.Fatalf("job %s announced completed %d times: %v", id, n, info.State.Subjects)
		}
	}

	// The new leader's process killed: the third coordinator, or the healed first, leads.
	leader.Coord.Kill()
	killed := time.Now()
	st3, _ := submitAll(all, append([]string{scene, "--frames", "4"}, small...)...)
	var next *farmProc
	for _, c := range coords {
		if c != leader && leadsFrom(h.client, c.HTTP) {
			next = c
		}
	}
	if next == nil {
		t.Fatal("after the kill, the submit was accepted but no coordinator leads")
	}
	t.Logf("after the kill, %s leads; the submit made at the kill took %v", next.HTTP, time.Since(killed).Round(time.Millisecond))
	assertExact(t, next.waitDone(st3.JobID, 3*time.Minute))
	outputsEqualReference(t, next, st3.JobID, scene, []int{4}, small...)
	next.assertNoDeadLetters()
	t.Log("figures: tiles lost 0, promoted twice 0, frames differing 0, false dead letters 0")
}

// journalWritersOf reads the farm's journal through js: the writer of every entry, in order.
func journalWritersOf(t *testing.T, js jetstream.JetStream) []string {
	t.Helper()
	ctx := t.Context()
	s, err := js.Stream(ctx, queue.StreamJournal)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var writers []string
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && seq > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("journal entry %d: %v", seq, err)
		}
		writers = append(writers, m.Header.Get(coordinator.HeaderJournalWriter))
	}
	return writers
}
