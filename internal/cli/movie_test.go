package cli

import (
	"errors"
	"testing"
)

// outputs --movie adds the movie's extension to a path without one, keeps it on a path with
// it, and refuses another: the file is a WebM whatever it is called.
func TestMoviePath(t *testing.T) {
	for in, want := range map[string]string{"out/shot": "out/shot.webm", "shot.webm": "shot.webm", "a.b/shot.WEBM": "a.b/shot.WEBM", "a.b/shot": "a.b/shot.webm"} {
		if got, err := moviePath(in); err != nil || got != want {
			t.Errorf("moviePath(%q) = %q, %v, want %q", in, got, err, want)
		}
	}
	var ue *usageError
	if _, err := moviePath("shot.mp4"); !errors.As(err, &ue) {
		t.Errorf("moviePath(shot.mp4) = %v, want a usage error", err)
	}
}
