package farmbench

import (
	"context"
	"testing"

	"github.com/tilefarm/tilefarm/internal/miniotest"
	"github.com/tilefarm/tilefarm/objstore"
)

// MinIO's own counters count the farm's requests: two PUTs and a GET made through the store
// read, once its cache of them is fresh, as two putobject and one getobject more, and per tile
// as their sum over the tiles.
func TestMinIORequestsCountsTheStoresRequests(t *testing.T) {
	t.Parallel() // a farm and directory of its own; no figure is held to a value
	srv := miniotest.Start(t)
	ctx := context.Background()
	s, err := objstore.NewS3Store(ctx, srv.Endpoint, srv.Bucket, false, srv.AccessKey, srv.SecretKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "warm", []byte("x")); err != nil { // the counters exist once used
		t.Fatal(err)
	}
	before, err := SettledMinIORequests(ctx, srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b"} {
		if err := s.Put(ctx, k, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Get(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	after, err := SettledMinIORequests(ctx, srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	if d := after["putobject"] - before["putobject"]; d != 2 {
		t.Fatalf("putobject counted %v more, want 2 (%v -> %v)", d, before, after)
	}
	if d := after["getobject"] - before["getobject"]; d != 1 {
		t.Fatalf("getobject counted %v more, want 1 (%v -> %v)", d, before, after)
	}
	if per, by := requestsPerTile(before, after, 3); per != 1 || by["putobject"] != 2.0/3 {
		t.Fatalf("per tile: %v %v, want 1 in all and 2/3 putobject", per, by)
	}
}
