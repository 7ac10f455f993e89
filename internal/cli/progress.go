package cli

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/term"
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
	tty := false
	if f, ok := w.(*os.File); ok {
		tty = term.IsTerminal(int(f.Fd()))
	}
	return &progress{w: w, tty: tty, quiet: quiet}
}

// update shows done of total units with a label.
func (p *progress) update(done, total int, label string) {
	if p.quiet {
		return
	}
	line := fmt.Sprintf("%d/%d %s", done, total, label)
	if line == p.last {
		return
	}
	if p.tty {
		const width = 30
		filled := 0
		if total > 0 {
			filled = done * width / total
		}
		fmt.Fprintf(p.w, "\r[%s%s] %s\x1b[K", strings.Repeat("#", filled), strings.Repeat(".", width-filled), line)
	} else {
		if time.Since(p.lastTime) < 2*time.Second && done != total {
			return
		}
		fmt.Fprintln(p.w, line)
		p.lastTime = time.Now()
	}
	p.last = line
}

// done ends the bar's line.
func (p *progress) done() {
	if p.tty && !p.quiet && p.last != "" {
		fmt.Fprintln(p.w)
	}
}
