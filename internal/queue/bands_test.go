package queue

import (
	"testing"
	"time"
)

// Property: workers take from the highest non-empty band first, and within a band in the
// order tiles were queued, whatever order the bands were filled in.
func TestFetchTileTakesHighestBandFirst(t *testing.T) {
	t.Parallel()
	tf := startFarm(t, fastConfig())
	ctx := testCtx(t)
	for _, m := range []struct {
		band Band
		id   string
	}{{BandLow, "low-1"}, {BandNormal, "normal-1"}, {BandNormal, "normal-2"}, {BandHigh, "high-1"}, {BandLow, "low-2"}, {BandHigh, "high-2"}} {
		if _, err := tf.f.Publish(ctx, m.band.Subject(), m.id, []byte(m.id), nil); err != nil {
			t.Fatal(err)
		}
	}
	// A stored message reaches its band's consumer a moment after its PubAck (the server
	// signals consumers asynchronously); the property is about messages every band has seen.
	for b := range NumBands {
		for deadline := time.Now().Add(5 * time.Second); ; {
			info, err := tf.f.Bands[b].Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.NumPending == 2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("band %s's consumer has %d messages pending, want 2", Band(b), info.NumPending)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for _, want := range []string{"high-1", "high-2", "normal-1", "normal-2", "low-1", "low-2"} {
		m := mustFetch(t, tf.f, 2*time.Second)
		if got := string(m.Data()); got != want {
			t.Fatalf("fetched %q, want %q", got, want)
		}
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	if m, err := tf.f.Sources(Capabilities{}).FetchTile(ctx, 300*time.Millisecond); m != nil || err != nil {
		t.Fatalf("empty bands gave %v, %v", m, err)
	}
}

func TestBandOf(t *testing.T) {
	for _, c := range []struct {
		priority int
		want     Band
	}{{-100, BandLow}, {-1, BandLow}, {0, BandNormal}, {1, BandHigh}, {100, BandHigh}} {
		if got := BandOf(c.priority); got != c.want {
			t.Errorf("BandOf(%d) = %s, want %s", c.priority, got, c.want)
		}
		if !IsRenderSubject(c.want.Subject()) {
			t.Errorf("%s's subject %q is not a render subject", c.want, c.want.Subject())
		}
	}
	if IsRenderSubject(SubjectAssemble) || IsRenderSubject("tiles.renderx") {
		t.Error("IsRenderSubject accepts a subject that carries no tiles")
	}
}
