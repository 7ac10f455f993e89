package finalize

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/tilefarm/tilefarm/objstore"
	"strings"
	"sync"
	"testing"
	"time"
)

// raceRounds is how many times the racing-promotion tests repeat.
func raceRounds() int {
	if testing.Short() {
		return 8
	}
	return 20
}

// testStoreConformance is the one suite every Store implementation must pass:
// object semantics, create-if-absent, and the finalization protocol on top.
// newStore must return an empty, independent store on each call.
func testStoreConformance(t *testing.T, newStore func(t *testing.T) objstore.Store) {
	t.Run("PutGetStatListDelete", func(t *testing.T) {
		ctx := context.Background()
		s := newStore(t)
		objs := map[string]string{
			"a/b/one":   "first",
			"a/b/two":   "second object",
			"a/bc/x":    "sibling with a longer segment",
			"a/empty":   "",
			"top-level": "t",
		}
		for k, v := range objs {
			if err := s.Put(ctx, k, []byte(v)); err != nil {
				t.Fatalf("Put(%q): %v", k, err)
			}
		}
		for k, v := range objs {
			got, err := s.Get(ctx, k)
			if err != nil || string(got) != v {
				t.Fatalf("Get(%q) = %q, %v; want %q", k, got, err, v)
			}
			info, err := s.Stat(ctx, k)
			if err != nil || info.Key != k || info.Size != int64(len(v)) || info.ModTime.IsZero() {
				t.Fatalf("Stat(%q) = %+v, %v", k, info, err)
			}
		}
		if err := s.Put(ctx, "a/b/one", []byte("replaced")); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.Get(ctx, "a/b/one"); string(got) != "replaced" {
			t.Fatalf("after overwrite Get = %q", got)
		}

		listCases := map[string][]string{
			"":      {"a/b/one", "a/b/two", "a/bc/x", "a/empty", "top-level"},
			"a/":    {"a/b/one", "a/b/two", "a/bc/x", "a/empty"},
			"a/b/":  {"a/b/one", "a/b/two"},
			"a/b":   {"a/b/one", "a/b/two", "a/bc/x"},
			"a/b/t": {"a/b/two"},
			"nope/": nil,
			"a/zz":  nil,
		}
		for prefix, want := range listCases {
			got, err := s.List(ctx, prefix)
			if err != nil {
				t.Fatalf("List(%q): %v", prefix, err)
			}
			var keys []string
			for _, o := range got {
				keys = append(keys, o.Key)
				if o.Size != int64(len(objs[o.Key])) && o.Key != "a/b/one" {
					t.Errorf("List(%q): %s size %d", prefix, o.Key, o.Size)
				}
			}
			if strings.Join(keys, ",") != strings.Join(want, ",") {
				t.Errorf("List(%q) = %v, want %v", prefix, keys, want)
			}
		}

		if err := s.Delete(ctx, "a/b/two"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(ctx, "a/b/two"); !errors.Is(err, objstore.ErrNotFound) {
			t.Fatalf("Get after Delete: %v, want ErrNotFound", err)
		}
		if _, err := s.Stat(ctx, "a/b/two"); !errors.Is(err, objstore.ErrNotFound) {
			t.Fatalf("Stat after Delete: %v, want ErrNotFound", err)
		}
		if err := s.Delete(ctx, "a/b/two"); err != nil {
			t.Fatalf("Delete of a missing key: %v", err)
		}
		if _, err := s.Get(ctx, "a/b"); !errors.Is(err, objstore.ErrNotFound) {
			t.Fatalf("Get of a key prefix: %v, want ErrNotFound", err)
		}
		if _, err := s.Get(ctx, "never/written"); !errors.Is(err, objstore.ErrNotFound) || objstore.IsRetryable(err) {
			t.Fatalf("Get missing: %v (retryable %v), want terminal ErrNotFound", err, objstore.IsRetryable(err))
		}
	})

	t.Run("BadKeys", func(t *testing.T) {
		ctx := context.Background()
		s := newStore(t)
		for _, k := range []string{"", "/abs", "a/../b", "..", "a//b", "a/", "a\\b", "./a", "a/./b", "a/.tmp-x", "nul\x00"} {
			if err := s.Put(ctx, k, []byte("x")); !errors.Is(err, objstore.ErrBadKey) || objstore.IsRetryable(err) {
				t.Errorf("Put(%q) = %v, want ErrBadKey", k, err)
			}
			if err := s.PutIfAbsent(ctx, k, []byte("x")); !errors.Is(err, objstore.ErrBadKey) {
				t.Errorf("PutIfAbsent(%q) = %v, want ErrBadKey", k, err)
			}
			if _, err := s.Get(ctx, k); !errors.Is(err, objstore.ErrBadKey) {
				t.Errorf("Get(%q) = %v, want ErrBadKey", k, err)
			}
			if _, err := s.Stat(ctx, k); !errors.Is(err, objstore.ErrBadKey) {
				t.Errorf("Stat(%q) = %v, want ErrBadKey", k, err)
			}
			if err := s.Delete(ctx, k); !errors.Is(err, objstore.ErrBadKey) {
				t.Errorf("Delete(%q) = %v, want ErrBadKey", k, err)
			}
		}
		for _, p := range []string{"/", "/a", "a//", "../", "a/../"} {
			if _, err := s.List(ctx, p); !errors.Is(err, objstore.ErrBadKey) {
				t.Errorf("List(%q) = %v, want ErrBadKey", p, err)
			}
		}
		if objs, err := s.List(ctx, ""); err != nil || len(objs) != 0 {
			t.Fatalf("bad keys left objects behind: %v, %v", objs, err)
		}
	})

	t.Run("PutIfAbsent", func(t *testing.T) {
		ctx := context.Background()
		s := newStore(t)
		if err := s.PutIfAbsent(ctx, "m/k.json", []byte("first")); err != nil {
			t.Fatalf("first PutIfAbsent: %v", err)
		}
		err := s.PutIfAbsent(ctx, "m/k.json", []byte("second"))
		if !errors.Is(err, objstore.ErrExists) || objstore.IsRetryable(err) {
			t.Fatalf("second PutIfAbsent = %v, want terminal ErrExists", err)
		}
		if got, _ := s.Get(ctx, "m/k.json"); string(got) != "first" {
			t.Fatalf("content after losing PutIfAbsent = %q, want first", got)
		}

		// Many concurrent creators: exactly one wins, the rest see ErrExists.
		const n = 8
		var wg sync.WaitGroup
		errs := make([]error, n)
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				errs[i] = s.PutIfAbsent(ctx, "m/race.json", []byte(fmt.Sprintf("writer %d", i)))
			})
		}
		close(start)
		wg.Wait()
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil && winner >= 0:
				t.Fatalf("writers %d and %d both created the key", winner, i)
			case err == nil:
				winner = i
			case !errors.Is(err, objstore.ErrExists):
				t.Fatalf("writer %d: %v", i, err)
			}
		}
		if winner < 0 {
			t.Fatal("no writer created the key")
		}
		if got, _ := s.Get(ctx, "m/race.json"); string(got) != fmt.Sprintf("writer %d", winner) {
			t.Fatalf("stored %q, but writer %d won", got, winner)
		}
		objs, _ := s.List(ctx, "m/")
		if len(objs) != 2 {
			t.Fatalf("List after races = %v, want exactly 2 objects", objs)
		}
	})

	t.Run("PromoteFresh", func(t *testing.T) {
		ctx := context.Background()
		s := newStore(t)
		key := "tiles/f00d"
		if ok, err := ManifestExists(ctx, s, key); err != nil || ok {
			t.Fatalf("ManifestExists before promotion = %v, %v", ok, err)
		}
		if _, err := ReadManifest(ctx, s, key); !errors.Is(err, objstore.ErrNotFound) {
			t.Fatalf("ReadManifest before promotion = %v, want ErrNotFound", err)
		}
		outs := []Output{{"rgb", []byte("pixels of the tile")}, {"meta", []byte("{}")}}
		p, err := Promote(ctx, s, key, "att-1", "build-x", outs, map[string]string{"spp": "64"})
		if err != nil {
			t.Fatal(err)
		}
		if p.Existing {
			t.Fatal("fresh promotion reported Existing")
		}
		m := p.Manifest
		if m.Key != key || m.Attempt != "att-1" || m.Build != "build-x" || m.Meta["spp"] != "64" || len(m.Objects) != 2 {
			t.Fatalf("manifest = %+v", m)
		}
		o, _ := m.Object("rgb")
		if o.Key != "attempts/tiles/f00d/att-1/rgb" || o.Size != int64(len(outs[0].Data)) || o.SHA256 != hexSHA256(outs[0].Data) {
			t.Fatalf("rgb entry = %+v", o)
		}
		if ok, err := ManifestExists(ctx, s, key); err != nil || !ok {
			t.Fatalf("ManifestExists after promotion = %v, %v", ok, err)
		}
		stored, err := ReadManifest(ctx, s, key)
		if err != nil || stored.Checksum() != m.Checksum() || stored.Attempt != "att-1" {
			t.Fatalf("ReadManifest = %+v, %v", stored, err)
		}
		if _, err := s.Stat(ctx, "manifests/tiles/f00d.json"); err != nil {
			t.Fatalf("manifest object not at manifests/<key>.json: %v", err)
		}
		for _, out := range outs {
			got, err := ReadObject(ctx, s, stored, out.Name)
			if err != nil || !bytes.Equal(got, out.Data) {
				t.Fatalf("ReadObject(%q) = %q, %v", out.Name, got, err)
			}
		}
		if _, err := ReadObject(ctx, s, stored, "nope"); !errors.Is(err, objstore.ErrNotFound) {
			t.Fatalf("ReadObject of an unnamed object = %v, want ErrNotFound", err)
		}
		for _, bad := range []struct{ key, attempt, name string }{
			{"../x", "a", "rgb"}, {"tiles/x", "a/b", "rgb"}, {"tiles/x", "", "rgb"}, {"tiles/x", "a", "r/g"}, {"tiles/x", "a", ""},
		} {
			if _, err := Promote(ctx, s, bad.key, bad.attempt, "b", []Output{{bad.name, []byte("x")}}, nil); !errors.Is(err, objstore.ErrBadKey) {
				t.Errorf("Promote(%q, %q, %q) = %v, want ErrBadKey", bad.key, bad.attempt, bad.name, err)
			}
		}
		if _, err := Promote(ctx, s, "tiles/y", "a", "b", []Output{{"x", nil}, {"x", nil}}, nil); err == nil {
			t.Error("Promote with duplicate output names succeeded")
		}
		if _, err := Promote(ctx, s, "tiles/y", "a", "b", nil, nil); err == nil {
			t.Error("Promote with no outputs succeeded")
		}
		if ok, _ := ManifestExists(ctx, s, "tiles/y"); ok {
			t.Error("a rejected promotion left a manifest")
		}
	})

	t.Run("PromoteIdempotent", func(t *testing.T) {
		ctx := context.Background()
		s := newStore(t)
		outs := []Output{{"rgb", []byte("deterministic pixels")}}
		first, err := Promote(ctx, s, "frames/abc", "att-1", "b1", outs, nil)
		if err != nil || first.Existing {
			t.Fatalf("first promotion: %+v, %v", first, err)
		}
		// A redelivery renders the same bytes under a new attempt id.
		again, err := Promote(ctx, s, "frames/abc", "att-2", "b1", []Output{{"rgb", []byte("deterministic pixels")}}, nil)
		if err != nil {
			t.Fatalf("re-promotion: %v", err)
		}
		if !again.Existing || again.Manifest.Attempt != "att-1" || again.Manifest.Checksum() != first.Manifest.Checksum() {
			t.Fatalf("re-promotion = %+v, want Existing with the stored manifest of att-1", again)
		}
		// The same attempt retrying its finalization is idempotent too.
		same, err := Promote(ctx, s, "frames/abc", "att-1", "b1", outs, nil)
		if err != nil || !same.Existing {
			t.Fatalf("retry of the same attempt = %+v, %v", same, err)
		}
		got, err := ReadObject(ctx, s, again.Manifest, "rgb")
		if err != nil || string(got) != "deterministic pixels" {
			t.Fatalf("ReadObject = %q, %v", got, err)
		}
		mans, _ := s.List(ctx, ManifestPrefix)
		if len(mans) != 1 {
			t.Fatalf("manifests = %v, want one", mans)
		}
	})

	t.Run("PromoteConflict", func(t *testing.T) {
		ctx := context.Background()
		s := newStore(t)
		first, err := Promote(ctx, s, "tiles/c1", "att-1", "b1", []Output{{"rgb", []byte("original")}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		manifestBefore, _ := s.Get(ctx, ManifestKey("tiles/c1"))
		_, err = Promote(ctx, s, "tiles/c1", "att-2", "b2", []Output{{"rgb", []byte("different!")}}, nil)
		if !errors.Is(err, ErrConflict) || objstore.IsRetryable(err) {
			t.Fatalf("conflicting promotion = %v, want terminal ErrConflict", err)
		}
		want := Manifest{Objects: []ManifestObject{{Name: "rgb", SHA256: hexSHA256([]byte("different!"))}}}
		if !strings.Contains(err.Error(), first.Manifest.Checksum()) || !strings.Contains(err.Error(), want.Checksum()) {
			t.Fatalf("conflict error %q does not name both checksums %s and %s", err, first.Manifest.Checksum(), want.Checksum())
		}
		// A different set of outputs conflicts as well.
		_, err = Promote(ctx, s, "tiles/c1", "att-3", "b1", []Output{{"rgb", []byte("original")}, {"extra", []byte("x")}}, nil)
		if !errors.Is(err, ErrConflict) {
			t.Fatalf("promotion with an extra output = %v, want ErrConflict", err)
		}
		manifestAfter, _ := s.Get(ctx, ManifestKey("tiles/c1"))
		if !bytes.Equal(manifestBefore, manifestAfter) {
			t.Fatal("conflicting promotion changed the stored manifest")
		}
		got, err := ReadObject(ctx, s, first.Manifest, "rgb")
		if err != nil || string(got) != "original" {
			t.Fatalf("object after conflict = %q, %v", got, err)
		}
		// A reused attempt id with other bytes must not overwrite what the
		// manifest names.
		if _, err := s.Stat(ctx, "manifests/tiles/c2.json"); !errors.Is(err, objstore.ErrNotFound) {
			t.Fatal(err)
		}
		if err := s.Put(ctx, AttemptKey("tiles/c2", "att-1", "rgb"), []byte("left by a crash")); err != nil {
			t.Fatal(err)
		}
		if _, err := Promote(ctx, s, "tiles/c2", "att-1", "b1", []Output{{"rgb", []byte("new bytes")}}, nil); !errors.Is(err, ErrConflict) {
			t.Fatalf("promotion over a reused attempt object = %v, want ErrConflict", err)
		}
		if ok, _ := ManifestExists(ctx, s, "tiles/c2"); ok {
			t.Fatal("manifest created despite the attempt conflict")
		}
	})

	t.Run("ReadObjectDetectsCorruption", func(t *testing.T) {
		ctx := context.Background()
		s := newStore(t)
		p, err := Promote(ctx, s, "tiles/k", "att-1", "b", []Output{{"rgb", []byte("0123456789")}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		o, _ := p.Manifest.Object("rgb")
		for _, bad := range []string{"0123456780", "0123", "01234567890123"} {
			if err := s.Put(ctx, o.Key, []byte(bad)); err != nil {
				t.Fatal(err)
			}
			if got, err := ReadObject(ctx, s, p.Manifest, "rgb"); !errors.Is(err, objstore.ErrCorrupt) || objstore.IsRetryable(err) {
				t.Fatalf("ReadObject over %q = %q, %v; want terminal ErrCorrupt", bad, got, err)
			}
		}
		if err := s.Delete(ctx, o.Key); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadObject(ctx, s, p.Manifest, "rgb"); !errors.Is(err, objstore.ErrNotFound) {
			t.Fatalf("ReadObject of a deleted object = %v, want ErrNotFound", err)
		}
		// A corrupt manifest is reported, not trusted.
		if err := s.Put(ctx, ManifestKey("tiles/k"), []byte("{not json")); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadManifest(ctx, s, "tiles/k"); !errors.Is(err, objstore.ErrCorrupt) {
			t.Fatalf("ReadManifest of garbage = %v, want ErrCorrupt", err)
		}
	})

	t.Run("PromoteRaceSameBytes", func(t *testing.T) {
		ctx := context.Background()
		s := newStore(t)
		for round := range raceRounds() {
			key := fmt.Sprintf("tiles/race-%02d", round)
			results := racePromote(ctx, s, key, []byte("same pixels"), []byte("same pixels"))
			fresh := 0
			for i, r := range results {
				if r.err != nil {
					t.Fatalf("round %d: promoter %d: %v", round, i, r.err)
				}
				if !r.p.Existing {
					fresh++
				}
			}
			if fresh != 1 {
				t.Fatalf("round %d: %d promoters reported a fresh promotion, want exactly 1", round, fresh)
			}
			if results[0].p.Manifest.Checksum() != results[1].p.Manifest.Checksum() ||
				results[0].p.Manifest.Attempt != results[1].p.Manifest.Attempt {
				t.Fatalf("round %d: promoters disagree on the manifest: %+v vs %+v", round, results[0].p.Manifest, results[1].p.Manifest)
			}
			m, err := ReadManifest(ctx, s, key)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := ReadObject(ctx, s, m, "rgb"); err != nil || string(got) != "same pixels" {
				t.Fatalf("round %d: ReadObject = %q, %v", round, got, err)
			}
		}
		mans, _ := s.List(ctx, ManifestPrefix)
		if len(mans) != raceRounds() {
			t.Fatalf("%d manifests for %d keys", len(mans), raceRounds())
		}
	})

	t.Run("PromoteRaceDifferentBytes", func(t *testing.T) {
		ctx := context.Background()
		s := newStore(t)
		for round := range raceRounds() {
			key := fmt.Sprintf("tiles/split-%02d", round)
			results := racePromote(ctx, s, key, []byte("pixels A"), []byte("pixels B"))
			winner := -1
			for i, r := range results {
				switch {
				case r.err == nil && !r.p.Existing && winner < 0:
					winner = i
				case r.err == nil:
					t.Fatalf("round %d: promoter %d succeeded too (%+v)", round, i, r.p)
				case !errors.Is(r.err, ErrConflict):
					t.Fatalf("round %d: promoter %d: %v, want ErrConflict", round, i, r.err)
				}
			}
			if winner < 0 {
				t.Fatalf("round %d: nobody won: %v / %v", round, results[0].err, results[1].err)
			}
			m, err := ReadManifest(ctx, s, key)
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"pixels A", "pixels B"}[winner]
			if got, err := ReadObject(ctx, s, m, "rgb"); err != nil || string(got) != want {
				t.Fatalf("round %d: stored %q, %v; winner wrote %q", round, got, err, want)
			}
		}
	})

	t.Run("CollectGarbage", func(t *testing.T) {
		ctx := context.Background()
		s := newStore(t)
		keep1, err := Promote(ctx, s, "tiles/kept", "att-1", "b", []Output{{"rgb", []byte("kept pixels")}, {"aux", []byte("aux")}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		keep2, err := Promote(ctx, s, "frames/f1", "att-9", "b", []Output{{"png", []byte("png bytes")}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		old := []string{
			"attempts/tiles/kept/att-0/rgb", // an older attempt that lost
			"attempts/tiles/gone/att-5/rgb", // a crashed attempt never promoted
			"checkpoints/tiles/dead",
			"checkpoints/tiles/live", // protected by keep()
			"scenes/s1",              // outside the collected prefixes
		}
		for _, k := range old {
			if err := s.Put(ctx, k, []byte("old "+k)); err != nil {
				t.Fatal(err)
			}
		}
		// Young objects must be strictly newer than every old one in the
		// store's own clock, whose resolution may be coarse.
		young := []string{"attempts/tiles/inflight/att-7/rgb", "checkpoints/tiles/fresh"}
		cutoff := waitNewer(t, s, young)
		grace := time.Hour
		report, err := CollectGarbage(ctx, s, []string{"attempts/", "checkpoints/"}, grace, cutoff.Add(grace),
			func(k string) bool { return k == "checkpoints/tiles/live" })
		if err != nil {
			t.Fatal(err)
		}
		wantDeleted := []string{"attempts/tiles/gone/att-5/rgb", "attempts/tiles/kept/att-0/rgb", "checkpoints/tiles/dead"}
		if strings.Join(report.Deleted, ",") != strings.Join(wantDeleted, ",") {
			t.Fatalf("deleted %v, want %v", report.Deleted, wantDeleted)
		}
		if strings.Join(report.Young, ",") != "attempts/tiles/inflight/att-7/rgb,checkpoints/tiles/fresh" ||
			strings.Join(report.Protected, ",") != "checkpoints/tiles/live" || len(report.Referenced) != 3 || report.Manifests != 2 {
			t.Fatalf("report = %+v", report)
		}
		for _, k := range wantDeleted {
			if _, err := s.Stat(ctx, k); !errors.Is(err, objstore.ErrNotFound) {
				t.Errorf("%s survived garbage collection: %v", k, err)
			}
		}
		for _, k := range append([]string{"checkpoints/tiles/live", "scenes/s1"}, young...) {
			if _, err := s.Stat(ctx, k); err != nil {
				t.Errorf("%s was collected: %v", k, err)
			}
		}
		for _, p := range []Promotion{keep1, keep2} {
			m, err := ReadManifest(ctx, s, p.Manifest.Key)
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range m.Objects {
				if _, err := ReadObject(ctx, s, m, o.Name); err != nil {
					t.Errorf("after GC, manifest %s object %s: %v", m.Key, o.Name, err)
				}
			}
		}

		// Far in the future everything unreferenced and unprotected goes,
		// and still nothing a manifest names.
		report, err = CollectGarbage(ctx, s, []string{"attempts/", "checkpoints/"}, grace, time.Now().Add(48*time.Hour), nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(report.Deleted) != 3 || len(report.Referenced) != 3 {
			t.Fatalf("second collection = %+v", report)
		}
		left, _ := s.List(ctx, "attempts/")
		if len(left) != 3 {
			t.Fatalf("attempt objects left: %v, want the 3 referenced ones", left)
		}

		for _, bad := range [][]string{{""}, {"manifests/"}, {"manifests/tiles/"}, {"man"}} {
			if _, err := CollectGarbage(ctx, s, bad, grace, time.Now(), nil); err == nil {
				t.Errorf("CollectGarbage(%q) accepted a prefix covering the manifests", bad)
			}
		}
		// An unreadable manifest stops the collection before any deletion.
		if err := s.Put(ctx, "attempts/tiles/orphan/att-1/rgb", []byte("x")); err != nil {
			t.Fatal(err)
		}
		if err := s.Put(ctx, "manifests/tiles/broken.json", []byte("garbage")); err != nil {
			t.Fatal(err)
		}
		if _, err := CollectGarbage(ctx, s, []string{"attempts/"}, grace, time.Now().Add(48*time.Hour), nil); !errors.Is(err, objstore.ErrCorrupt) {
			t.Fatalf("collection with a corrupt manifest = %v, want ErrCorrupt", err)
		}
		if _, err := s.Stat(ctx, "attempts/tiles/orphan/att-1/rgb"); err != nil {
			t.Fatalf("aborted collection deleted something: %v", err)
		}
	})
}

// hexSHA256 is the test's own checksum, independent of the package's helper.
func hexSHA256(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

type raceResult struct {
	p   Promotion
	err error
}

// racePromote runs two promotions of key with different attempt ids at once.
func racePromote(ctx context.Context, s objstore.Store, key string, a, b []byte) [2]raceResult {
	var res [2]raceResult
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, data := range [][]byte{a, b} {
		wg.Go(func() {
			<-start
			p, err := Promote(ctx, s, key, fmt.Sprintf("att-%d", i), "b", []Output{{"rgb", data}}, nil)
			res[i] = raceResult{p, err}
		})
	}
	close(start)
	wg.Wait()
	return res
}

// waitNewer writes keys until all their ModTimes are later than every object
// already in the store, and returns the earliest of them. Coarse store clocks
// make this take up to a second; it is setup, not an assertion.
func waitNewer(t *testing.T, s objstore.Store, keys []string) time.Time {
	t.Helper()
	ctx := context.Background()
	existing, err := s.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var newest time.Time
	for _, o := range existing {
		if o.ModTime.After(newest) {
			newest = o.ModTime
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		var earliest time.Time
		for _, k := range keys {
			if err := s.Put(ctx, k, []byte("young "+k)); err != nil {
				t.Fatal(err)
			}
			// CollectGarbage judges age by List's ModTime, so use the same.
			listed, err := s.List(ctx, k)
			if err != nil || len(listed) != 1 {
				t.Fatalf("List(%q) = %v, %v", k, listed, err)
			}
			mt := listed[0].ModTime
			if earliest.IsZero() || mt.Before(earliest) {
				earliest = mt
			}
		}
		if earliest.After(newest) {
			return earliest
		}
		if time.Now().After(deadline) {
			t.Fatalf("store clock did not advance past %v", newest)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestFSStoreConformance(t *testing.T) {
	t.Parallel() // a store of its own
	testStoreConformance(t, func(t *testing.T) objstore.Store {
		s, err := objstore.NewFSStore(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}
