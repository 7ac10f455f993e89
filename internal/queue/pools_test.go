package queue

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Property: a pool's tiles reach only the workers it serves, through consumers the workers
// find by listing; the pool of any worker keeps the plain subjects; and a job's own pool
// holds at most its slots of tiles unacknowledged at once.
func TestPoolsRouteAndLimit(t *testing.T) {
	t.Parallel()
	cfg := fastConfig()
	cfg.AckWait = 20 * time.Second // a held tile stays held for the test
	tf := startFarm(t, cfg)
	ctx := testCtx(t)
	gpu := Pool{Requires: []string{"gpu"}}
	limited := Pool{Job: "job-1", Slots: 1}
	for _, p := range []Pool{gpu, limited} {
		if err := tf.f.EnsurePool(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	if (Pool{}).Subject(BandNormal) != SubjectRender || (Pool{}).AssembleSubject() != SubjectAssemble {
		t.Fatalf("the pool of any worker moved off the plain subjects")
	}
	if gpu.Subject(BandHigh) == limited.Subject(BandHigh) || gpu.Consumer(BandLow) == (Pool{}).Consumer(BandLow) {
		t.Fatalf("pools share a subject or consumer")
	}
	for _, m := range []struct {
		subject, id string
	}{{gpu.Subject(BandNormal), "gpu-1"}, {limited.Subject(BandHigh), "lim-1"}, {limited.Subject(BandHigh), "lim-2"}} {
		if _, err := tf.f.Publish(ctx, m.subject, m.id, []byte(m.id), nil); err != nil {
			t.Fatal(err)
		}
	}
	plain := tf.f.Sources(Capabilities{Builds: []string{"blender/x"}})
	tagged := tf.f.Sources(Capabilities{Tags: []string{"gpu", "highmem"}})

	// A worker without the tag takes the limited pool's tiles, one at a time, never the gpu tile.
	m := mustFetchFrom(t, plain)
	if string(m.Data()) != "lim-1" {
		t.Fatalf("plain worker fetched %q first, want lim-1", m.Data())
	}
	if other, err := plain.FetchTile(ctx, 500*time.Millisecond); other != nil || err != nil {
		t.Fatalf("a second tile of a 1-slot pool was delivered while the first is held (%v): %s", err, other.Data())
	}
	if err := m.Ack(); err != nil {
		t.Fatal(err)
	}
	if m := mustFetchFrom(t, plain); string(m.Data()) != "lim-2" {
		t.Fatalf("plain worker fetched %q after the ack, want lim-2", m.Data())
	} else if err := m.Ack(); err != nil {
		t.Fatal(err)
	}
	if other, err := plain.FetchTile(ctx, 500*time.Millisecond); other != nil || err != nil {
		t.Fatalf("a worker without the tag was given %v (%v)", other, err)
	}
	if m := mustFetchFrom(t, tagged); string(m.Data()) != "gpu-1" {
		t.Fatalf("tagged worker fetched %q, want gpu-1", m.Data())
	}

	// A worker learning its capabilities later serves its pools from the next pull on.
	late := tf.f.Sources(Capabilities{})
	if _, err := tf.f.Publish(ctx, gpu.Subject(BandLow), "gpu-2", []byte("gpu-2"), nil); err != nil {
		t.Fatal(err)
	}
	if other, err := late.FetchTile(ctx, 300*time.Millisecond); other != nil || err != nil {
		t.Fatalf("a worker of no tags was given %v (%v)", other, err)
	}
	late.SetCapabilities(Capabilities{Tags: []string{"gpu"}})
	if m := mustFetchFrom(t, late); string(m.Data()) != "gpu-2" {
		t.Fatalf("worker with its tags known fetched %q, want gpu-2", m.Data())
	}
}

func TestPoolServes(t *testing.T) {
	caps := Capabilities{Builds: []string{"blender/3.4.1 a"}, Tags: []string{"gpu", "highmem"}}
	for _, c := range []struct {
		p    Pool
		want bool
	}{
		{Pool{}, true},
		{Pool{Build: "blender/3.4.1 a"}, true},
		{Pool{Build: "blender/3.4.1 b"}, false},
		{Pool{Requires: []string{"gpu"}}, true},
		{Pool{Requires: []string{"gpu", "highmem"}, Build: "blender/3.4.1 a"}, true},
		{Pool{Requires: []string{"gpu", "ssd"}}, false},
		{Pool{Job: "j", Slots: 2}, true},
	} {
		if got := c.p.Serves(caps); got != c.want {
			t.Errorf("%+v.Serves = %v, want %v", c.p, got, c.want)
		}
	}
}

// mustFetchFrom takes one tile from s within a few seconds.
func mustFetchFrom(t *testing.T, s *Sources) interface {
	Data() []byte
	Ack() error
} {
	t.Helper()
	m, err := s.FetchTile(testCtx(t), 3*time.Second)
	if err != nil || m == nil {
		t.Fatalf("FetchTile = %v, %v", m, err)
	}
	return m
}

// Every TILES consumer lets a large fleet keep its pulls waiting (maxWaiting, not the
// server's default of 512, which refuses the 513th), and a farm whose consumers were made
// with the default opens again unchanged, since the server never lets MaxWaiting change.
func TestConsumersKeepAFleetsPullsWaiting(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	tf := startFarm(t, fastConfig())
	gpu := Pool{Requires: []string{"gpu"}}
	if err := tf.f.EnsurePool(ctx, gpu); err != nil {
		t.Fatalf("EnsurePool: %v", err)
	}
	for _, name := range []string{BandNormal.Consumer(), ConsumerAssemblers, gpu.Consumer(BandHigh)} {
		c, err := tf.f.Tiles.Consumer(ctx, name)
		if err != nil {
			t.Fatalf("consumer %s: %v", name, err)
		}
		if got := c.CachedInfo().Config.MaxWaiting; got != maxWaiting {
			t.Errorf("consumer %s MaxWaiting = %d, want %d", name, got, maxWaiting)
		}
	}

	// An older farm: its consumers made with the server's default.
	old := tf.f.Cfg.consumerConfig(BandLow.Consumer(), BandLow.Subject(), "old", Pool{}, maxAckPending)
	old.MaxWaiting = 0
	if err := tf.f.JS.DeleteConsumer(ctx, StreamTiles, old.Durable); err != nil {
		t.Fatalf("DeleteConsumer: %v", err)
	}
	if _, err := tf.f.JS.CreateConsumer(ctx, StreamTiles, old); err != nil {
		t.Fatalf("CreateConsumer: %v", err)
	}
	if _, err := Setup(ctx, tf.f.JS, fastConfig()); err != nil {
		t.Fatalf("Setup of a farm whose consumer has the default MaxWaiting: %v", err)
	}
	c, err := tf.f.Tiles.Consumer(ctx, old.Durable)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.CachedInfo().Config.MaxWaiting; got != 512 {
		t.Errorf("older consumer's MaxWaiting = %d after Setup, want the 512 it was made with", got)
	}
}

// Property: a retired pool leaves nothing to poll. Its tile consumers and queued tiles go, its
// assemblers stay; a worker that still pulls from its consumers gets nothing and no error, and
// forgets them, so what it polls does not grow with retired pools; EnsurePool makes it anew.
func TestRetiredPoolsAreNotPolled(t *testing.T) {
	t.Parallel()
	tf := startFarm(t, fastConfig())
	ctx := testCtx(t)
	var pools []Pool
	for _, job := range []string{"job-1", "job-2", "job-3"} {
		p := Pool{Job: job, Slots: 1}
		if err := tf.f.EnsurePool(ctx, p); err != nil {
			t.Fatal(err)
		}
		pools = append(pools, p)
	}
	if _, err := tf.f.Publish(ctx, pools[0].Subject(BandNormal), "stale", []byte("stale"), nil); err != nil {
		t.Fatal(err)
	}
	w := tf.f.Sources(Capabilities{})
	w.refresh(ctx)
	if n := len(w.snapshotTiles()); n != 4*int(NumBands) {
		t.Fatalf("a worker polls %d tile consumers, want the default pool's and three pools' %d", n, 4*int(NumBands))
	}
	if listed, err := tf.f.TilePools(ctx); err != nil || len(listed) != 3 {
		t.Fatalf("TilePools = %v, %v; want the three", listed, err)
	}
	for _, p := range pools {
		if err := tf.f.RetirePool(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	// Pulls from the consumers it knows: nothing, and no error.
	for range 3 {
		if m, err := w.FetchTile(ctx, 300*time.Millisecond); m != nil || err != nil {
			t.Fatalf("FetchTile after the pools were retired = %v, %v", m, err)
		}
	}
	w.mu.Lock()
	w.refreshed = time.Time{}
	w.mu.Unlock()
	w.refresh(ctx)
	if n := len(w.snapshotTiles()); n != int(NumBands) {
		t.Fatalf("after the pools were retired a worker polls %d tile consumers, want the default pool's %d", n, NumBands)
	}
	for name := range w.known {
		if strings.HasPrefix(name, ConsumerWorkers+"-p") {
			t.Fatalf("a worker still knows the retired consumer %s", name)
		}
	}
	if depth, _, err := tf.f.Depth(ctx); err != nil || depth != 0 {
		t.Fatalf("TILES holds %d messages after the retirement (%v): a stale tile nothing delivers", depth, err)
	}
	if listed, err := tf.f.TilePools(ctx); err != nil || len(listed) != 0 {
		t.Fatalf("TilePools after retiring = %v, %v", listed, err)
	}
	if _, err := tf.f.JS.Consumer(ctx, StreamTiles, pools[0].assemblers()); err != nil {
		t.Fatalf("the assemblers of a retired pool went too: %v", err)
	}
	if err := tf.f.EnsurePool(ctx, pools[0]); err != nil {
		t.Fatal(err)
	}
	if listed, err := tf.f.TilePools(ctx); err != nil || len(listed) != 1 {
		t.Fatalf("EnsurePool after retiring made %v, %v; want the pool again", listed, err)
	}
}

// snapshotTiles is every tile consumer the worker would pull from now.
func (s *Sources) snapshotTiles() []jetstream.Consumer {
	tiles, _ := s.snapshot()
	var out []jetstream.Consumer
	for b := range NumBands {
		out = append(out, tiles[b]...)
	}
	return out
}

// Property: a pool with a tile held by a worker is not retired: the held tile may be the one
// copy a redelivery must reach if its worker dies.
func TestPoolWithAHeldTileIsNotRetired(t *testing.T) {
	t.Parallel()
	cfg := fastConfig()
	cfg.AckWait = 20 * time.Second
	tf := startFarm(t, cfg)
	ctx := testCtx(t)
	p := Pool{Job: "job-1", Slots: 2}
	if err := tf.f.EnsurePool(ctx, p); err != nil {
		t.Fatal(err)
	}
	if _, err := tf.f.Publish(ctx, p.Subject(BandNormal), "held", []byte("held"), nil); err != nil {
		t.Fatal(err)
	}
	m := mustFetchFrom(t, tf.f.Sources(Capabilities{}))
	if err := tf.f.RetirePool(ctx, p); !errors.Is(err, ErrPoolBusy) {
		t.Fatalf("RetirePool with a tile held = %v, want ErrPoolBusy", err)
	}
	if listed, err := tf.f.TilePools(ctx); err != nil || len(listed) != 1 {
		t.Fatalf("TilePools = %v, %v; want the pool kept", listed, err)
	}
	if err := m.Ack(); err != nil {
		t.Fatal(err)
	}
	if err := tf.f.RetirePool(ctx, p); err != nil {
		t.Fatalf("RetirePool once the tile was acked: %v", err)
	}
}

// Property: a worker sharing the coordinator's Queue (an in-process worker) pulls the first tile
// of a pool made after it last listed the pools at once, not a listing period later.
func TestPoolMadeOnTheSameQueueIsServedAtOnce(t *testing.T) {
	t.Parallel()
	tf := startFarm(t, fastConfig())
	ctx := testCtx(t)
	src := tf.f.Sources(Capabilities{Builds: []string{"blender/x"}})
	if m, err := src.FetchTile(ctx, 100*time.Millisecond); m != nil || err != nil {
		t.Fatalf("an empty farm delivered %v (%v)", m, err)
	}
	p := Pool{Build: "blender/x"}
	if err := tf.f.EnsurePool(ctx, p); err != nil {
		t.Fatal(err)
	}
	if _, err := tf.f.Publish(ctx, p.Subject(BandNormal), "b-1", []byte("b-1"), nil); err != nil {
		t.Fatal(err)
	}
	// Well within sourcesRefresh of the first listing: only the count of pools made lists again.
	m, err := src.FetchTile(ctx, 200*time.Millisecond)
	if err != nil || m == nil {
		t.Fatalf("the new pool's tile was not delivered on the next pull (%v)", err)
	}
	if string(m.Data()) != "b-1" {
		t.Fatalf("fetched %q, want b-1", m.Data())
	}
	if err := m.Ack(); err != nil {
		t.Fatal(err)
	}
}
