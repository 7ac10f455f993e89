//go:build linux

package e2e

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
)

// Property: `submit --preview 8` of a 24-frame job renders frames 1, 9, 17 and 24 first: with
// one slot, their tiles are the first four promoted and their frames the first four assembled,
// and status says the preview is done exactly when those four frames are completed.
func TestPreviewFramesCompleteFirst(t *testing.T) {
	t.Parallel()
	f := startServe(t, t.TempDir())
	st, r := f.submit(example("shot"), "--frames", "1-24", "--preview", "8", "--width", "48", "--height", "27", "--spp", "4", "--tile", "48")
	if r.code != 42 {
		t.Fatalf("submit: %s", r)
	}
	preview := []int{1, 9, 17, 24}
	if !slices.Equal(st.PreviewFrames, preview) || st.PreviewDone {
		t.Fatalf("preview frames %v (done %v), want 1, 9, 17, 24 not done yet", st.PreviewFrames, st.PreviewDone)
	}
	// One slot, and a pause after each pass, so the frames render one at a time, in the order
	// their tiles were dispatched.
	w := f.worker("w", t.TempDir(), "--concurrency", "1", "--fault-pass-delay", "60ms")
	doneEarly := false // status said the preview was done while other frames were still to come
	for deadline := time.Now().Add(3 * time.Minute); ; {
		now := apiStatus(t, f, st.JobID)
		completed := 0
		for _, fr := range now.Frames {
			if fr.State == api.FrameCompleted && slices.Contains(preview, fr.Frame) {
				completed++
			}
		}
		if now.PreviewDone != (completed == len(preview)) {
			t.Fatalf("status says preview done %v with %d of the %d preview frames completed: %+v", now.PreviewDone, completed, len(preview), now.Frames)
		}
		if now.State == api.JobCompleted {
			break
		}
		doneEarly = doneEarly || now.PreviewDone
		if time.Now().After(deadline) {
			t.Fatalf("job not done: %+v", now)
		}
		time.Sleep(15 * time.Millisecond)
	}
	if !doneEarly {
		t.Fatal("status never said the preview was done before the job completed")
	}
	for what, re := range map[string]*regexp.Regexp{
		"tiles promoted":   regexp.MustCompile(`msg="tile promoted".* frame=(\d+) `),
		"frames assembled": regexp.MustCompile(`msg="frame assembled".* frame=(\d+) `),
	} {
		var order []int
		for _, m := range re.FindAllStringSubmatch(w.Log(), -1) {
			n, _ := strconv.Atoi(m[1])
			order = append(order, n)
		}
		if len(order) != 24 {
			t.Fatalf("%d %s, want 24: %v", len(order), what, order)
		}
		first := slices.Clone(order[:4])
		slices.Sort(first)
		if !slices.Equal(first, preview) {
			t.Fatalf("%s in order %v: want 1, 9, 17 and 24 before any other", what, order)
		}
	}
	if r := f.cli("status", st.JobID); !strings.Contains(r.stdout, "preview frames 1 9 17 24: done") {
		t.Fatalf("status does not say the preview frames are done:\n%s", r.stdout)
	}
}
