package cli

import (
	"errors"
	"fmt"
	"strings"
)

// ExpandPattern replaces every run of '#' in pattern with the frame number,
// zero-padded to the run's width ("shot_####.png", 7 -> "shot_0007.png"); a
// number wider than the run is written in full. A pattern without '#' is
// returned unchanged: refusing it for multi-frame renders is the caller's job.
func expandPattern(pattern string, frame int) (string, error) {
	if pattern == "" {
		return "", errors.New("expanding output pattern: empty pattern")
	}
	if frame < 0 {
		return "", fmt.Errorf("expanding output pattern %q: negative frame %d", pattern, frame)
	}
	var b strings.Builder
	for i := 0; i < len(pattern); {
		if pattern[i] != '#' {
			b.WriteByte(pattern[i])
			i++
			continue
		}
		j := i
		for j < len(pattern) && pattern[j] == '#' {
			j++
		}
		fmt.Fprintf(&b, "%0*d", j-i, frame)
		i = j
	}
	return b.String(), nil
}
