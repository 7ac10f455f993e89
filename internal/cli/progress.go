package cli

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
)

// progress draws a one-line bar on a terminal and, elsewhere (cron logs, CI), prints a line
// only when something changes, at most every few seconds.
type progress struct {
	w        io.Writer
	tty      bool
	quiet    bool
	last     string
	lastTime time.Time
}

func newProgress(w io.Writer, quiet bool) *progress {
	return &progress{w: w, tty: isTerminal(w), quiet: quiet}
}

// update shows done of total units with a label, as "12/48 tiles".
func (p *progress) update(done, total int, label string) {
	p.show(int64(done), int64(total), fmt.Sprintf("%d/%d %s", done, total, label))
}

// show draws a bar filled done/total with line beside it; off a terminal it prints line when
// it changed, at most every 2 s, and always once done reaches total.
func (p *progress) show(done, total int64, line string) {
	if p.quiet || line == p.last {
		return
	}
	if p.tty {
		fmt.Fprintf(p.w, "\r[%s] %s\x1b[K", bar(done, total, barWidth), line)
	} else {
		if time.Since(p.lastTime) < 2*time.Second && done != total {
			return
		}
		fmt.Fprintln(p.w, line)
		p.lastTime = time.Now()
	}
	p.last = line
}

// barWidth is the characters of a bar between its brackets.
const barWidth = 30

// bar is a width-character bar filled done/total, empty when total is not positive.
func bar(done, total int64, width int) string {
	filled := 0
	if total > 0 {
		filled = int(min(max(done, 0), total) * int64(width) / total)
	}
	return strings.Repeat("#", filled) + strings.Repeat(".", width-filled)
}

// jobProgress is where a job stands for its bar: by samples when the coordinator counts them,
// so the bar moves while a long tile renders, by tiles otherwise (a coordinator from before
// samples were counted sends none).
func jobProgress(st api.Status) (done, total int64, line string) {
	line = fmt.Sprintf("%d/%d tiles, %d/%d frames", st.TilesCompleted, st.TilesTotal, st.FramesCompleted, st.FramesTotal)
	if st.ETASeconds != nil {
		line += ", ETA " + eta(st)
	}
	if st.State == api.JobWaiting {
		line += ", waiting for " + st.WaitingFor
	}
	if st.SamplesTotal <= 0 {
		return int64(st.TilesCompleted), int64(st.TilesTotal), line
	}
	done = min(max(st.SamplesDone, 0), st.SamplesTotal)
	return done, st.SamplesTotal, fmt.Sprintf("%d%% samples, %s", done*100/st.SamplesTotal, line)
}

// done ends the bar's line.
func (p *progress) done() {
	if p.tty && !p.quiet && p.last != "" {
		fmt.Fprintln(p.w)
	}
}
