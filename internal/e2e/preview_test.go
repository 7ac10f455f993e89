package e2e

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
)

// Property: `submit --preview 8` of a 24-frame job renders frames 1, 9, 17 and 24 first: all
// four complete before any other frame does, and status says when they are done.
func TestPreviewFramesCompleteFirst(t *testing.T) {
	f := startServe(t, t.TempDir())
	st, r := f.submit(example("shot"), "--frames", "1-24", "--preview", "8", "--width", "48", "--height", "27", "--spp", "4", "--tile", "48")
	if r.code != 42 {
		t.Fatalf("submit: %s", r)
	}
	if !slices.Equal(st.PreviewFrames, []int{1, 9, 17, 24}) || st.PreviewDone {
		t.Fatalf("preview frames %v (done %v), want 1, 9, 17, 24 not done yet", st.PreviewFrames, st.PreviewDone)
	}
	// One slot, and a pause after each pass, so the frames complete one at a time, seen apart.
	f.worker("w", t.TempDir(), "--concurrency", "1", "--fault-pass-delay", "60ms")
	var order []int
	seen := map[int]bool{}
	previewDoneAt := -1
	for deadline := time.Now().Add(3 * time.Minute); ; {
		now := apiStatus(t, f, st.JobID)
		for _, fr := range now.Frames {
			if fr.State == api.FrameCompleted && !seen[fr.Frame] {
				seen[fr.Frame] = true
				order = append(order, fr.Frame)
			}
		}
		if now.PreviewDone && previewDoneAt < 0 {
			previewDoneAt = len(order)
		}
		if now.State == api.JobCompleted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job not done; frames completed in order %v", order)
		}
		time.Sleep(15 * time.Millisecond)
	}
	if len(order) != 24 {
		t.Fatalf("saw %d frames complete, want 24: %v", len(order), order)
	}
	first := slices.Clone(order[:4])
	slices.Sort(first)
	if !slices.Equal(first, []int{1, 9, 17, 24}) {
		t.Fatalf("frames completed in order %v: want 1, 9, 17 and 24 before any other", order)
	}
	if previewDoneAt != 4 {
		t.Fatalf("status said the preview was done after %d frames, want 4 (order %v)", previewDoneAt, order)
	}
	if r := f.cli("status", st.JobID); !strings.Contains(r.stdout, "preview frames 1 9 17 24: done") {
		t.Fatalf("status does not say the preview frames are done:\n%s", r.stdout)
	}
}
