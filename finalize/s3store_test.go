package finalize

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/tilefarm/tilefarm/internal/miniotest"
	"github.com/tilefarm/tilefarm/objstore"
)

func TestS3StoreConformance(t *testing.T) {
	t.Parallel() // a store of its own
	srv := miniotest.Start(t)
	var n atomic.Int32
	testStoreConformance(t, func(t *testing.T) objstore.Store {
		bucket := fmt.Sprintf("conformance-%d", n.Add(1))
		s, err := objstore.NewS3Store(context.Background(), srv.Endpoint, bucket, false, srv.AccessKey, srv.SecretKey)
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
	t.Parallel() // a store of its own
	c := miniotest.StartCluster(t, 4)
	var n atomic.Int32
	newStore := func(t *testing.T) objstore.Store {
		bucket := fmt.Sprintf("conformance-%d", n.Add(1))
		s, err := objstore.NewS3Store(context.Background(), c.Endpoint, bucket, false, c.AccessKey, c.SecretKey)
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
	spare := make(chan objstore.Store, 16)
	for range cap(spare) {
		spare <- newStore(t)
	}
	fromSpare := func(t *testing.T) objstore.Store {
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
			if _, err := objstore.NewS3Store(ctx, c.Endpoint, "created-with-a-node-down", false, c.AccessKey, c.SecretKey); err != nil {
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
			if err := s.PutIfAbsent(ctx, "k/created", []byte("again")); !errors.Is(err, objstore.ErrExists) || objstore.IsRetryable(err) {
				t.Fatalf("second PutIfAbsent = %v, want terminal ErrExists", err)
			}
			if err := s.PutIfAbsent(ctx, "before/kill", []byte("again")); !errors.Is(err, objstore.ErrExists) {
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
				if _, err := s.Get(ctx, k); !errors.Is(err, objstore.ErrNotFound) || objstore.IsRetryable(err) {
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
