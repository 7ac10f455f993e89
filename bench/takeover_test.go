package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/client"
	"github.com/tilefarm/tilefarm/internal/farmtest"
	"github.com/tilefarm/tilefarm/internal/natstest"
	"github.com/tilefarm/tilefarm/internal/queue"
)

// takeOverSwitches is how many leader kills one run of BenchmarkTakeOver measures.
const takeOverSwitches = 10

// takeOverTTL is the farm's lease TTL in BenchmarkTakeOver: a dead leader's lease must expire
// before another coordinator may lead, so it is the baseline a take-over is measured against.
const takeOverTTL = 3 * time.Second

// BenchmarkTakeOver measures how long a farm of two `coordinator serve` on one JetStream goes
// without a leader when the leader is killed with kill -9 (docs/design.md, "Replication"):
// from the kill to the first tile the new leader dispatches, the tile of a job submitted at the
// kill through both addresses (the command waiting out the election). Each switch restarts the
// killed coordinator as the standby. It reports p50 and p99 in seconds and as ratios to the
// lease TTL, the baseline of the same run.
func BenchmarkTakeOver(b *testing.B) {
	var took []time.Duration
	for b.Loop() {
		took = append(took, measureTakeOver(b, takeOverSwitches)...)
	}
	reportTakeOver(b, took)
	b.Logf("take-over times over %d switches: %v", len(took), took)
}

// reportTakeOver reports p50 and p99 of took, in seconds and as ratios to the lease TTL.
func reportTakeOver(r reporter, took []time.Duration) {
	took = slices.Sorted(slices.Values(took))
	p50, p99 := took[len(took)/2], took[min(len(took)-1, len(took)*99/100)]
	r.ReportMetric(p50.Seconds(), "takeover-p50-s")
	r.ReportMetric(p99.Seconds(), "takeover-p99-s")
	r.ReportMetric(p50.Seconds()/takeOverTTL.Seconds(), "p50/lease-ttl")
	r.ReportMetric(p99.Seconds()/takeOverTTL.Seconds(), "p99/lease-ttl")
}

// measureTakeOver runs a farm of two coordinators and kills its leader switches times,
// returning each take-over time (BenchmarkTakeOver).
func measureTakeOver(b testing.TB, switches int) []time.Duration {
	bins, err := farmBinaries()
	if err != nil {
		b.Fatal(err)
	}
	ns := natstest.Start(b)
	dir := b.TempDir()
	store := "file://" + filepath.Join(dir, "store")
	var farms [2]*farmtest.Farm
	for i := range farms {
		farms[i] = &farmtest.Farm{Bins: bins, Dir: filepath.Join(dir, fmt.Sprint("logs", i)), Data: filepath.Join(dir, fmt.Sprint("data", i)),
			Store: store, NATS: ns.URL(), LogLevel: "info", ServeArgs: []string{"--lease-ttl", takeOverTTL.String()}}
		b.Cleanup(farms[i].Close)
	}
	ctx := b.Context()
	if err := farms[0].StartCoordinator(ctx); err != nil {
		b.Fatal(err)
	}
	leader := 0
	if err := waitLeads(ctx, farms[0].HTTP, time.Minute); err != nil {
		b.Fatal(err)
	}
	if err := farms[1].StartCoordinator(ctx); err != nil {
		b.Fatal(err)
	}
	nc, err := nats.Connect(ns.URL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	tilesStream, err := js.Stream(ctx, queue.StreamTiles)
	if err != nil {
		b.Fatal(err)
	}
	scene := loadBundle(b, "shot")
	cl := client.New("http://"+farms[0].HTTP+",http://"+farms[1].HTTP, "")
	if _, err := client.UploadScene(ctx, cl, scene, 0, nil); err != nil {
		b.Fatal(err)
	}
	var took []time.Duration
	frame := 0
	for range switches {
		info, err := tilesStream.Info(ctx)
		if err != nil {
			b.Fatal(err)
		}
		frame++
		killed := time.Now()
		farms[leader].Coord.Kill()
		done := make(chan error, 1)
		go func() {
			_, err := cl.SubmitUploaded(ctx, api.SubmitRequest{SceneVersion: scene.Version(), First: frame, Last: frame,
				Width: 32, Height: 18, SPP: 1, TileSize: 32, Formats: []string{"png"}})
			done <- err
		}()
		for {
			now, err := tilesStream.Info(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if now.State.LastSeq > info.State.LastSeq {
				took = append(took, time.Since(killed))
				break
			}
			if time.Since(killed) > time.Minute {
				b.Fatal("no tile dispatched within a minute of the leader's kill")
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err := <-done; err != nil {
			b.Fatalf("the submit made at the kill: %v", err)
		}
		if err := farms[leader].StartCoordinator(ctx); err != nil { // the standby now
			b.Fatal(err)
		}
		leader = 1 - leader
	}
	return took
}

// waitLeads waits until the coordinator at addr says it leads the farm.
func waitLeads(ctx context.Context, addr string, within time.Duration) error {
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/v1/workers", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			continue
		}
		var ws api.WorkersResponse
		err = json.NewDecoder(resp.Body).Decode(&ws)
		resp.Body.Close()
		if err == nil && ws.Leader != nil && ws.Leader.This {
			return nil
		}
	}
	return fmt.Errorf("the coordinator at %s does not lead within %v", addr, within)
}
