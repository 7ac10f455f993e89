package finalize

import (
	"context"
	"errors"
	"github.com/tilefarm/tilefarm/objstore"
	"slices"
	"strings"
	"testing"
)

// hookStore runs before() once, just before the first PutIfAbsent of a
// manifest: it makes the "somebody promoted between my check and my create"
// race happen deterministically.
type hookStore struct {
	objstore.Store
	before func()
}

func (h *hookStore) PutIfAbsent(ctx context.Context, key string, data []byte) error {
	if h.before != nil && strings.HasPrefix(key, ManifestPrefix) {
		f := h.before
		h.before = nil
		f()
	}
	return h.Store.PutIfAbsent(ctx, key, data)
}

// TestPromoteLosesRace checks the loser of a promotion race, with and without Absent (which
// skips the first read of the manifest, and must change no outcome).
func TestPromoteLosesRace(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name         string
		winner       []byte
		wantConflict bool
		opts         []PromoteOption
	}{
		{"same bytes", []byte("pixels"), false, nil},
		{"different bytes", []byte("other pixels"), true, nil},
		{"same bytes, absent", []byte("pixels"), false, []PromoteOption{Absent()}},
		{"different bytes, absent", []byte("other pixels"), true, []PromoteOption{Absent()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs, err := objstore.NewFSStore(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			var winner Promotion
			s := &hookStore{Store: fs, before: func() {
				var err error
				winner, err = Promote(ctx, fs, "tiles/t", "att-w", "b", []Output{{"rgb", tc.winner}}, nil)
				if err != nil {
					t.Errorf("winner: %v", err)
				}
			}}
			p, err := Promote(ctx, s, "tiles/t", "att-l", "b", []Output{{"rgb", []byte("pixels")}}, nil, tc.opts...)
			if tc.wantConflict {
				if !errors.Is(err, ErrConflict) {
					t.Fatalf("loser = %+v, %v; want ErrConflict", p, err)
				}
				// The loser's attempt object stays for inspection until GC.
				if _, err := fs.Stat(ctx, AttemptKey("tiles/t", "att-l", "rgb")); err != nil {
					t.Fatalf("conflicting attempt object: %v", err)
				}
			} else {
				if err != nil || !p.Existing || p.Manifest.Attempt != "att-w" {
					t.Fatalf("loser = %+v, %v; want Existing with the winner's manifest", p, err)
				}
				// The losing attempt's object is removed at once.
				if _, err := fs.Stat(ctx, AttemptKey("tiles/t", "att-l", "rgb")); !errors.Is(err, objstore.ErrNotFound) {
					t.Fatalf("losing attempt object: %v, want it deleted", err)
				}
			}
			m, err := ReadManifest(ctx, fs, "tiles/t")
			if err != nil || m.Attempt != "att-w" || m.Checksum() != winner.Manifest.Checksum() {
				t.Fatalf("stored manifest = %+v, %v", m, err)
			}
			if got, err := ReadObject(ctx, fs, m, "rgb"); err != nil || string(got) != string(tc.winner) {
				t.Fatalf("winner's object = %q, %v", got, err)
			}
		})
	}
}

// countingStore counts the reads of manifests.
type countingStore struct {
	objstore.Store
	manifestGets int
}

func (c *countingStore) Get(ctx context.Context, key string) ([]byte, error) {
	if strings.HasPrefix(key, ManifestPrefix) {
		c.manifestGets++
	}
	return c.Store.Get(ctx, key)
}

// TestPromoteAbsentSkipsTheFirstRead checks that Absent saves the manifest read of a first
// promotion, and that a promotion made before the call still settles it: identical content
// as an existing success, other content as a conflict.
func TestPromoteAbsentSkipsTheFirstRead(t *testing.T) {
	ctx := context.Background()
	fs, err := objstore.NewFSStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, opts := range [][]PromoteOption{nil, {Absent()}} {
		c := &countingStore{Store: fs}
		key := "tiles/fresh" + string(rune('a'+len(opts)))
		if _, err := Promote(ctx, c, key, "att-1", "b", []Output{{"rgb", []byte("pixels")}}, nil, opts...); err != nil {
			t.Fatal(err)
		}
		if want := 1 - len(opts); c.manifestGets != want {
			t.Errorf("%d options: %d manifest reads for a first promotion, want %d", len(opts), c.manifestGets, want)
		}
	}
	p, err := Promote(ctx, fs, "tiles/fresha", "att-2", "b", []Output{{"rgb", []byte("pixels")}}, nil, Absent())
	if err != nil || !p.Existing || p.Manifest.Attempt != "att-1" {
		t.Errorf("Absent over an identical promotion = %+v, %v; want Existing with the first attempt's manifest", p, err)
	}
	if _, err := Promote(ctx, fs, "tiles/fresha", "att-3", "b", []Output{{"rgb", []byte("other")}}, nil, Absent()); !errors.Is(err, ErrConflict) {
		t.Errorf("Absent over a different promotion = %v, want ErrConflict", err)
	}
}

// Property: a promotion of a key never promoted is two requests per output and one, no
// read-back (the store verifies what it receives: objstore's TestS3RefusesAnUploadDamagedOnTheWay),
// and what it makes visible reads back as it was given.
func TestPromoteUploadsOnceAndCreatesTheManifest(t *testing.T) {
	ctx := context.Background()
	fs, err := objstore.NewFSStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s := objstore.NewCounting(fs)
	p, err := Promote(ctx, s, "tiles/v", "att-1", "b", []Output{{"rgb", []byte("pixels")}}, nil, Absent())
	if err != nil {
		t.Fatal(err)
	}
	want := []objstore.Request{{Kind: "PutIfAbsent", Key: AttemptKey("tiles/v", "att-1", "rgb")}, {Kind: "PutIfAbsent", Key: ManifestKey("tiles/v")}}
	if got := s.Requests(); !slices.Equal(got, want) {
		t.Fatalf("a promotion made the requests %v, want %v", got, want)
	}
	if got, err := ReadObject(ctx, fs, p.Manifest, "rgb"); err != nil || string(got) != "pixels" {
		t.Fatalf("the promoted object reads %q, %v", got, err)
	}
}

func TestManifestChecksum(t *testing.T) {
	a := Manifest{Objects: []ManifestObject{{Name: "x", SHA256: "1"}, {Name: "y", SHA256: "2"}}, Attempt: "a"}
	b := Manifest{Objects: []ManifestObject{{Name: "y", SHA256: "2"}, {Name: "x", SHA256: "1"}}, Attempt: "b", Build: "z"}
	c := Manifest{Objects: []ManifestObject{{Name: "x", SHA256: "2"}, {Name: "y", SHA256: "1"}}}
	if a.Checksum() != b.Checksum() || !sameContent(a, b) {
		t.Fatal("order, attempt or build changed the content checksum")
	}
	if a.Checksum() == c.Checksum() || sameContent(a, c) {
		t.Fatal("swapped checksums compare equal")
	}
}
