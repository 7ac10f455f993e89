package miniotest_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/miniotest"
	"github.com/tilefarm/tilefarm/objstore"
)

// TestClusterSurvivesANodeKill: a 4-node erasure-coded cluster keeps serving
// reads and writes through node 0 with another node killed (SIGKILL), and once
// that node is restarted an object written while it was down reads back
// through it, from its peers' drives.
func TestClusterSurvivesANodeKill(t *testing.T) {
	start := time.Now()
	c := miniotest.StartCluster(t, 4)
	t.Logf("StartCluster took %v", time.Since(start))
	if c.Len() != 4 || c.Endpoint != c.Node(0).Endpoint || c.URL() != c.Node(0).URL() ||
		c.URL() != "s3+http://"+c.Endpoint+"/"+c.Bucket {
		t.Fatalf("cluster of %d, endpoint %q, URL %q, node 0 %q", c.Len(), c.Endpoint, c.URL(), c.Node(0).Endpoint)
	}
	seen := map[string]bool{}
	for i := range c.Len() {
		n := c.Node(i)
		if !strings.HasPrefix(n.Endpoint, "127.0.0.1:") || seen[n.Endpoint] || seen[n.DataDir()] || !n.Running() {
			t.Fatalf("node %d: endpoint %q, data %q, running %v", i, n.Endpoint, n.DataDir(), n.Running())
		}
		seen[n.Endpoint], seen[n.DataDir()] = true, true
	}
	for _, kv := range c.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	ctx := context.Background()
	s, err := objstore.OpenStore(ctx, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutIfAbsent(ctx, "before/kill", []byte("written by all four")); err != nil {
		t.Fatal(err)
	}
	// An erasure-coded object has a shard (and its metadata) on every drive it
	// was written to: at least the write quorum, 3 of 4 (a drive a loaded node
	// answers too slowly for is healed later).
	if n := drivesHolding(c, "before/kill"); n < 3 {
		t.Fatalf("an object written with all nodes up is on %d drives, want at least 3", n)
	}

	victim := c.Node(2)
	endpoint := victim.Endpoint
	victim.Kill()
	if victim.Running() {
		t.Fatal("node 2 still runs after Kill")
	}
	direct, err := objstore.OpenStore(ctx, victim.URL())
	if err == nil {
		if _, err = direct.Get(ctx, "before/kill"); err == nil {
			t.Fatal("the killed node still answered")
		}
	}

	start = time.Now()
	if err := s.Put(ctx, "during/outage", []byte("written with node 2 down")); err != nil {
		t.Fatalf("Put with one node down: %v", err)
	}
	if err := s.PutIfAbsent(ctx, "during/outage", []byte("again")); !errors.Is(err, objstore.ErrExists) {
		t.Fatalf("PutIfAbsent over an existing key with one node down = %v, want ErrExists", err)
	}
	if got, err := s.Get(ctx, "before/kill"); err != nil || string(got) != "written by all four" {
		t.Fatalf("Get with one node down = %q, %v", got, err)
	}
	if objs, err := s.List(ctx, ""); err != nil || len(objs) != 2 {
		t.Fatalf("List with one node down = %v, %v", objs, err)
	}
	t.Logf("writes and reads with a node down took %v", time.Since(start))
	// With one drive gone, write quorum takes every live one.
	if hasObject(victim, c.Bucket, "during/outage") || drivesHolding(c, "during/outage") != 3 {
		t.Fatal("the object written with node 2 down is not on exactly the three live drives")
	}

	start = time.Now()
	victim.Restart(t)
	t.Logf("Restart took %v", time.Since(start))
	if victim.Endpoint != endpoint || !victim.Running() {
		t.Fatalf("restart moved node 2 from %s to %s (running %v)", endpoint, victim.Endpoint, victim.Running())
	}
	fromVictim, err := objstore.OpenStore(ctx, victim.URL())
	if err != nil {
		t.Fatal(err)
	}
	if got, err := fromVictim.Get(ctx, "during/outage"); err != nil || string(got) != "written with node 2 down" {
		t.Fatalf("Get through the restarted node of an object written while it was down = %q, %v", got, err)
	}
	if err := fromVictim.PutIfAbsent(ctx, "during/outage", []byte("again")); !errors.Is(err, objstore.ErrExists) {
		t.Fatalf("PutIfAbsent through the restarted node = %v, want ErrExists", err)
	}
	if err := fromVictim.Put(ctx, "after/restart", []byte("through node 2")); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, "after/restart"); err != nil || string(got) != "through node 2" {
		t.Fatalf("Get through node 0 of an object written through the restarted node = %q, %v", got, err)
	}
}

// drivesHolding counts the nodes whose drive holds MinIO's metadata of key in the cluster's bucket.
func drivesHolding(c *miniotest.Cluster, key string) int {
	n := 0
	for i := range c.Len() {
		if hasObject(c.Node(i), c.Bucket, key) {
			n++
		}
	}
	return n
}

// hasObject reports whether node's drive holds MinIO's metadata of bucket/key.
func hasObject(n *miniotest.Node, bucket, key string) bool {
	_, err := os.Stat(filepath.Join(n.DataDir(), bucket, filepath.FromSlash(key), "xl.meta"))
	return err == nil
}
