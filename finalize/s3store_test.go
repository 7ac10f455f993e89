package finalize

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/miniotest"
)

func TestS3StoreConformance(t *testing.T) {
	srv := miniotest.Start(t)
	var n atomic.Int32
	testStoreConformance(t, func(t *testing.T) Store {
		bucket := fmt.Sprintf("conformance-%d", n.Add(1))
		s, err := NewS3Store(context.Background(), srv.Endpoint, bucket, false, srv.AccessKey, srv.SecretKey)
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// TestS3ClusterConformance runs the conformance suite through node 0 of a
// distributed, erasure-coded 4-node MinIO, with every node up and again with
// node 3 killed (SIGKILL): one node down keeps write quorum (3 of 4 drives), so
// every operation and the finalization protocol on top must still hold.
func TestS3ClusterConformance(t *testing.T) {
	c := miniotest.StartCluster(t, 4)
	var n atomic.Int32
	newStore := func(t *testing.T) Store {
		bucket := fmt.Sprintf("conformance-%d", n.Add(1))
		s, err := NewS3Store(context.Background(), c.Endpoint, bucket, false, c.AccessKey, c.SecretKey)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	t.Run("AllNodesUp", func(t *testing.T) { testStoreConformance(t, newStore) })

	ctx := context.Background()
	s := newStore(t)
	if err := s.Put(ctx, "before/kill", []byte("written with all nodes up")); err != nil {
		t.Fatal(err)
	}
	// Creating a bucket waits about a second for the dead node, so the suite
	// with a node down takes empty buckets made beforehand (and makes more if
	// it runs out); Operations creates one with the node down.
	spare := make(chan Store, 16)
	for range cap(spare) {
		spare <- newStore(t)
	}
	fromSpare := func(t *testing.T) Store {
		select {
		case s := <-spare:
			return s
		default:
			return newStore(t)
		}
	}
	victim := c.Node(3)
	victim.Kill()
	t.Run("NodeKilled", func(t *testing.T) {
		t.Run("Operations", func(t *testing.T) {
			if _, err := NewS3Store(ctx, c.Endpoint, "created-with-a-node-down", false, c.AccessKey, c.SecretKey); err != nil {
				t.Fatalf("creating a bucket: %v", err)
			}
			if got, err := s.Get(ctx, "before/kill"); err != nil || string(got) != "written with all nodes up" {
				t.Fatalf("Get of an object written before the kill = %q, %v", got, err)
			}
			if err := s.Put(ctx, "k/put", []byte("first")); err != nil {
				t.Fatalf("Put: %v", err)
			}
			if err := s.Put(ctx, "k/put", []byte("replaced")); err != nil {
				t.Fatalf("Put over an existing key: %v", err)
			}
			if err := s.PutIfAbsent(ctx, "k/created", []byte("created")); err != nil {
				t.Fatalf("PutIfAbsent: %v", err)
			}
			if err := s.PutIfAbsent(ctx, "k/created", []byte("again")); !errors.Is(err, ErrExists) || IsRetryable(err) {
				t.Fatalf("second PutIfAbsent = %v, want terminal ErrExists", err)
			}
			if err := s.PutIfAbsent(ctx, "before/kill", []byte("again")); !errors.Is(err, ErrExists) {
				t.Fatalf("PutIfAbsent over an object written before the kill = %v, want ErrExists", err)
			}
			for k, want := range map[string]string{"k/put": "replaced", "k/created": "created"} {
				if got, err := s.Get(ctx, k); err != nil || string(got) != want {
					t.Fatalf("Get(%q) = %q, %v; want %q", k, got, err, want)
				}
			}
			if objs, err := s.List(ctx, "k/"); err != nil || len(objs) != 2 || objs[0].Key != "k/created" || objs[1].Key != "k/put" {
				t.Fatalf("List = %v, %v; want k/created, k/put", objs, err)
			}
			for _, k := range []string{"k/put", "before/kill"} {
				if err := s.Delete(ctx, k); err != nil {
					t.Fatalf("Delete(%q): %v", k, err)
				}
				if _, err := s.Get(ctx, k); !errors.Is(err, ErrNotFound) || IsRetryable(err) {
					t.Fatalf("Get(%q) after Delete = %v, want terminal ErrNotFound", k, err)
				}
			}
			if objs, err := s.List(ctx, ""); err != nil || len(objs) != 1 || objs[0].Key != "k/created" {
				t.Fatalf("List after deletes = %v, %v; want k/created alone", objs, err)
			}
		})
		testStoreConformance(t, fromSpare)
	})
	if victim.Running() {
		t.Fatal("the killed node came back by itself")
	}
}

// TestS3StoreOpenAndOutage opens the store through its URL, then checks that
// errors during an outage are retryable, carry no secret, and that the data
// is back after the server restarts.
func TestS3StoreOpenAndOutage(t *testing.T) {
	srv := miniotest.Start(t)
	ctx := context.Background()
	env := envOf(srv.Env())
	s, err := openStore(ctx, srv.URL(), env)
	if err != nil {
		t.Fatal(err)
	}
	// Opening again finds the bucket that the first open created.
	if _, err := openStore(ctx, srv.URL(), env); err != nil {
		t.Fatalf("second open: %v", err)
	}
	p, err := Promote(ctx, s, "tiles/outage", "att-1", "b", []Output{{"rgb", []byte("survives")}}, nil)
	if err != nil {
		t.Fatal(err)
	}

	srv.Stop(t)
	opCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	_, err = s.Get(opCtx, "attempts/tiles/outage/att-1/rgb")
	if err == nil || !IsRetryable(err) || errors.Is(err, ErrNotFound) {
		t.Fatalf("Get during outage = %v (retryable %v), want a retryable error", err, IsRetryable(err))
	}
	_, err = Promote(opCtx, s, "tiles/other", "att-1", "b", []Output{{"rgb", []byte("x")}}, nil)
	if err == nil || !IsRetryable(err) {
		t.Fatalf("Promote during outage = %v, want a retryable error", err)
	}
	if _, err := openStore(opCtx, srv.URL(), env); err == nil || !IsRetryable(err) || strings.Contains(err.Error(), srv.SecretKey) {
		t.Fatalf("OpenStore during outage = %v, want a retryable error without the secret", err)
	}

	srv.Restart(t)
	m, err := ReadManifest(ctx, s, "tiles/outage")
	if err != nil {
		t.Fatalf("after restart: %v", err)
	}
	if got, err := ReadObject(ctx, s, m, "rgb"); err != nil || string(got) != "survives" || m.Checksum() != p.Manifest.Checksum() {
		t.Fatalf("after restart ReadObject = %q, %v", got, err)
	}
	if ok, err := ManifestExists(ctx, s, "tiles/other"); err != nil || ok {
		t.Fatalf("failed promotion left a manifest: %v, %v", ok, err)
	}

	// Wrong credentials: a terminal error that does not echo the secret.
	const wrongSecret = "not-the-secret-0123456789"
	_, err = NewS3Store(ctx, srv.Endpoint, "other", false, srv.AccessKey, wrongSecret)
	if err == nil || IsRetryable(err) || strings.Contains(err.Error(), wrongSecret) || strings.Contains(err.Error(), srv.SecretKey) {
		t.Fatalf("wrong secret = %v (retryable %v), want a terminal error without secrets", err, IsRetryable(err))
	}
}

// envOf turns KEY=VALUE pairs into a getenv function.
func envOf(kv []string) func(string) string {
	m := map[string]string{}
	for _, e := range kv {
		k, v, _ := strings.Cut(e, "=")
		m[k] = v
	}
	return func(k string) string { return m[k] }
}
